"""The controller's view of the cluster: ledgers, versions, the group queue, unit status.

State changes in exactly two ways: ``observe(event)`` records what a runtime reported,
and ``commit(action)`` records what the controller just asked for (optimistically, so a
policy that yields several actions in a row sees the effect of the earlier ones).  Policies
read it and never write it.

Everything a policy asks per event is O(1) or O(log n): the least-loaded replica comes
from a heap with lazy deletion, batch readiness from counters, the queue is a counter of
fresh groups (in group-id order) plus a heap of partial groups waiting to be resumed.
Filling the replicas (``plan_fill``) costs O(log units) per group placed and is committed
as one ``AssignGroups`` per replica, so a decision that admits a whole batch stays cheap.

Unit status::

    HOME --Lend--> LENDING --DeviceLent--> LENT --Reclaim--> RECLAIMING --DeviceReclaimed--> HOME
"""

from __future__ import annotations

import heapq
import math
from enum import StrEnum

from bidirl.controller.actions import (
    PRIMARY,
    Action,
    AssignGroups,
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
from bidirl.core.ledger import DeviceLedger, GroupLedger, Pool, Role, switch_kind
from bidirl.core.samples import GroupState, PromptGroup
from bidirl.core.staleness import batch_of, may_start


class Phase(StrEnum):
    IDLE = "idle"
    TRAINING = "training"
    SYNCING = "syncing"


class UnitStatus(StrEnum):
    HOME = "home"
    LENDING = "lending"
    LENT = "lent"
    RECLAIMING = "reclaiming"


class ClusterState:
    """Cluster state owned by the controller (see module docstring)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.t = 0.0
        self.est = Estimates(spec)
        self.groups = GroupLedger()
        self.devices = DeviceLedger.build(list(spec.rollout_devices()), list(spec.train_devices),
                                          spec.devices_per_node)
        n = spec.n_units
        self.version = 0  # newest policy version (the primary trainer's)
        self.synced = 0  # the version the primary rollout replicas hold
        self.running = 0  # groups generating now
        self.phase = Phase.IDLE
        self.next_step = 0  # the batch the trainer trains next
        self.pending_sync: int | None = None  # a version trained but not yet pushed
        self.step_chunks: dict[int, int] = {}  # aux unit -> micro-batches, last step started
        self.away = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}  # units not home, per owner pool
        # Units: status, role hosted, version held, responses running, accepting groups.
        self.status = [UnitStatus.HOME] * n
        self.colocated = [False] * n
        self.unit_version = [0] * n
        self.load = [0] * n
        self.accepting = [u < spec.n_replicas for u in range(n)]
        self.unit_groups: list[set[int]] = [set() for _ in range(n)]
        self.draining: set[int] = set()  # policy wants these emptied (no new groups)
        # Replicas coming home from a borrowed role (C_out): filling leaves them their share.
        self.returning: set[int] = set()
        self._heap = [(0, u) for u in range(spec.n_replicas)]
        self.idle_replicas: set[int] = set(range(spec.n_replicas))  # home, empty replicas
        # Queue: fresh groups are next_fresh.. in id order (``_ahead``: fresh groups already
        # committed beyond next_fresh while one decision's actions are being committed);
        # partial groups wait in a heap of (group, seq), valid while _partial_seq agrees.
        self.next_fresh = 0
        self._ahead: set[int] = set()
        self._partial: list[tuple[int, int]] = []
        self._partial_seq: dict[int, int] = {}
        self._seq = 0
        self.partial_left: dict[int, int] = {}
        self.started = [0] * spec.steps  # fresh groups started, per batch
        self.last_start = [0.0] * spec.steps  # when a batch's last group started
        self.total_load = 0  # responses running on all units
        self.done = [0] * spec.steps  # groups complete, per batch
        self.partial_in_batch = [0] * spec.steps
        self.lengths: dict[int, tuple[int, ...]] = {}
        self._assigned_at: dict[int, float] = {}
        self.staleness_max = 0
        self.admissions: list = []  # AdmissionDecision records (policy.admission)

    # -- queries -------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.next_step >= self.spec.steps and self.phase is not Phase.TRAINING

    def batch_ready(self, b: int) -> bool:
        return b < self.spec.steps and self.done[b] == self.spec.groups_per_step

    def queued_groups(self, through_batch: int) -> int:
        """Groups of batches <= ``through_batch`` not running and not complete."""
        s = self.spec
        last = min(through_batch, s.steps - 1)
        fresh = max(0, (last + 1) * s.groups_per_step - self.next_fresh)
        return fresh + sum(self.partial_in_batch[self.next_step: last + 1])

    def trainer_home(self) -> bool:
        return self.away[Pool.TRAIN] == 0

    def home_replicas(self) -> int:
        return self.spec.n_replicas - self.away[Pool.ROLLOUT]

    def next_group(self, unit: int, limit_batch: int) -> int | None:
        """The next group (partial first, then fresh in id order) admissible on ``unit``."""
        s, v = self.spec, self.unit_version[unit]
        gid = self._partial_head()
        if gid is not None:
            b = batch_of(gid, s.groups_per_step)
            if b <= limit_batch and may_start(b, v, s.staleness):
                return gid
        gid = self.next_fresh
        if gid >= s.total_groups:
            return None
        b = batch_of(gid, s.groups_per_step)
        if b <= limit_batch and may_start(b, v, s.staleness):
            return gid
        return None

    def queue_head(self) -> int | None:
        """The group that starts next (partial prefixes first), if any is queued."""
        gid = self._partial_head()
        if gid is not None:
            return gid
        return self.next_fresh if self.next_fresh < self.spec.total_groups else None

    def has_queued_work(self) -> bool:
        return bool(self._partial_seq) or self.next_fresh < self.spec.total_groups

    def plan_fill(self, limit_batch: int) -> dict[int, list[int]]:
        """Where the queue's head goes now: unit -> group ids, in queue order.

        A greedy run to exhaustion: each group goes to the least-loaded accepting unit
        with room for a whole group, while that unit may start it (batch <=
        ``limit_batch`` and ``core.staleness.may_start`` at the unit's version).  While
        replicas are on their way home (``returning``) the room stops at ``_fill_level``,
        so the first replica back does not take the whole queue from its peers.  The
        result must be committed (one ``AssignGroups`` per unit, any order) before the state
        is read again: the heaps are updated in place with what the plan takes, which the
        commits make true.  O(log units) per group, no allocation but the ids.
        """
        spec = self.spec
        cap, need, gps, bound = spec.replica_cap, spec.group_size, spec.groups_per_step, spec.staleness
        heap, load, accepting, draining = self._heap, self.load, self.accepting, self.draining
        version, partial, partial_left = self.unit_version, self._partial, self.partial_left
        fresh, total = self.next_fresh, spec.total_groups
        level = self._fill_level(limit_batch) if self.returning else cap
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
            gid = self._partial_head()
            if gid is not None:
                n, resumed = partial_left[gid], True
            elif fresh < total:
                gid, n, resumed = fresh, need, False
            else:
                break
            b = gid // gps
            if b > limit_batch or not may_start(b, version[u], bound):
                break
            if resumed:
                pop(partial)
            else:
                fresh += 1
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
        est = self.est
        for gid, lens in zip(ev.group_ids, ev.response_lengths):
            g = self.groups.groups[gid]
            g.note_tokens(sum(lens) - g.tokens_generated, self.unit_version[ev.replica])
            g.move(GroupState.COMPLETE, self.t)
            self.lengths[gid] = lens
            self.done[g.batch] += 1
            self.running -= 1
            if self.done[g.batch] == self.spec.groups_per_step:
                est.batch_tail.add(self.t - self.last_start[g.batch])
            self._unload(ev.replica, gid, len(lens) if gid not in self.partial_left
                         else self.partial_left.pop(gid))
            est.response_len.add(sum(lens) / len(lens))
            t0 = self._assigned_at.pop(gid, None)
            if t0 is not None:
                est.group_s.add(self.t - t0)

    def _on_interrupted(self, ev: GroupsInterrupted) -> None:
        for gid, tok, left in zip(ev.group_ids, ev.tokens_done, ev.responses_left):
            g = self.groups.groups[gid]
            g.note_tokens(tok - g.tokens_generated, self.unit_version[ev.replica])
            g.move(GroupState.PARTIAL, self.t)
            g.interruptions += 1
            self._unload(ev.replica, gid, self.partial_left.get(gid, self.spec.group_size))
            self.partial_left[gid] = left
            self.partial_in_batch[g.batch] += 1
            self.running -= 1
            self._seq += 1
            self._partial_seq[gid] = self._seq
            heapq.heappush(self._partial, (gid, self._seq))
            self._assigned_at.pop(gid, None)

    def _on_step(self, ev: TrainStepFinished) -> None:
        s = self.spec
        for gid in range(ev.step * s.groups_per_step, (ev.step + 1) * s.groups_per_step):
            gap = self.groups.mark_trained(gid, ev.step, s.staleness, self.t)
            self.staleness_max = max(self.staleness_max, gap)
            self.lengths.pop(gid, None)
        self.est.step_s.add(ev.seconds)
        self.version = ev.version
        self.phase = Phase.IDLE
        self.next_step = ev.step + 1
        self.pending_sync = ev.version if self.next_step < s.steps else None

    def _on_synced(self, ev: WeightsSynced) -> None:
        self.phase = Phase.IDLE
        self.synced = ev.version
        for u in range(self.spec.n_replicas):
            self.unit_version[u] = ev.version
        for u in self.spec.train_unit_ids():
            self.unit_version[u] = max(self.unit_version[u], ev.version)
        self.est.observe("weight_sync", (1.0,), ev.seconds)

    def _on_lent(self, ev: DeviceLent) -> None:
        u, t0 = ev.unit, self.t - ev.seconds
        for d in self.spec.unit_devices(u):
            self.devices.lend(d, t0, ev.seconds)
        if self.status[u] is UnitStatus.LENDING:
            self.status[u] = UnitStatus.LENT
        if self.colocated[u]:
            self.est.observe("colocated_switch", (), ev.seconds)
        else:
            self.est.observe(f"{switch_kind(ev.role)}.c_in", (), ev.seconds)
        if ev.role is Role.ROLLOUT and self.status[u] is UnitStatus.LENT:
            self.unit_version[u] = self.version  # borrowed replicas load the newest weights
            self._set_accepting(u, True)

    def _on_reclaimed(self, ev: DeviceReclaimed) -> None:
        u = ev.unit
        for d in self.spec.unit_devices(u):
            self.devices.reclaim(d, self.t, ev.seconds)
        if self.colocated[u]:
            self.est.observe("colocated_switch", (), ev.seconds)
        else:
            self.est.observe(f"{switch_kind(ev.role)}.c_out", (), ev.seconds)
        self.status[u] = UnitStatus.HOME
        self.returning.discard(u)
        self.away[self.spec.unit_pool(u)] -= 1
        self.colocated[u] = False
        if u < self.spec.n_replicas:
            self.unit_version[u] = self.synced  # it gets what its peers hold
            self._set_accepting(u, True)

    def _on_measured(self, ev: StageMeasured) -> None:
        self.est.observe(ev.stage, ev.features, ev.seconds)

    # -- commit ----------------------------------------------------------------------
    def commit(self, action: Action) -> None:
        handler = _COMMITTERS[type(action)]
        handler(self, action)

    def _do_assign(self, a: AssignGroups) -> None:
        s, t, u = self.spec, self.t, a.replica
        gps, size, prompt, total = s.groups_per_step, s.group_size, s.prompt_tokens, s.total_groups
        by_id, started, assigned_at = self.groups.groups, self.started, self._assigned_at
        partial, ahead, generating = self._partial_seq, self._ahead, GroupState.GENERATING
        nxt, responses, v = self.next_fresh, 0, self.unit_version[u]
        for gid in a.group_ids:
            if gid in partial:
                del partial[gid]  # its heap entry is stale now (lazy deletion)
                g = by_id[gid]
                self.partial_in_batch[g.batch] -= 1
                g.move(generating, t)
                g.replica = u
                responses += self.partial_left[gid]
                continue
            if gid < nxt or gid in ahead or gid >= total or gid in by_id:
                raise ValueError(f"group {gid} cannot start: not queued (next fresh group is {nxt})")
            b = gid // gps
            # Its first tokens come from the version the replica holds now: staleness
            # counts from there, even if the replica is updated before the group ends.
            by_id[gid] = PromptGroup(gid, b, size, prompt, generating, v, v, replica=u,
                                     history=[(t, generating)])
            started[b] += 1
            if started[b] == gps:
                self.last_start[b] = t
            assigned_at[gid] = t
            responses += size
            if gid == nxt:
                nxt += 1
                while nxt in ahead:
                    ahead.remove(nxt)
                    nxt += 1
            else:
                ahead.add(gid)
        self.next_fresh = nxt
        self.running += len(a.group_ids)
        self.unit_groups[u].update(a.group_ids)
        self._set_load(u, self.load[u] + responses)

    def _do_train(self, a: StartTrainStep) -> None:
        self.phase = Phase.TRAINING
        counts: dict[int, int] = {}
        for c in a.chunks:
            if c.executor != PRIMARY:
                counts[c.executor] = counts.get(c.executor, 0) + len(c.micro_batches)
        self.step_chunks = counts

    def _do_sync(self, a: SyncWeights) -> None:
        self.phase = Phase.SYNCING
        self.pending_sync = None

    def _do_lend(self, a: Lend) -> None:
        u = a.unit
        if self.status[u] is not UnitStatus.HOME:
            raise ValueError(f"unit {u} is {self.status[u].value}; only a home unit can be lent")
        if u < self.spec.n_replicas and self.load[u]:
            raise ValueError(f"replica {u} still runs {self.load[u]} responses; drain it first")
        self.status[u] = UnitStatus.LENDING
        self.away[self.spec.unit_pool(u)] += 1
        self.colocated[u] = a.colocated
        self.draining.discard(u)
        self._set_accepting(u, False)

    def _do_reclaim(self, a: Reclaim) -> None:
        u = a.unit
        if self.status[u] not in (UnitStatus.LENDING, UnitStatus.LENT):
            raise ValueError(f"unit {u} is {self.status[u].value}; cannot reclaim")
        self.status[u] = UnitStatus.RECLAIMING
        if u < self.spec.n_replicas and not self.colocated[u]:
            self.returning.add(u)
        self._set_accepting(u, False)

    # -- helpers ---------------------------------------------------------------------
    def _fill_level(self, limit_batch: int) -> int:
        """The load to fill units up to while replicas are returning: the admissible work
        (running + queued responses) spread evenly over accepting and returning units.
        O(units), and only while a replica is returning (a second or so after a step)."""
        s = self.spec
        units = [u for u in range(s.n_units) if self.accepting[u] and u not in self.draining]
        through = min(limit_batch, self.synced + s.staleness)
        work = sum(self.load[u] for u in units) + self.queued_groups(through) * s.group_size
        return min(s.replica_cap, math.ceil(work / (len(units) + len(self.returning))))

    def _partial_head(self) -> int | None:
        """The lowest partial group waiting to be resumed (stale heap entries dropped)."""
        heap, seq = self._partial, self._partial_seq
        while heap:
            gid, n = heap[0]
            if seq.get(gid) == n:
                return gid
            heapq.heappop(heap)
        return None

    def _unload(self, unit: int, gid: int, responses: int) -> None:
        self.unit_groups[unit].discard(gid)
        self._set_load(unit, max(0, self.load[unit] - responses))

    def _set_load(self, unit: int, load: int) -> None:
        self.total_load += load - self.load[unit]
        self.load[unit] = load
        if self.accepting[unit]:
            heapq.heappush(self._heap, (load, unit))
        if unit < self.spec.n_replicas:
            if load == 0 and self.status[unit] is UnitStatus.HOME:
                self.idle_replicas.add(unit)
            else:
                self.idle_replicas.discard(unit)

    def _set_accepting(self, unit: int, on: bool) -> None:
        self.accepting[unit] = on
        if on:
            heapq.heappush(self._heap, (self.load[unit], unit))
        if unit < self.spec.n_replicas:
            if on and self.load[unit] == 0:
                self.idle_replicas.add(unit)
            elif not on:
                self.idle_replicas.discard(unit)


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
}
