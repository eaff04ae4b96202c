"""``async``: fixed pools, group-level staleness admission, partial rollout.

The strong disaggregated baseline (veRL fully_async, AReaL, ROLL async): rollout runs
ahead of training up to the staleness bound, group by group; every replica is kept at its
concurrency cap, new groups go to the least-loaded replica, and a weight update pauses
replicas instead of draining them (partial rollout).  The trainer steps as soon as its
batch is complete and pushes new weights right after each step.

The borrowing policies extend this class through two hooks, ``roll`` (idle trainer units
host rollout replicas) and ``aux`` (idle rollout replicas host auxiliary trainers), so
that they differ from ``async`` only by what they borrow.
"""

from __future__ import annotations

from collections.abc import Iterator

from bidirl.controller.actions import Action, Reclaim, SyncWeights
from bidirl.controller.events import Event
from bidirl.controller.state import ClusterState, Phase
from bidirl.policy import reproducible
from bidirl.policy.assign import fill_replicas
from bidirl.policy.base import Policy, batch_micro_batches, build_step, reclaim_away, register


@register("async")
class AsyncPolicy(Policy):
    roll = None  # roll_borrow.RollLending or None
    aux = None  # train_borrow.AuxLending or None

    def decide(self, s: ClusterState, event: Event) -> Iterator[Action]:
        yield from self.train(s)
        if self.roll is not None:
            yield from self.roll.actions(s, event)
        if self.aux is not None:
            yield from self.aux.actions(s, event)
        yield from fill_replicas(s, self.limit_batch(s))

    def limit_batch(self, s: ClusterState) -> int:
        """Highest batch that may start anywhere (staleness is checked per replica)."""
        return s.spec.steps - 1

    def may_sync(self, s: ClusterState) -> bool:
        return True  # partial rollout: replicas pause for the update, nothing drains

    def train(self, s: ClusterState) -> Iterator[Action]:
        """Push weights after a step; start the next step when its batch is complete."""
        if s.phase is not Phase.IDLE or s.finished:
            return
        if s.pending_sync is not None:
            if self.may_sync(s) and reproducible.sync_allowed(s):  # batch boundaries only, if reproducible
                yield SyncWeights(s.pending_sync)
            return
        if not s.queue.batch_ready(s.next_step):
            return
        if not s.units.trainer_home():
            yield from reclaim_away(s, s.spec.train_unit_ids())
            return
        mbs = batch_micro_batches(s)
        aux = (yield from self.aux.for_step(s, mbs)) if self.aux is not None else []
        step = build_step(s, mbs, aux)
        yield step
        used = {c.executor for c in step.chunks}
        for a in aux:  # lent, but the plan found no work worth its C_grad
            if a.unit not in used:
                yield Reclaim(a.unit)
