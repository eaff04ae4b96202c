"""The simulated cluster: a SimPy implementation of ``controller.runtime.Runtime``.

Replicas advance analytically (``engine.ReplicaEngine``) and schedule one SimPy event per
*group* completion; training steps, weight syncs and switches are a handful of timed
callbacks each.  Everything the controller learns arrives as events through an inbox that
is drained after each callback, so the controller is never re-entered from ``execute``.
Every device's activity goes to the ``Recorder``; a unit whose state may have changed is
marked dirty and re-labelled once the controller has reacted (so an idle cause reflects
the decision that followed, and zero-length bubbles never appear).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import simpy

from bidirl.controller.actions import AssignGroups, JoinStep, Lend, Reclaim, StartTrainStep, SyncWeights
from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import (
    ChunkComputed,
    DeviceLent,
    DeviceReclaimed,
    GroupsCompleted,
    GroupsInterrupted,
    StageMeasured,
    Started,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.core.ledger import Role, switch_kind
from bidirl.frame.device_time import BUSY, IDLE, SWITCHING, Recorder
from bidirl.frame.hosting import HOME, LENT, Hosting
from bidirl.frame.pump import EventPump
from bidirl.policy.split import rank_progress, steal_schedule
from bidirl.sim.engine import ReplicaEngine
from bidirl.sim.training import micro_features, micro_times, plan_step
from bidirl.sim.workload import ResponseLengths
from bidirl.sim.world import Truth

WAITING = "waiting for data"


class SimRuntime:
    """Carries out the controller's actions on simulated devices."""

    def __init__(self, env: simpy.Environment, spec: ClusterSpec, truth: Truth,
                 lengths: ResponseLengths, controller, recorder: Recorder, seed: int) -> None:
        self.env, self.spec, self.truth, self.lengths = env, spec, truth, lengths
        self.controller, self.rec = controller, recorder
        self.noise = TimingNoise(truth.noise_cv, seed)
        n = spec.n_units
        self.engines: dict[int, ReplicaEngine] = {
            r: self._new_engine(0.0, 0) for r in range(spec.n_replicas)}
        self.hosting = Hosting(spec.n_replicas, n)
        self.pump = EventPump(controller)
        self.ready_at: dict[int, float] = {}
        self.paused_until = [0.0] * n
        self._token = [0] * n
        self.samples = _StageSamples(n, spec.n_replicas)
        self.partials: dict[int, dict[int, int]] = {}
        self.complete: set[int] = set()
        self.dirty: set[int] = set()  # units to re-label once the controller has reacted
        self.unplanned: set[int] = set()  # replicas whose next completion must be recomputed
        self.version = 0
        self.synced = 0
        self.trained = TrainedWork()
        self.step: _StepInFlight | None = None
        self.wall_s: float | None = None
        self.done = env.event()

    # -- Runtime protocol -----------------------------------------------------------
    def now(self) -> float:
        return self.env.now

    def execute(self, action) -> None:
        if self.wall_s is None:  # after the last step nothing more is carried out
            _EXECUTORS[type(action)](self, action)

    def start(self) -> None:
        if self.truth.prewarmed:
            self._prewarm()
        if self.truth.startup_s > 0:  # a real run's start-up (calibration.startup_s)
            self._at(self.truth.startup_s, self._begin)
        else:
            self._begin()
            self._pump()

    def _prewarm(self) -> None:
        """What a real run's pre-warm measures before its loop, learned by the scheduler as
        there (``Estimates.learn_start_up``): a hot round trip of every unit the policy may
        lend (C_in, C_out at this scenario's costs) and one weight load."""
        policy, n_rep = self.controller.policy, self.spec.n_replicas
        lendable = [u for u in range(self.spec.n_units)
                    if (policy.lends_rollout_devices if u < n_rep else policy.lends_train_devices)]
        switches = []
        for u in lendable:
            kind = switch_kind(Role.AUX_TRAIN if u < n_rep else Role.ROLLOUT)
            switches += [(f"{kind}.{c}", u, self.truth.switch[f"{kind}.{c}"]) for c in ("c_in", "c_out")]
        self.controller.state.est.learn_start_up(switches, [self.truth.weight_sync_s])

    def _begin(self) -> None:
        self.dirty.update(range(self.spec.n_replicas))
        self._deliver(Started())

    # -- plumbing -------------------------------------------------------------------
    def _new_engine(self, t: float, version: int) -> ReplicaEngine:
        return ReplicaEngine(self.truth.rollout.decode.theta, self.spec.replica_cap, self.spec.prompt_tokens,
                             t=t, version=version)

    def _at(self, t: float, fn, *args) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: (fn(*args), self._pump()))

    def _deliver(self, event) -> None:
        self.pump.deliver(event)

    def _pump(self) -> None:
        self.pump.pump()
        if self.wall_s is not None:
            return
        for u in sorted(self.unplanned):  # once per replica, however many groups it got
            if u in self.engines:
                self._replan(u)
        self.unplanned.clear()
        for u in sorted(self.dirty):
            self._mark(u)
        self.dirty.clear()

    def _mark(self, u: int) -> None:
        """Re-label a unit hosting a rollout replica: busy if it runs responses."""
        eng = self.engines.get(u)
        if eng is None or self.hosting.status[u] is not (HOME if u < self.spec.n_replicas else LENT):
            return
        now = self.env.now
        if now < self.paused_until[u] - 1e-9:
            return
        borrowed = u >= self.spec.n_replicas
        devs = self.spec.unit_devices(u)
        if eng.running:
            self.rec.set(devs, now, BUSY, "rollout", f"rollout v{eng.version}", borrowed)
        else:
            self.rec.set(devs, now, IDLE, "rollout", self.controller.idle_cause(u), borrowed)

    # -- rollout --------------------------------------------------------------------
    def _advance(self, u: int, t: float) -> None:
        eng = self.engines[u]
        done = eng.advance(t)
        if done:
            self._report(u, done)

    def _report(self, u: int, done: list[int]) -> None:
        self.complete.update(done)
        lens = tuple(self.lengths.lengths(g) for g in done)
        self._deliver(GroupsCompleted(u, tuple(done), lens))
        for m in self.samples.after_completions(u, len(done), self.engines[u]):
            self._deliver(m)
        self.dirty.add(u)

    def _replan(self, u: int) -> None:
        eng = self.engines[u]
        eng.noise = self.noise()
        self._token[u] += 1
        t = eng.next_event_time()
        if t is not None:
            self._at(t, self._on_replica, u, self._token[u], t)

    def _on_replica(self, u: int, token: int, t: float) -> None:
        if token != self._token[u] or self.wall_s is not None:
            return  # superseded by a later plan
        self._advance(u, t)
        self.unplanned.add(u)

    def _assign(self, a: AssignGroups) -> None:
        u, now = a.replica, self.env.now
        eng = self.engines[u]
        self._advance(u, now)
        tokens = 0
        stall = 0.0
        prefill_s = self.truth.rollout.prefill_s
        per_response = self.truth.prefill_per_response
        prompt = self.spec.prompt_tokens
        for gid in a.group_ids:
            prefixes = self.partials.pop(gid, None)
            n = eng.admit(gid, self.lengths.lengths(gid), prefixes)
            if per_response:  # every response prefills the prompt (no prefix caching), all in one burst
                tokens += n + prompt * ((len(prefixes) if prefixes is not None else self.spec.group_size) - 1)
            else:  # one prefill per group, as when groups arrive one by one
                tokens += n
                stall += prefill_s(n) * self.noise()
        if per_response:
            stall = prefill_s(tokens) * self.noise()
        eng.stall(now, stall)
        self.samples.add_prefill(u, 1 if per_response else len(a.group_ids), tokens, stall)
        self.unplanned.add(u)
        self.dirty.add(u)

    # -- weights --------------------------------------------------------------------
    def _sync(self, a: SyncWeights) -> None:
        now = self.env.now
        dur = self.truth.weight_sync_s * self.noise()
        self.rec.set(self.spec.train_devices, now, BUSY, "train", "weight sync")
        for u in range(self.spec.n_replicas):
            if self.hosting.status[u] is not HOME:
                continue
            self._advance(u, now)
            eng = self.engines[u]
            redo = 0.0
            if self.truth.reprefill_on_sync and eng.running:  # no KV cache of the old weights
                redo = self.truth.rollout.prefill_s(eng.context_tokens()) * self.noise()
            eng.stall(now, dur + redo)
            self.paused_until[u] = now + dur
            self.rec.set(self.spec.unit_devices(u), now, IDLE, "rollout", "waiting for weights")
            self.unplanned.add(u)
        self._at(now + dur, self._synced, a.version, dur)

    def _synced(self, version: int, dur: float) -> None:
        self.synced = version
        for u, eng in self.engines.items():
            eng.version = version
            self.dirty.add(u)
        self.rec.set(self.spec.train_devices, self.env.now, IDLE, "train", WAITING)
        self._deliver(WeightsSynced(version, dur))

    # -- training -------------------------------------------------------------------
    def _train(self, a: StartTrainStep) -> None:
        missing = [g for g in a.group_ids if g not in self.complete]
        if missing:
            raise RuntimeError(f"step {a.step} started before groups {missing[:5]} completed")
        self.complete.difference_update(a.group_ids)
        now, spec = self.env.now, self.spec
        tl = plan_step(a, now, spec, self.truth, self.ready_at, self.hosting.colocated, self.noise)
        devs = spec.train_devices
        self.rec.set(devs, now, BUSY, "train", f"step {a.step}")
        for run in tl.aux:
            d = spec.unit_devices(run.unit)
            role = "aux_train"
            self._at(run.start, self.rec.set, d, run.start, BUSY, role, f"aux step {a.step}", True)
            if run.arrive > run.compute_end:
                self._at(run.compute_end, self.rec.set, d, run.compute_end, SWITCHING, role,
                         "C_grad", True)
            self._at(run.arrive, self.rec.set, d, run.arrive, IDLE, role, WAITING, True)
            self._at(run.arrive, self._deliver, ChunkComputed(run.unit, a.step))
        for t, m in tl.measurements:
            self._at(t, self._deliver, m)
        self.trained.device_s += tl.device_seconds
        self.trained.tokens += sum(mb.tokens for mb in a.micro_batches)
        st = _StepInFlight(a, now, tl, max((r.arrive for r in tl.aux), default=now), tl.end - tl.merge_start)
        self.step = st
        for t, done in tl.primary_rounds:
            self._at(t, self._primary_measured, st, done)
        self._schedule_end(st)

    def _primary_measured(self, st: _StepInFlight, done: list[tuple[int, float]]) -> None:
        """A round of the primary's micro-batches is done: those no joiner took meanwhile."""
        taken = {k for j in st.joiners.values() for k, _ in j.items}
        own = [(i, sec) for i, sec in done if i not in taken]
        if own:
            feats = micro_features(st.action.micro_batches[i] for i, _ in own)
            self._deliver(StageMeasured("train_micro", feats, sum(sec for _, sec in own)))

    def _schedule_end(self, st: _StepInFlight) -> None:
        """(Re)schedule the primary's idle time, the merge and the step's end (a join moves them)."""
        st.token += 1
        tok, devs, step = st.token, self.spec.train_devices, st.action.step
        arrivals = [j.arrive for j in st.joiners.values()]
        merge_start = max([st.tl.primary_end, st.static_arrive] + arrivals)
        end = merge_start + st.after_s

        def at(t, fn, *args):
            self._at(t, lambda: tok == st.token and fn(*args))

        if merge_start > st.tl.primary_end:
            at(st.tl.primary_end, self.rec.set, devs, st.tl.primary_end, IDLE, "train", WAITING)
        at(merge_start, self.rec.set, devs, merge_start, BUSY, "train", f"step {step} merge")
        at(end, self._stepped, step, end - st.start, st.tl.sync_measurement)

    def _join(self, a: JoinStep) -> None:
        """Auxiliary ``a.unit`` takes unclaimed micro-batches from the tail (``steal_schedule``
        on true times); earlier joiners of the step are re-planned from what they hold."""
        st, now, u = self.step, self.env.now, a.unit
        if st is None or st.action.step != a.step or self.version > a.step:
            self._deliver(ChunkComputed(u, a.step))
            return
        fixed = {j: [x for x in run.items if x[1] <= now] for j, run in st.joiners.items()}
        taken = {i for items in fixed.values() for i, _ in items}
        aux_micro = dict(enumerate(micro_times(self.truth.aux.micro.theta, st.action.micro_batches)))
        micro = micro_times(self.truth.train.micro.theta, st.action.micro_batches)
        ranks = [[(i, micro[i] * f) for i in idx if i not in taken]
                 for idx, f in zip(st.tl.rank_items, st.tl.rank_factor)]
        progress = rank_progress(ranks, st.start, now)
        # A joiner that is done (its chunk delivered) keeps what it had; the others go on.
        runs = [j for j in st.joiners.values() if not (j.token and j.arrive <= now)]
        runs.append(_Joiner(u, now, self.noise()))
        free = [max(now, j.start + sum(aux_micro[i] * j.scale for i, _ in fixed.get(j.unit, ()))) for j in runs]
        plan = steal_schedule(progress, free, aux_micro, [j.scale for j in runs])
        st.tl.primary_end = plan.primary_end_s
        if not plan.stolen[-1]:  # nothing left to take: it may go home at once
            self._deliver(ChunkComputed(u, a.step))
            return
        for j, new in zip(runs, plan.stolen):
            j.items = fixed.get(j.unit, []) + list(new)
            j.compute_end = j.start + sum(aux_micro[i] * j.scale for i, _ in j.items)
            if j.ship is None and j.items:
                j.ship = self.truth.switch["train_on_roll.c_grad"] * self.noise()
            j.arrive = j.compute_end + (j.ship or 0.0)
            j.token += 1
            self._schedule_joiner(st, j, aux_micro)
        st.joiners[u] = runs[-1]
        self.rec.set(self.spec.unit_devices(u), now, BUSY, "aux_train", f"aux step {a.step}", True)
        self._schedule_end(st)

    def _schedule_joiner(self, st: _StepInFlight, j: _Joiner, aux_micro: dict[int, float]) -> None:
        tok, d, role, step = j.token, self.spec.unit_devices(j.unit), "aux_train", st.action.step

        def at(t, fn, *args):
            self._at(t, lambda: tok == j.token and fn(*args))

        if j.arrive > j.compute_end:
            at(j.compute_end, self.rec.set, d, j.compute_end, SWITCHING, role, "C_grad", True)
        at(j.arrive, self.rec.set, d, j.arrive, IDLE, role, WAITING, True)
        feats = micro_features(st.action.micro_batches[i] for i, _ in j.items)
        done = [ChunkComputed(j.unit, step)]
        if j.items:
            done = [StageMeasured("aux_micro", feats, j.compute_end - j.start),
                    StageMeasured("train_on_roll.c_grad", (), j.ship)] + done
        for ev in done:
            at(j.arrive, self._deliver, ev)

    def _stepped(self, step: int, seconds: float, sync: StageMeasured | None = None) -> None:
        if sync is not None:  # the all-reduce is measured once it is done
            self._deliver(sync)
        self.version = step + 1
        self.trained.step_ends.append(self.env.now)
        self.rec.set(self.spec.train_devices, self.env.now, IDLE, "train", WAITING)
        self._deliver(TrainStepFinished(step, step + 1, seconds))
        if step + 1 >= self.spec.steps:
            self.wall_s = self.env.now
            self.rec.finish(self.wall_s)
            self.done.succeed()

    # -- lending --------------------------------------------------------------------
    def _lend(self, a: Lend) -> None:
        u, now = a.unit, self.env.now
        if u < self.spec.n_replicas and self.engines[u].running:
            raise RuntimeError(f"replica {u} runs responses; cannot lend it")
        kind = self.hosting.begin_lend(u, a.role, a.colocated)
        cost = (self.truth.colocated_switch_s if a.colocated
                else self.truth.switch[f"{kind}.c_in"]) * self.noise()
        if a.role is Role.AUX_TRAIN:
            self.ready_at[u] = now + cost
        self._token[u] += 1
        self.rec.set(self.spec.unit_devices(u), now, SWITCHING, a.role.value,
                     "switch" if a.colocated else "C_in", True)
        self._at(now + cost, self._lent, u, cost)

    def _lent(self, u: int, cost: float) -> None:
        now, role = self.env.now, self.hosting.role[u]
        reclaim_waiting = self.hosting.lent(u)
        devs = self.spec.unit_devices(u)
        if role is Role.ROLLOUT:
            self.engines[u] = self._new_engine(now, self.version)
            self.rec.set(devs, now, IDLE, "rollout", WAITING, True)
            self.dirty.add(u)
        else:
            self.rec.set(devs, now, IDLE, "aux_train", WAITING, True)
        self._deliver(DeviceLent(u, role, cost))
        if reclaim_waiting:  # C_in had to finish before C_out could start
            self._reclaim_now(u)

    def _reclaim(self, a: Reclaim) -> None:
        if self.hosting.begin_reclaim(a.unit):
            self._reclaim_now(a.unit)

    def _reclaim_now(self, u: int) -> None:
        now, role = self.env.now, self.hosting.role[u]
        if role is Role.ROLLOUT:
            self._advance(u, now)
            parts = self.engines.pop(u).interrupt()
            if parts:
                for gid, _, prefixes in parts:
                    self.partials[gid] = prefixes
                self._deliver(GroupsInterrupted(
                    u, tuple(p[0] for p in parts), tuple(p[1] for p in parts),
                    tuple(len(p[2]) for p in parts)))
        self._token[u] += 1
        self.ready_at.pop(u, None)
        colocated = u in self.hosting.colocated
        cost = (self.truth.colocated_switch_s if colocated
                else self.truth.switch[f"{self.hosting.kind(u)}.c_out"]) * self.noise()
        self.rec.set(self.spec.unit_devices(u), now, SWITCHING, role.value,
                     "switch" if colocated else "C_out", True)
        self._at(now + cost, self._reclaimed, u, cost)

    def _reclaimed(self, u: int, cost: float) -> None:
        now, role = self.env.now, self.hosting.reclaimed(u)
        devs = self.spec.unit_devices(u)
        if u < self.spec.n_replicas:
            eng = self.engines[u]
            eng.advance(now)
            eng.version = self.synced
            self.dirty.add(u)
            self.rec.set(devs, now, IDLE, "rollout", WAITING)
        else:
            self.rec.set(devs, now, IDLE, "train", WAITING)
        self._deliver(DeviceReclaimed(u, role, cost))


@dataclass
class _Joiner:
    """An auxiliary that joined a step in progress (``JoinStep``)."""

    unit: int
    start: float
    scale: float  # its noise draw: every micro-batch it computes takes the truth's time x scale
    items: list[tuple[int, float]] = field(default_factory=list)  # (micro-batch, claim time)
    compute_end: float = 0.0
    ship: float | None = None
    arrive: float = 0.0
    token: int = 0


@dataclass
class _StepInFlight:
    """The step being trained, for a join to re-plan: what is known when it started."""

    action: StartTrainStep
    start: float
    tl: object  # sim.training.StepTimeline
    static_arrive: float  # when the last chunk of the plan's auxiliaries arrives
    after_s: float  # all-reduce + optimizer + per-step overhead after the merge starts
    joiners: dict[int, _Joiner] = field(default_factory=dict)
    token: int = 0


@dataclass
class TrainedWork:
    """What the trainer did: tokens trained, device-seconds of training, step end times."""

    tokens: int = 0
    device_s: float = 0.0
    step_ends: list[float] = field(default_factory=list)


class TimingNoise:
    """Multiplicative lognormal noise of mean 1 on every simulated duration (seeded)."""

    def __init__(self, cv: float, seed: int) -> None:
        self._rng = random.Random(f"bidirl-sim:{seed}")
        self._sigma = math.sqrt(math.log1p(cv * cv))

    def __call__(self) -> float:
        if self._sigma == 0:
            return 1.0
        return math.exp(self._rng.gauss(-0.5 * self._sigma * self._sigma, self._sigma))


class _StageSamples:
    """What the simulated replicas report to the stage models, and how often: one decode
    and one prefill measurement per replica every ``every`` completed groups (sums of the
    linear features, so aggregating loses nothing), fewer per group on big clusters."""

    def __init__(self, n_units: int, n_replicas: int) -> None:
        self.every = min(32, max(1, math.ceil(n_replicas / 8)))
        self._since = [0] * n_units
        self._prefill = [[0.0, 0.0, 0.0] for _ in range(n_units)]

    def add_prefill(self, u: int, groups: int, tokens: float, seconds: float) -> None:
        p = self._prefill[u]
        p[0] += groups
        p[1] += tokens
        p[2] += seconds

    def after_completions(self, u: int, groups: int, engine) -> list[StageMeasured]:
        self._since[u] += groups
        if self._since[u] < self.every:
            return []
        self._since[u] = 0
        out = []
        m = engine.take_decode_measurement()
        if m is not None:
            out.append(StageMeasured("decode", m[0], m[1]))
        p = self._prefill[u]
        if p[0]:
            out.append(StageMeasured("prefill", (p[0], p[1]), p[2]))
            self._prefill[u] = [0.0, 0.0, 0.0]
        return out


_EXECUTORS = {
    AssignGroups: SimRuntime._assign,
    StartTrainStep: SimRuntime._train,
    SyncWeights: SimRuntime._sync,
    Lend: SimRuntime._lend,
    Reclaim: SimRuntime._reclaim,
    JoinStep: SimRuntime._join,
}
