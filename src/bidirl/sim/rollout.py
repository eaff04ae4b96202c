"""The simulated rollout replicas: groups in, completions out, weights swapped in place.

Replicas advance analytically (``engine.ReplicaEngine``) and schedule one SimPy event per
*group* completion; an assignment stalls a replica for its prefill, a weight sync for the
load (and, where the real engine has no KV cache of the old weights, a re-prefill).  A
replica whose next completion may have moved is marked *unplanned* and re-planned once
the controller has reacted, once however many groups it got; a unit whose state may have
changed is marked *dirty* and re-labelled then (so an idle cause reflects the decision
that followed, and zero-length bubbles never appear).  What the replicas measure reaches
the stage models through ``StageSamples``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bidirl.controller.actions import AssignGroups, SyncWeights
from bidirl.controller.events import GroupsCompleted, StageMeasured, WeightsSynced
from bidirl.frame.device_time import BUSY, IDLE
from bidirl.frame.hosting import HOME, LENT
from bidirl.sim.context import WAITING, SimContext
from bidirl.sim.engine import ReplicaEngine
from bidirl.sim.turns import TrajectoryBook
from bidirl.sim.workload import ResponseLengths

TOOL_WAIT = "tool wait"  # a replica whose trajectories all wait on their environments


class RolloutFleet:
    """Every rollout replica of the simulated cluster, home or on a lent trainer unit."""

    def __init__(self, sim: SimContext, lengths: ResponseLengths,
                 idle_cause: Callable[[int], str]) -> None:
        self.sim, self.lengths, self.idle_cause = sim, lengths, idle_cause
        spec = sim.spec
        n = spec.n_units
        self.engines: dict[int, ReplicaEngine] = {
            r: self._new_engine(0.0, 0) for r in range(spec.n_replicas)}
        self.paused_until = [0.0] * n
        self._plan_token = [0] * n
        self.samples = StageSamples(n, spec.n_replicas)
        self.partials: dict[int, dict[int, int]] = {}  # interrupted groups' responses so far
        self.complete: set[int] = set()  # completed (kept) groups no training step has taken yet
        self.filtered: list[int] = []  # completed groups the keep model filtered (dynamic sampling)
        self.dirty: set[int] = set()  # units to re-label once the controller has reacted
        self.unplanned: set[int] = set()  # replicas whose next completion must be recomputed
        self.synced = 0  # the weights' version on the home replicas
        turns = sim.truth.turns  # multi-turn: every trajectory's state (sim/turns.py)
        self.book = TrajectoryBook(turns, spec.group_size, spec.prompt_tokens) if turns is not None else None

    def _new_engine(self, t: float, version: int) -> ReplicaEngine:
        spec = self.sim.spec
        return ReplicaEngine(self.sim.truth.rollout.decode.theta, spec.replica_cap, spec.prompt_tokens,
                             t=t, version=version)

    # -- after the controller has reacted --------------------------------------------
    def settle(self) -> None:
        """Re-plan the replicas whose next completion may have moved; re-label the dirty units."""
        for u in sorted(self.unplanned):  # once per replica, however many groups it got
            if u in self.engines:
                self._replan(u)
        self.unplanned.clear()
        for u in sorted(self.dirty):
            self._mark(u)
        self.dirty.clear()

    def _mark(self, u: int) -> None:
        """Re-label a unit hosting a rollout replica: busy if it runs responses."""
        sim, spec = self.sim, self.sim.spec
        eng = self.engines.get(u)
        if eng is None or sim.hosting.status[u] is not (HOME if u < spec.n_replicas else LENT):
            return
        now = sim.env.now
        if now < self.paused_until[u] - 1e-9:
            return
        borrowed = u >= spec.n_replicas
        devs = spec.unit_devices(u)
        if eng.running:
            sim.rec.set(devs, now, BUSY, "rollout", f"rollout v{eng.version}", borrowed)
        elif self.book is not None and self.book.holds(u):  # its trajectories all wait on their tools
            sim.rec.set(devs, now, IDLE, "rollout", TOOL_WAIT, borrowed)
        else:
            sim.rec.set(devs, now, IDLE, "rollout", self.idle_cause(u), borrowed)

    # -- responses -------------------------------------------------------------------
    def advance(self, u: int, t: float) -> None:
        eng = self.engines[u]
        done = eng.advance(t)
        if done:
            self._report(u, done)

    def _report(self, u: int, done: list[int]) -> None:
        if self.book is not None:  # turns ended: their trajectories go to their environments
            self._turns_done(done)
            self.dirty.add(u)
            return
        self._deliver(u, done, tuple(self.lengths.lengths(g) for g in done))

    def _deliver(self, u: int, done: list[int], lens: tuple) -> None:
        keep = self.sim.truth.keep
        flags: tuple[bool, ...] = ()
        if keep is not None:  # dynamic sampling: the simulated reward's verdict, at this version
            version = self.engines[u].version
            flags = tuple(keep.filtered(g, version) for g in done)
            self.filtered += [g for g, f in zip(done, flags) if f]
            self.complete.update(g for g, f in zip(done, flags) if not f)
        else:
            self.complete.update(done)
        self.sim.deliver(GroupsCompleted(u, tuple(done), lens, flags))
        for m in self.samples.after_completions(u, len(done), self.engines[u]):
            self.sim.deliver(m)
        self.dirty.add(u)

    def supersede(self, u: int) -> None:
        """The completion planned for unit ``u`` no longer happens (it switches roles)."""
        self._plan_token[u] += 1

    def _replan(self, u: int) -> None:
        eng = self.engines[u]
        eng.noise = self.sim.noise()
        self.supersede(u)
        t = eng.next_event_time()
        if t is not None:
            self.sim.at(t, self._on_replica, u, self._plan_token[u], t)

    def _on_replica(self, u: int, token: int, t: float) -> None:
        if token != self._plan_token[u] or self.sim.over:
            return  # superseded by a later plan
        self.advance(u, t)
        self.unplanned.add(u)

    def take_completed(self, step: int, group_ids) -> None:
        """Hand completed groups to training step ``step``; each must have completed."""
        missing = [g for g in group_ids if g not in self.complete]
        if missing:
            raise RuntimeError(f"step {step} started before groups {missing[:5]} completed")
        self.complete.difference_update(group_ids)

    def assign(self, a: AssignGroups) -> None:
        sim, spec, truth = self.sim, self.sim.spec, self.sim.truth
        u, now = a.replica, sim.env.now
        eng = self.engines[u]
        self.advance(u, now)
        if self.book is not None:
            self._assign_turns(u, a.group_ids)
            return
        tokens = 0
        stall = 0.0
        prefill_s = truth.rollout.prefill_s
        per_response = truth.prefill_per_response
        prompt = spec.prompt_tokens
        for gid in a.group_ids:
            prefixes = self.partials.pop(gid, None)
            n = eng.admit(gid, self.lengths.lengths(gid), prefixes)
            if per_response:  # every response prefills the prompt (no prefix caching), all in one burst
                tokens += n + prompt * ((len(prefixes) if prefixes is not None else spec.group_size) - 1)
            else:  # one prefill per group, as when groups arrive one by one
                tokens += n
                stall += prefill_s(n) * sim.noise()
        if per_response:
            stall = prefill_s(tokens) * sim.noise()
        eng.stall(now, stall)
        self.samples.add_prefill(u, 1 if per_response else len(a.group_ids), tokens, stall)
        self.unplanned.add(u)
        self.dirty.add(u)

    # -- weights ---------------------------------------------------------------------
    def sync(self, a: SyncWeights) -> None:
        sim, spec, truth = self.sim, self.sim.spec, self.sim.truth
        now = sim.env.now
        dur = truth.weight_sync_s * sim.noise()
        sim.rec.set(spec.train_devices, now, BUSY, "train", "weight sync")
        for u in range(spec.n_replicas):
            if sim.hosting.status[u] is not HOME:
                continue
            self.advance(u, now)
            eng = self.engines[u]
            redo = 0.0
            if truth.reprefill_on_sync and eng.running:  # no KV cache of the old weights
                redo = truth.rollout.prefill_s(eng.context_tokens()) * sim.noise()
            eng.stall(now, dur + redo)
            self.paused_until[u] = now + dur
            sim.rec.set(spec.unit_devices(u), now, IDLE, "rollout", "waiting for weights")
            self.unplanned.add(u)
        sim.at(now + dur, self._synced, a.version, dur)

    # -- multi-turn (sim/turns.py) ----------------------------------------------------
    def _assign_turns(self, u: int, group_ids) -> None:
        """Start the assigned groups' trajectories whose turn can start (not on a tool): each
        prefills its context; one burst without prefix caching, else one prefill per group."""
        sim, truth, book, eng = self.sim, self.sim.truth, self.book, self.engines[u]
        prefill_s, prompt = truth.rollout.prefill_s, self.sim.spec.prompt_tokens
        tokens, stall = 0, 0.0
        complete = []
        for gid in group_ids:
            ctx = [book.admit(eng, gid, i) for i in book.place(gid, u)]
            if book.complete(gid):  # every trajectory ended while the group waited for a replica
                complete.append(gid)
            if truth.prefill_per_response:
                tokens += sum(ctx)
            elif ctx:  # the group's responses share its prompt
                n = prompt + sum(c - prompt for c in ctx)
                tokens += n
                stall += prefill_s(n) * sim.noise()
        if truth.prefill_per_response and tokens:
            stall = prefill_s(tokens) * sim.noise()
        eng.stall(sim.env.now, stall)
        self.samples.add_prefill(u, 1 if truth.prefill_per_response else len(group_ids), tokens, stall)
        self.unplanned.add(u)
        self.dirty.add(u)
        if complete:
            self._deliver(u, complete, tuple(book.finish(g) for g in complete))

    def _turns_done(self, sids: list[int]) -> None:
        """Turns that ended: their trajectories wait on their environments (``_tool_back``)."""
        back = self.sim.env.now + self.book.latency
        for sid in sids:
            self.sim.at(back, self._tool_back, *self.book.turn_done(sid))

    def _tool_back(self, gid: int, i: int) -> None:
        """Trajectory ``(gid, i)``'s environment answered: its next turn goes to the replica
        holding its group (which prefills the whole context), or waits for one; after its
        last turn it has ended, and its group may be complete."""
        u, ended = self.book.tool_back(gid, i)
        if u is None or self.sim.over:
            return
        now = self.sim.env.now
        self.advance(u, now)
        if ended:
            if self.book.complete(gid):
                self._deliver(u, [gid], (self.book.finish(gid),))
            return
        eng = self.engines[u]
        ctx = self.book.admit(eng, gid, i)
        stall = self.sim.truth.rollout.prefill_s(ctx) * self.sim.noise()
        eng.stall(now, stall)
        self.samples.add_prefill(u, 1, ctx, stall)
        self.unplanned.add(u)
        self.dirty.add(u)

    def _synced(self, version: int, dur: float) -> None:
        self.synced = version
        for u, eng in self.engines.items():
            eng.version = version
            self.dirty.add(u)
        self.sim.rec.set(self.sim.spec.train_devices, self.sim.env.now, IDLE, "train", WAITING)
        self.sim.deliver(WeightsSynced(version, dur))

    # -- a unit changing hands -------------------------------------------------------
    def running(self, u: int) -> bool:
        return bool(self.engines[u].running) or (self.book is not None and self.book.holds(u))

    def host(self, u: int, version: int) -> None:
        """Lent trainer unit ``u`` is up as a rollout replica with weights ``version``."""
        now = self.sim.env.now
        self.engines[u] = self._new_engine(now, version)
        self.sim.rec.set(self.sim.spec.unit_devices(u), now, IDLE, "rollout", WAITING, True)
        self.dirty.add(u)

    def evict(self, u: int) -> list:
        """Stop the replica on unit ``u``: its unfinished groups' responses so far are kept
        for whichever replica gets them next; returns ``(group, tokens so far, unfinished
        responses)`` (their prefixes; multi-turn: their indices, every group it held)."""
        self.advance(u, self.sim.env.now)
        parts = self.engines.pop(u).interrupt()
        if self.book is not None:
            return self.book.evict(u, parts)
        for gid, _, prefixes in parts:
            self.partials[gid] = prefixes
        return parts

    def rehome(self, u: int) -> None:
        """Home replica ``u`` is back from its loan, with the home replicas' weights."""
        now = self.sim.env.now
        eng = self.engines[u]
        eng.advance(now)
        eng.version = self.synced
        self.dirty.add(u)
        self.sim.rec.set(self.sim.spec.unit_devices(u), now, IDLE, "rollout", WAITING)


class StageSamples:
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
