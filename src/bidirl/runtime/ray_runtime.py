"""The real runtime: carries out the controller's actions on Ray device workers.

::

    driver process                                   one Ray actor per device
    +--------------------------------------+         +---------------------------+
    | Controller (pure)                    |         | DeviceWorker              |
    |   on_event(e) -> policy -> actions   |         |   roles: rollout (vLLM),  |
    | RayRuntime                           | remote  |          train (torch),   |
    |   execute(action) ------------------ | ------> |          aux_train        |
    |   loop: ray.wait(in-flight calls)    | <------ |   host / release (timed)  |
    |         results -> events -> queue   | results |   call(role, method, ...) |
    | GroupStore: prompts, responses,      |         +---------------------------+
    |   partial prefixes, rewards          |
    +--------------------------------------+

``execute`` never delivers an event itself: it issues remote calls (or queues an event)
and returns; the loop delivers queued events one at a time, so the controller is never
re-entered.  Calls to one device complete in the order they were issued (an actor runs
one call at a time) and are processed in that order.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bidirl.controller.actions import PRIMARY, AssignGroups, Lend, Reclaim, StartTrainStep, SyncWeights
from bidirl.controller.events import (
    DeviceLent,
    DeviceReclaimed,
    GroupsCompleted,
    GroupsInterrupted,
    StageMeasured,
    Started,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.core.ledger import Role
from bidirl.core.timeline import Activity
from bidirl.runtime.device_clock import DeviceClock
from bidirl.runtime.group_store import GroupStore

BORROWED_RUN_BUDGET_S = 0.0  # a lent replica runs one step per call: a reclaim waits <= 1 step
HOME_RUN_BUDGET_S = 0.25


@dataclass
class StepRecord:
    """What the driver saw of one training step (for metrics and audits)."""

    step: int
    group_ids: tuple[int, ...]
    rewards: list[float]
    staleness: list[int]
    response_tokens: int
    total_tokens: int
    started_s: float
    finished_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (executor, micro-batches)
    c_grad_s: list[float] = field(default_factory=list)


class RayRuntime:
    """Runtime protocol on Ray actors (see module docstring)."""

    def __init__(self, *, controller, workers: dict[int, Any], unit_device: Callable[[int], int],
                 train_devices: list[int], store: GroupStore, new_group: Callable[[int], None],
                 reward_fn, decode, rollout_kwargs: dict, trainer_kwargs: dict, staleness: int,
                 group_offset: int = 0, version_offset: int = 0) -> None:
        import ray

        self.ray = ray
        self.controller = controller
        self.spec = controller.state.spec
        self.workers = workers
        self.unit_device = unit_device
        self.train_devices = train_devices
        self.store, self.new_group = store, new_group
        self.reward_fn, self.decode = reward_fn, decode
        self.rollout_kwargs, self.trainer_kwargs = rollout_kwargs, trainer_kwargs
        self.staleness = staleness
        self.goff, self.voff = group_offset, version_offset  # resume: local -> global ids
        self.t0 = time.perf_counter()
        pools = {d: "rollout" for u in range(self.spec.n_replicas) for d in [unit_device(u)]}
        pools.update({d: "train" for d in train_devices})
        self.clock = DeviceClock(pools, {d: "rollout" if p == "rollout" else "train"
                                         for d, p in pools.items()})
        self._device_unit = {unit_device(u): u for u in range(self.spec.n_units)}
        self.hosted: dict[int, str] = {u: "rollout" for u in range(self.spec.n_replicas)}
        self.running: dict[int, int] = {}
        self.run_ref: dict[int, Any] = {}
        self._after_run: dict[int, int] = {}
        self._lending: dict[int, str] = {}
        self.unit_groups: dict[int, set[int]] = {}
        self.reclaiming: set[int] = set()
        self.aux_version: dict[int, int] = {}
        self.rollout_version: dict[int, int] = {u: version_offset for u in range(self.spec.n_replicas)}
        self.version = version_offset
        self.steps: dict[int, StepRecord] = {}
        self.switches: list[tuple[str, float]] = []  # (kind, seconds)
        self.errors: list[str] = []
        self._events: deque = deque()
        self._inflight: dict[Any, tuple[int, int, Callable]] = {}  # ref -> (seq, device, cb)
        self._fifo: dict[int, deque] = {d: deque() for d in pools}
        self._busy: dict[int, dict[Any, tuple[str, str]]] = {d: {} for d in pools}
        self._switching: dict[int, str] = {}
        self._on_lost: dict[Any, Callable[[], None]] = {}
        self._last_work_s: dict[int, float] = {}
        self.reclaim_waits: list[dict] = []
        self.lost_devices: list[tuple[int, float]] = []
        self.restart_worker: Callable[[int], Any] | None = None  # set by the session
        self.kill_lent_device_at_step = -1  # fault injection (tests)
        self._seq = 0
        self.on_step: Callable[[StepRecord], None] | None = None

    # -- Runtime protocol -------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def execute(self, action) -> None:
        {AssignGroups: self._assign, StartTrainStep: self._train, SyncWeights: self._sync,
         Lend: self._lend, Reclaim: self._reclaim}[type(action)](action)

    # -- the loop -----------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        self._events.append(Started())
        while True:
            while self._events:
                self.controller.on_event(self._events.popleft())
                self._refresh_clock()
            if self.controller.finished or should_stop():
                return
            if not self._inflight:
                st = self.controller.state
                raise RuntimeError(
                    f"runtime stalled: nothing in flight and the run is not finished (next step {st.next_step}, "
                    f"phase {st.phase.value}, running groups {st.running}, done per batch {st.done[:8]})")
            self._wait_and_dispatch()
            self._refresh_clock()

    def _wait_and_dispatch(self) -> None:
        ray = self.ray
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=5.0)
        if not ready:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set, progressed = set(ready), False
        for dev, q in list(self._fifo.items()):
            while q and q[0] in ready_set:
                ref = q.popleft()
                _, _, cb = self._inflight.pop(ref)
                self._busy[dev].pop(ref, None)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._device_lost(dev, ref)
                    progressed = True
                    break
                self._on_lost.pop(ref, None)
                cb(result)
                progressed = True
        if not progressed:
            time.sleep(0.001)

    def _call(self, device: int, cb: Callable, busy: tuple[str, str] | None, fn, *args,
              on_lost: Callable[[], None] | None = None, **kwargs):
        """Issue ``fn.remote(...)`` on ``device``; ``cb(result)`` runs when it completes.

        ``on_lost`` runs instead if the device's actor dies before the call completes.
        """
        ref = fn.remote(*args, **kwargs)
        refs = ref if isinstance(ref, list) else [ref]
        last = refs[-1]
        self._seq += 1
        self._inflight[last] = (self._seq, device, (lambda _r: cb(self.ray.get(refs)))
                                if len(refs) > 1 else cb)
        if on_lost is not None:
            self._on_lost[last] = on_lost
        self._fifo[device].append(last)
        if busy is not None:
            self._busy[device][last] = busy
        return ref

    def _worker(self, device: int):
        return self.workers[device]

    # -- rollout ------------------------------------------------------------------------
    def _assign(self, a: AssignGroups) -> None:
        u, dev = a.replica, self.unit_device(a.replica)
        reqs = []
        for gid in a.group_ids:
            g = gid + self.goff
            if g not in self.store.groups:
                self.new_group(g)
            self.unit_groups.setdefault(u, set()).add(g)
            if self.store.groups[g].complete:  # restored from a checkpoint
                self._events.append(self._completed(u, [g]))
                continue
            reqs += self.store.requests_for(g)
        if reqs:
            self._call(dev, lambda _: None, None, self._worker(dev).call, "rollout", "submit", reqs)
            self.running[u] = self.running.get(u, 0) + len(reqs)
            if self.run_ref.get(u) is not None:  # queued behind the run call in flight
                self._after_run[u] = self._after_run.get(u, 0) + len(reqs)
            self._ensure_run(u)

    def _ensure_run(self, u: int) -> None:
        if self.run_ref.get(u) is not None or self.running.get(u, 0) == 0 or u in self.reclaiming:
            return
        dev = self.unit_device(u)
        budget = HOME_RUN_BUDGET_S if u < self.spec.n_replicas else BORROWED_RUN_BUDGET_S
        self._after_run[u] = 0
        self.run_ref[u] = self._call(dev, lambda out: self._on_run(u, out), ("rollout", "rollout"),
                                     self._worker(dev).call, "rollout", "run", budget)

    def _on_run(self, u: int, out: dict) -> None:
        self.run_ref[u] = None
        # Requests submitted after this run call was issued were not counted by it.
        self.running[u] = out["running"] + self._after_run.pop(u, 0)
        done = self.store.absorb_finished(out["finished"])
        done = [g for g in done if g in self.unit_groups.get(u, ())]
        if done:
            self._events.append(self._completed(u, done))
        for tokens, secs in out.get("prefills", []):
            self._events.append(StageMeasured("prefill", (1.0, float(tokens)), secs))
        m = out["measurements"]
        if m:
            self._last_work_s[self.unit_device(u)] = max(x for _, _, x in m)
            self._events.append(StageMeasured(
                "decode", (float(len(m)), float(sum(b for b, _, _ in m)), float(sum(c for _, c, _ in m))),
                sum(s for _, _, s in m)))
        self._ensure_run(u)

    def _completed(self, u: int, gids: list[int]) -> GroupsCompleted:
        for g in gids:
            self.unit_groups[u].discard(g)
        lengths = tuple(tuple(len(self.store.groups[g].done[i].token_ids) for i in range(self.store.n))
                        for g in gids)
        return GroupsCompleted(u, tuple(g - self.goff for g in gids), lengths)

    def _sync(self, a: SyncWeights) -> None:
        t_start = self.now()
        w = self._primary_weights()
        targets = [u for u, role in self.hosted.items() if role == "rollout" and u not in self.reclaiming]
        pending = {"n": len(targets)}
        version = a.version + self.voff

        def done(_):
            pending["n"] -= 1
            if pending["n"] == 0:
                self.version = version
                self._events.append(WeightsSynced(a.version, self.now() - t_start))

        if not targets:
            self.version = version
            self._events.append(WeightsSynced(a.version, 0.0))
        for u in targets:
            dev = self.unit_device(u)
            self.rollout_version[u] = version
            self._call(dev, done, ("rollout", "weight sync"), self._worker(dev).call,
                       "rollout", "update_weights", w, version, on_lost=lambda: done(None))

    def _primary_weights(self):
        return self._worker(self.train_devices[0]).call.remote("train", "weights")

    # -- training -----------------------------------------------------------------------
    def _train(self, a: StartTrainStep) -> None:
        from bidirl.algo.grpo import group_advantages_lists

        gids = [g + self.goff for g in a.group_ids]
        rewards = [self.store.score(g, self.reward_fn, self.decode) for g in gids]
        advs = group_advantages_lists(rewards)
        samples, stale = [], []
        for g, adv in zip(gids, advs):
            rec = self.store.groups[g]
            v_first = self.store.versions(g)[0]
            stale.append((a.step + self.voff) - (v_first if v_first is not None else a.step + self.voff))
            for i in range(rec.n):
                r = rec.done[i]
                samples.append({"prompt_ids": rec.prompt_ids, "response_ids": r.token_ids,
                                "behaviour_logprobs": r.logprobs, "advantage": float(adv[i])})
        sizes = [mb.samples for mb in a.micro_batches]
        if sum(sizes) != len(samples):
            raise RuntimeError(f"step {a.step}: micro-batches cover {sum(sizes)} samples, batch has {len(samples)}")
        mbs, k = [], 0
        for n in sizes:
            mbs.append(samples[k:k + n])
            k += n
        total = sum(len(s["response_ids"]) for s in samples)
        rec = StepRecord(a.step + self.voff, tuple(gids), [x for r in rewards for x in r], stale, total,
                         sum(len(s["response_ids"]) + len(s["prompt_ids"]) for s in samples), self.now())
        self.steps[rec.step] = rec
        # Each chunk -> the devices that compute it; the primary's share is split over DP ranks.
        jobs: list[tuple[int, str, list]] = []  # (device, role, micro-batches) in merge order
        for c in a.chunks:
            chunk_mbs = [mbs[i] for i in c.micro_batches]
            rec.chunks.append((str(c.executor), len(chunk_mbs)))
            if c.executor == PRIMARY:
                dp = len(self.train_devices)
                for r, dev in enumerate(self.train_devices):
                    jobs.append((dev, "train", chunk_mbs[r::dp] if dp > 1 else chunk_mbs))
            else:  # one call per micro-batch, so a reclaim waits for at most one
                jobs += [(self.unit_device(c.executor), "aux_train", [mb]) for mb in chunk_mbs]
        state = {"left": len(jobs), "refs": [None] * len(jobs), "jobs": jobs, "total": total}
        w = None
        for j, (dev, role, _) in enumerate(jobs):
            if role == "aux_train" and self.aux_version.get(dev) != self.version:
                w = w or self._primary_weights()
                self._call(dev, lambda _: None, ("aux_train", "load weights"), self._worker(dev).call,
                           "aux_train", "set_weights", w, self.version)
                self.aux_version[dev] = self.version
            self._issue_chunk(a, rec, state, j, dev, role)
        if 0 <= self.kill_lent_device_at_step <= rec.step and not self.lost_devices:
            victims = sorted({dev for dev, role, _ in jobs if role == "aux_train"})
            if victims:  # fault injection: the first auxiliary trainer from that step on dies mid-step
                self._worker(victims[0]).kill.remote()

    def _issue_chunk(self, a, rec: StepRecord, state: dict, j: int, dev: int, role: str) -> None:
        mbs = state["jobs"][j][2]

        def lost():  # the auxiliary died: the primary recomputes this chunk; merge order is kept
            self._issue_chunk(a, rec, state, j, self.train_devices[0], "aux_redo")

        call_role = "train" if role == "aux_redo" else role
        refs = self._call(dev, lambda res: self._on_chunk(a, rec, state, j, role, res),
                          (call_role, f"train step {rec.step}"),
                          self._worker(dev).call.options(num_returns=2), call_role, "compute_chunk_ref",
                          mbs, state["total"], on_lost=lost if role == "aux_train" else None)
        state["refs"][j] = (dev, role, refs[0])

    def _on_chunk(self, a, rec: StepRecord, state: dict, j: int, role: str, res) -> None:
        _, timings = res
        stage = "aux_micro" if role == "aux_train" else "train_micro"
        if timings:
            self._last_work_s[state["refs"][j][0]] = max(x for _, _, x in timings)
        for tokens, seq, secs in timings:
            self._events.append(StageMeasured(stage, (1.0, float(tokens), float(tokens * seq)), secs))
        state["left"] -= 1
        if state["left"]:
            return
        # Every chunk is computed: each DP rank merges, rank 0 also the auxiliary chunks, in order.
        jobs = state["refs"]
        aux_refs = [ref for dev, role, ref in jobs if role in ("aux_train", "aux_redo")]
        pending = {"n": len(self.train_devices)}

        def applied(out, rank):
            metrics, c_grad = out
            if rank == 0:
                rec.metrics, rec.c_grad_s = metrics, c_grad
                for s in c_grad:
                    self._events.append(StageMeasured("train_on_roll.c_grad", (), s))
            pending["n"] -= 1
            if pending["n"] == 0:
                rec.finished_s = self.now()
                self.version = a.step + 1 + self.voff
                self._events.append(TrainStepFinished(a.step, a.step + 1, rec.finished_s - rec.started_s))
                if self.on_step:
                    self.on_step(rec)

        for rank, dev in enumerate(self.train_devices):
            own = [ref for d, role, ref in jobs if role == "train" and d == dev]
            nested = [own + (aux_refs if rank == 0 else [])]
            self._call(dev, lambda out, rank=rank: applied(out, rank), ("train", f"train step {rec.step}"),
                       self._worker(dev).call, "train", "apply_refs", nested, len(own))

    # -- borrowing ----------------------------------------------------------------------
    def _lend(self, a: Lend) -> None:
        u, dev = a.unit, self.unit_device(a.unit)
        role = "rollout" if a.role is Role.ROLLOUT else "aux_train"
        w = self._primary_weights()
        kwargs = dict(self.rollout_kwargs) if role == "rollout" else {"model_dir": self.trainer_kwargs["model_dir"],
                                                                      "config": self.trainer_kwargs.get("config")}
        kwargs.update(weights=[w], version=self.version)  # nested: fetched inside the timed C_in
        self._switching[dev] = "C_in"
        self._lending[u] = role

        def done(seconds):
            self._switching.pop(dev, None)
            self._lending.pop(u, None)
            self.hosted[u] = role
            if role == "rollout":
                self.rollout_version[u] = kwargs["version"]
            if role == "aux_train":  # the version its weights were fetched at, not today's
                self.aux_version[dev] = kwargs["version"]
            kind = "colocated" if a.colocated else ("roll_on_train" if role == "rollout" else "train_on_roll")
            self.switches.append((f"{kind}.c_in", seconds))
            self._events.append(DeviceLent(u, a.role, seconds))

        def lost():  # died while hosting: it was lent (briefly), and is back home now
            done(0.0)
            if u not in self.reclaiming:
                self._events.append(DeviceReclaimed(u, a.role, 0.0))
                self.hosted[u] = "rollout" if u < self.spec.n_replicas else self.hosted.pop(u, None)

        self._call(dev, done, None, self._worker(dev).host, role, on_lost=lost, **kwargs)

    def _reclaim(self, a: Reclaim) -> None:
        u, dev = a.unit, self.unit_device(a.unit)
        # A reclaim may follow a lend still under way: the worker runs them in order.
        role = self._lending.get(u) or self.hosted.get(u)
        if role is None or (u < self.spec.n_replicas and role == "rollout"):
            raise RuntimeError(f"reclaim of unit {u}, which hosts no borrowed role")
        self.reclaiming.add(u)
        t_issue = self.now()

        def done(out):
            seconds, partials = out
            self.reclaim_waits.append({
                "unit": u, "role": role, "wait_s": max(0.0, self.now() - t_issue - seconds), "c_out_s": seconds,
                "last_work_s": self._last_work_s.get(dev, 0.0)})
            self._switching.pop(dev, None)
            self.reclaiming.discard(u)
            if u < self.spec.n_replicas:  # back to its native role, which stayed resident
                self.hosted[u] = "rollout"
                if self.rollout_version.get(u, self.voff) != self.version:
                    self._call(dev, lambda _: None, ("rollout", "weight sync"), self._worker(dev).call,
                               "rollout", "update_weights", self._primary_weights(), self.version)
                    self.rollout_version[u] = self.version
            else:
                del self.hosted[u]
            kind = "colocated" if self.controller.state.colocated[u] else (
                "roll_on_train" if role == "rollout" else "train_on_roll")
            self.switches.append((f"{kind}.c_out", seconds))
            if role == "rollout":
                self.running[u] = 0
                self.run_ref[u] = None
                self.store.absorb_partials(partials or [])
                gids = sorted(g for g in self.unit_groups.pop(u, set()) if not self.store.groups[g].complete)
                if gids:
                    self._events.append(GroupsInterrupted(
                        u, tuple(g - self.goff for g in gids),
                        tuple(self.store.versions(g)[2] for g in gids),
                        tuple(self.store.n - len(self.store.groups[g].done) for g in gids)))
            self._events.append(DeviceReclaimed(u, Role.ROLLOUT if role == "rollout" else Role.AUX_TRAIN,
                                                seconds))

        def start(_=None):
            self._switching[dev] = "C_out"

        start()
        self._call(dev, done, None, self._worker(dev).release, role, on_lost=lambda: done((0.0, [])))

    # -- faults ---------------------------------------------------------------------------
    def _device_lost(self, dev: int, first_ref) -> None:
        """A device's actor died: redo its work elsewhere, restart it in its own pool's role.

        Only rollout-pool devices can be lost and recovered: their native role (a replica)
        holds no state that the run needs.  The primary trainer's devices hold the
        optimizer; losing one ends the run, and ``--resume`` restarts from the checkpoint.
        """
        if self.clock.pools[dev] == "train":
            raise RuntimeError(f"device {dev} (primary trainer) died; resume from the last checkpoint "
                               "with: bidirl train --resume RUN_DIR")
        u = self._unit_of(dev)
        self.lost_devices.append((dev, self.now()))
        print(f"[bidirl] device {dev} (unit {u}) died; redoing its work and restarting it", file=sys.stderr)
        dropped = [first_ref] + list(self._fifo[dev])
        self._fifo[dev].clear()
        handlers = [self._on_lost.pop(r, None) for r in dropped]
        for r in dropped:
            self._inflight.pop(r, None)
            self._on_lost.pop(r, None)
        self._busy[dev].clear()
        self._switching.pop(dev, None)
        self.workers[dev] = self.restart_worker(dev)
        w = self._primary_weights()
        self._switching[dev] = "restart"  # shown as switching until the replica is back

        def restarted(_):
            self._switching.pop(dev, None)

        self._call(dev, restarted, None, self.workers[dev].host, "rollout",
                   **{**self.rollout_kwargs, "weights": [w], "version": self.version})
        self.rollout_version[u] = self.version
        self.aux_version.pop(dev, None)
        was_lent = self.hosted.get(u) == "aux_train" and u not in self.reclaiming
        for h in handlers:
            if h is not None:
                h()
        if was_lent:
            self.hosted[u] = "rollout"
            self._events.append(DeviceReclaimed(u, Role.AUX_TRAIN, 0.0))
        gids = sorted(g for g in self.unit_groups.pop(u, set()) if not self.store.groups[g].complete)
        self.running[u], self.run_ref[u] = 0, None
        if gids:  # their unfinished responses resume from the last prefixes the store holds
            self._events.append(GroupsInterrupted(
                u, tuple(g - self.goff for g in gids), tuple(self.store.versions(g)[2] for g in gids),
                tuple(self.store.n - len(self.store.groups[g].done) for g in gids)))

    # -- device time ----------------------------------------------------------------------
    def _refresh_clock(self) -> None:
        t = self.now()
        for dev in self._fifo:
            native = self.clock.pools[dev]
            unit = self._unit_of(dev)
            role = self.hosted.get(unit, native) if unit is not None else native
            if dev in self._switching:
                self.clock.set(dev, Activity.SWITCHING, role, self._switching[dev], t)
            elif self._busy[dev]:
                r, label = next(reversed(self._busy[dev].values()))
                self.clock.set(dev, Activity.BUSY, r, label, t)
            else:
                borrowed_replica = native == "train" and role == "rollout"
                cause = self.controller.idle_cause(unit if native == "rollout" or borrowed_replica else None)
                self.clock.set(dev, Activity.IDLE, role, cause, t)

    def _unit_of(self, dev: int) -> int | None:
        return self._device_unit.get(dev)
