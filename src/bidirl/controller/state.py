"""The controller's view of the cluster: ledgers, versions, the group queue, unit status.

State changes in exactly two ways: ``observe(event)`` records what a runtime reported,
and ``commit(action)`` records what the controller just asked for (optimistically, so a
policy that yields several actions in a row sees the effect of the earlier ones).  Policies
read it and never write it.

It is three parts: this module (versions, phase, ledgers, estimates, and the event and
action handlers that keep the parts consistent), ``state.queue`` (``controller/queue.py``:
which groups wait to start, per-batch progress) and ``state.units``
(``controller/units.py``: each unit's status, version, load, the least-loaded heap).

Everything a policy asks per event is O(1) or O(log n): the least-loaded replica comes
from a heap with lazy deletion, batch readiness from counters, the queue is a counter of
fresh groups (in group-id order) plus a heap of partial groups waiting to be resumed.
Filling the replicas (``plan_fill``) costs O(log units) per group placed and is committed
as one ``AssignGroups`` per replica, so a decision that admits a whole batch stays cheap.

Unit status (``state.units.status``; commits and events move it)::

    HOME --Lend--> LENDING --DeviceLent--> LENT --Reclaim--> RECLAIMING --DeviceReclaimed--> HOME
"""

from __future__ import annotations

import heapq
import math
from enum import StrEnum
from itertools import repeat

from bidirl.controller.actions import (
    PRIMARY,
    Action,
    AssignGroups,
    JoinStep,
    Lend,
    Reclaim,
    StartTrainStep,
    SyncWeights,
)
from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.estimates import Estimates
from bidirl.controller.events import (
    DeviceLent,
    DeviceReclaimed,
    Event,
    GroupsCompleted,
    GroupsInterrupted,
    StageMeasured,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.controller.queue import GenerationCapError, GroupQueue
from bidirl.controller.units import Units, UnitStatus
from bidirl.core.ledger import DeviceLedger, GroupLedger, Role, switch_kind
from bidirl.core.samples import GroupState, PromptGroup
from bidirl.core.staleness import may_start

__all__ = ["ClusterState", "Phase", "UnitStatus"]  # UnitStatus lives in units.py


class Phase(StrEnum):
    IDLE = "idle"
    TRAINING = "training"
    SYNCING = "syncing"


class ClusterState:
    """Cluster state owned by the controller (see module docstring)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.t = 0.0
        self.est = Estimates(spec)
        self.groups = GroupLedger()
        self.devices = DeviceLedger.build(list(spec.rollout_devices()), list(spec.train_devices),
                                          spec.devices_per_node)
        self.version = 0  # newest policy version (the primary trainer's)
        self.synced = 0  # the version the primary rollout replicas hold
        self.running = 0  # groups generating now
        self.phase = Phase.IDLE
        self.next_step = 0  # the batch the trainer trains next
        self.pending_sync: int | None = None  # a version trained but not yet pushed
        self.step_chunks: dict[int, int] = {}  # aux unit -> micro-batches, last step started
        self.step_started = 0.0  # when the last step started, and what it was
        self.step_action: StartTrainStep | None = None
        self.units = Units(spec)  # status, version, load, groups of every unit
        self.queue = GroupQueue(spec)  # groups waiting to start, progress per batch
        self.lengths: dict[int, tuple[int, ...]] = {}
        self._assigned_at: dict[int, float] = {}
        self.staleness_max = 0
        self.admissions: list = []  # AdmissionDecision records (policy.admission)

    # -- queries -------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.next_step >= self.spec.steps and self.phase is not Phase.TRAINING

    def queued_groups(self, through_batch: int) -> int:
        """Groups of batches <= ``through_batch`` not running and not complete."""
        return self.queue.queued(self.next_step, through_batch)

    def next_group(self, unit: int, limit_batch: int) -> int | None:
        """The next group (partial first, then fresh in id order) admissible on ``unit``."""
        s, q, v = self.spec, self.queue, self.units.version[unit]
        gid = q.partial_head()
        if gid is not None:
            b = self.groups.groups[gid].batch
            if b <= limit_batch and may_start(b, v, s.staleness, s.reproducible):
                return gid
        fresh = q.fresh_head()
        if fresh is None:
            return None
        gid, b = fresh
        if b <= limit_batch and may_start(b, v, s.staleness, s.reproducible):
            return gid
        return None

    def batch_groups(self, b: int) -> tuple[int, ...]:
        """The groups batch ``b`` trains: its kept complete groups, in group-id order."""
        return self.queue.members.batch_groups(b)

    def head_batch(self) -> int | None:
        """The batch of the group that starts next (partial prefixes first), if any."""
        gid = self.queue.partial_head()
        if gid is not None:
            return self.groups.groups[gid].batch
        fresh = self.queue.fresh_head()
        return None if fresh is None else fresh[1]

    def plan_fill(self, limit_batch: int) -> dict[int, list[int]]:
        """Where the queue's head goes now: unit -> group ids, in queue order.

        A greedy run to exhaustion: each group goes to the least-loaded accepting unit
        with room for a whole group, while that unit may start it (batch <=
        ``limit_batch`` and ``core.staleness.may_start`` at the unit's version).  While
        replicas are on their way home (``returning``) the room stops at ``_fill_level``,
        so the first replica back does not take the whole queue from its peers.  The
        result must be committed (one ``AssignGroups`` per unit, any order) before the state
        is read again: the heaps are updated in place with what the plan takes, which the
        commits make true (and the fresh groups it takes are bound to their batches).
        O(log units) per group, no allocation but the ids.
        """
        spec = self.spec
        cap, need, bound = spec.replica_cap, spec.group_size, spec.staleness
        units, queue, by_id = self.units, self.queue, self.groups.groups
        heap, load, accepting, draining = units.heap, units.load, units.accepting, units.draining
        version, partial, partial_left = units.version, queue.partial_heap, queue.partial_left
        partial_head, members, steps = queue.partial_head, queue.members, spec.steps
        holes, bind = members.holes, members.bind
        level = self._fill_level(limit_batch) if units.returning or units.arriving else cap
        added: dict[int, int] = {}
        plan: dict[int, list[int]] = {}
        pop, replace = heapq.heappop, heapq.heapreplace
        while True:
            while heap:
                lu, u = heap[0]
                if accepting[u] and lu == load[u] + added.get(u, 0) and u not in draining:
                    break
                pop(heap)
            else:
                break
            if lu + need > level and lu:
                break
            gid = partial_head()
            if gid is not None:
                n, resumed, b = partial_left[gid], True, by_id[gid].batch
            else:  # BatchMembers.peek, inline (once per group placed)
                b = holes[0] if holes else members.frontier
                if b >= steps:
                    break
                n, resumed = need, False
            if b > limit_batch or not may_start(b, version[u], bound):
                break
            if resumed:
                pop(partial)
            else:
                gid, _ = bind()
            added[u] = lu + n - load[u]
            replace(heap, (lu + n, u))
            ids = plan.get(u)
            if ids is None:
                plan[u] = [gid]
            else:
                ids.append(gid)
        return plan

    # -- observe ---------------------------------------------------------------------
    def observe(self, ev: Event, now: float) -> None:
        self.t = now
        handler = _OBSERVERS.get(type(ev))
        if handler is not None:
            handler(self, ev)

    def _on_completed(self, ev: GroupsCompleted) -> None:
        est, units, q = self.est, self.units, self.queue
        done, partial_left, members = q.done, q.partial_left, q.members
        flags = ev.filtered or repeat(False)
        capped = None
        for gid, lens, filtered in zip(ev.group_ids, ev.response_lengths, flags):
            g = self.groups.groups[gid]
            g.note_tokens(sum(lens) - g.tokens_generated, units.version[ev.replica])
            if ev.filtered:  # the runtime judged it (dynamic sampling): the keep rate learns
                est.keep_rate.add(not filtered)
            if filtered:  # recorded, not trained: its batch owes one more group (controller/batches.py)
                self.groups.mark_filtered(gid, self.t)
                if not members.filter(gid, g.batch) and capped is None:
                    capped = g.batch
            else:
                g.move(GroupState.COMPLETE, self.t)
                self.lengths[gid] = lens
                if ev.filtered:  # a batch short of groups may take it (controller/batches.py)
                    down, up = members.place_kept(gid, g.batch, self.next_step, self._may_move_up)
                    if up is not None:
                        self.groups.groups[up].batch = g.batch
                    g.batch = down
                else:
                    members.keep(gid, g.batch)
                done[g.batch] += 1
                if done[g.batch] == self.spec.groups_per_step:
                    est.batch_tail.add(self.t - q.last_start[g.batch])
            self.running -= 1
            units.unload(ev.replica, gid, len(lens) if gid not in partial_left
                         else partial_left.pop(gid))
            est.response_len.add(sum(lens) / len(lens))
            t0 = self._assigned_at.pop(gid, None)
            if t0 is not None:
                est.group_s.add(self.t - t0)
        if capped is not None:
            raise GenerationCapError(capped, members.bound[capped], members.alive(capped),
                                     self.spec.groups_per_step, self.spec.max_gen_batches,
                                     est.keep_rate.kept / max(1, est.keep_rate.seen))

    def _may_move_up(self, gid: int, batch: int) -> float | None:
        """May generating group ``gid`` move to ``batch`` (staleness)? Ranked: the latest started."""
        v = self.groups.groups[gid].v_first
        if v is not None and batch - v > self.spec.staleness:
            return None
        return self._assigned_at.get(gid, 0.0)

    def _on_interrupted(self, ev: GroupsInterrupted) -> None:
        units, q = self.units, self.queue
        for gid, tok, left in zip(ev.group_ids, ev.tokens_done, ev.responses_left):
            g = self.groups.groups[gid]
            g.note_tokens(tok - g.tokens_generated, units.version[ev.replica])
            g.move(GroupState.PARTIAL, self.t)
            g.interruptions += 1
            units.unload(ev.replica, gid, q.partial_left.get(gid, self.spec.group_size))
            q.requeue(gid, g.batch, left)
            self.running -= 1
            self._assigned_at.pop(gid, None)

    def _on_step(self, ev: TrainStepFinished) -> None:
        s = self.spec
        for gid in self.queue.members.batch_groups(ev.step):
            gap = self.groups.mark_trained(gid, ev.step, s.staleness, self.t)
            self.staleness_max = max(self.staleness_max, gap)
            self.lengths.pop(gid, None)
        self.queue.members.kept.pop(ev.step, None)
        self.est.step_s.add(ev.seconds)
        self.version = ev.version
        self.phase = Phase.IDLE
        self.next_step = ev.step + 1
        self.pending_sync = ev.version if self.next_step < s.steps else None

    def _on_synced(self, ev: WeightsSynced) -> None:
        self.phase = Phase.IDLE
        self.synced = ev.version
        version = self.units.version
        for u in range(self.spec.n_replicas):
            version[u] = ev.version
        for u in self.spec.train_unit_ids():
            version[u] = max(version[u], ev.version)
        self.est.observe_sync(ev.seconds if ev.load_s is None else ev.load_s, ev.bytes_moved)

    def _on_lent(self, ev: DeviceLent) -> None:
        u, t0, units = ev.unit, self.t - ev.seconds, self.units
        for d in self.spec.unit_devices(u):
            self.devices.lend(d, t0, ev.seconds)
        if units.status[u] is UnitStatus.LENDING:
            units.status[u] = UnitStatus.LENT
        units.arrived(u)
        if units.colocated[u]:
            self.est.observe("colocated_switch", (), ev.seconds)
        else:
            self.est.observe_switch(f"{switch_kind(ev.role)}.c_in", u, ev.seconds)
        if ev.role is Role.ROLLOUT and units.status[u] is UnitStatus.LENT:
            units.version[u] = self.version  # borrowed replicas load the newest weights
            units.set_accepting(u, True)

    def _on_reclaimed(self, ev: DeviceReclaimed) -> None:
        u = ev.unit
        for d in self.spec.unit_devices(u):
            self.devices.reclaim(d, self.t, ev.seconds)
        if self.units.colocated[u]:
            self.est.observe("colocated_switch", (), ev.seconds)
        else:
            self.est.observe(f"{switch_kind(ev.role)}.c_out", (), ev.seconds)
        self.units.back_home(u, self.synced)  # a replica gets what its peers hold

    def _on_measured(self, ev: StageMeasured) -> None:
        self.est.observe(ev.stage, ev.features, ev.seconds)

    # -- commit ----------------------------------------------------------------------
    def commit(self, action: Action) -> None:
        handler = _COMMITTERS[type(action)]
        handler(self, action)

    def _do_assign(self, a: AssignGroups) -> None:
        s, t, u, q, units = self.spec, self.t, a.replica, self.queue, self.units
        size, prompt = s.group_size, s.prompt_tokens
        by_id, started, assigned_at = self.groups.groups, q.started, self._assigned_at
        partial, ahead, generating = q.partial_seq, q.ahead, GroupState.GENERATING
        nxt, responses, v = q.next_fresh, 0, units.version[u]
        for gid in a.group_ids:
            if gid in partial:
                del partial[gid]  # its heap entry is stale now (lazy deletion)
                g = by_id[gid]
                q.partial_in_batch[g.batch] -= 1
                q.members.generates(gid, g.batch, True)
                g.move(generating, t)
                g.replica = u
                responses += q.partial_left[gid]
                continue
            if gid < nxt or gid in ahead or gid in by_id:
                raise ValueError(f"group {gid} cannot start: not queued (next fresh group is {nxt})")
            b = q.members.take(gid, nxt)  # its batch: bound in id order (controller/batches.py)
            # Its first tokens come from the version the replica holds now: staleness
            # counts from there, even if the replica is updated before the group ends.
            by_id[gid] = PromptGroup(gid, b, size, prompt, generating, v, v, replica=u,
                                     history=[(t, generating)])
            started[b] += 1
            if q.members.fully_bound(b):
                q.last_start[b] = t
            assigned_at[gid] = t
            responses += size
            if gid == nxt:
                nxt += 1
                while nxt in ahead:
                    ahead.remove(nxt)
                    nxt += 1
            else:
                ahead.add(gid)
        q.next_fresh = nxt
        self.running += len(a.group_ids)
        units.groups[u].update(a.group_ids)
        units.set_load(u, units.load[u] + responses)

    def _do_train(self, a: StartTrainStep) -> None:
        self.phase = Phase.TRAINING
        counts: dict[int, int] = {}
        for c in a.chunks:
            if c.executor != PRIMARY:
                counts[c.executor] = counts.get(c.executor, 0) + len(c.micro_batches)
        self.step_chunks = counts
        self.step_started, self.step_action = self.t, a

    def _do_join(self, a: JoinStep) -> None:
        self.step_chunks.setdefault(a.unit, 0)  # stolen micro-batches: the runtime decides how many

    def _do_sync(self, a: SyncWeights) -> None:
        self.phase = Phase.SYNCING
        self.pending_sync = None

    def _do_lend(self, a: Lend) -> None:
        self.units.begin_lend(a.unit, a.colocated, hosts_rollout=a.role is Role.ROLLOUT)

    def _do_reclaim(self, a: Reclaim) -> None:
        self.units.begin_reclaim(a.unit)

    # -- helpers ---------------------------------------------------------------------
    def _fill_level(self, limit_batch: int) -> int:
        """The load to fill units up to while replicas are returning or arriving: the
        admissible work (running + queued responses) spread evenly over accepting,
        returning and arriving units.  O(units), and only while one is on its way (a C_in
        or C_out)."""
        s, un = self.spec, self.units
        units = [u for u in range(s.n_units) if un.accepting[u] and u not in un.draining]
        through = min(limit_batch, self.synced + s.staleness)
        work = sum(un.load[u] for u in units) + self.queued_groups(through) * s.group_size
        return min(s.replica_cap, math.ceil(work / (len(units) + len(un.returning) + len(un.arriving))))


_OBSERVERS = {
    GroupsCompleted: ClusterState._on_completed,
    GroupsInterrupted: ClusterState._on_interrupted,
    TrainStepFinished: ClusterState._on_step,
    WeightsSynced: ClusterState._on_synced,
    DeviceLent: ClusterState._on_lent,
    DeviceReclaimed: ClusterState._on_reclaimed,
    StageMeasured: ClusterState._on_measured,
}
_COMMITTERS = {
    AssignGroups: ClusterState._do_assign,
    StartTrainStep: ClusterState._do_train,
    SyncWeights: ClusterState._do_sync,
    Lend: ClusterState._do_lend,
    Reclaim: ClusterState._do_reclaim,
    JoinStep: ClusterState._do_join,
}
