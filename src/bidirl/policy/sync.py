"""``sync``: colocated synchronous GRPO on every device (veRL hybrid engine, TRL).

Every device runs both stages in turn: rollout of batch k with version k on all devices,
then training of batch k on all devices, then the weight update.  Each phase change
costs the colocated switch (offload one stage, onload the other) on every device.

Expressed with the same actions as the borrowing policies, marked ``colocated``: in the
rollout phase the train-pool units are lent as rollout replicas; in the training phase
the rollout replicas are lent as trainers whose chunks are plain data-parallel shares
(no C_grad).  Staleness is 0 whatever the bound: a group starts only on the newest
weights.
"""

from __future__ import annotations

from collections.abc import Iterator

from bidirl.controller.actions import Action, Lend, SyncWeights
from bidirl.controller.events import Event, TrainStepFinished
from bidirl.controller.state import ClusterState, Phase, UnitStatus
from bidirl.core.ledger import Role
from bidirl.policy.assign import fill_replicas
from bidirl.policy.base import AWAY, Policy, batch_micro_batches, build_step, reclaim_away, register
from bidirl.policy.split import AuxExecutor


@register("sync")
class SyncPolicy(Policy):
    lends_train_devices = True
    lends_rollout_devices = True
    max_staleness = 0  # a group starts only on the newest weights

    def decide(self, s: ClusterState, event: Event) -> Iterator[Action]:
        if s.phase is not Phase.IDLE or s.finished:
            return
        spec = s.spec
        if isinstance(event, TrainStepFinished):  # trainers go back to being replicas
            yield from reclaim_away(s, range(spec.n_replicas))
        if s.pending_sync is not None:
            yield SyncWeights(s.pending_sync)
            return
        if s.queue.batch_ready(s.next_step):
            yield from self._train_phase(s)
            return
        for u in spec.train_unit_ids():  # rollout phase: every device generates
            if s.units.status[u] is UnitStatus.HOME:
                yield Lend(u, Role.ROLLOUT, colocated=True)
        yield from fill_replicas(s, s.synced)

    def _train_phase(self, s: ClusterState) -> Iterator[Action]:
        spec = s.spec
        yield from reclaim_away(s, spec.train_unit_ids())
        switch = s.est.colocated_switch_s()
        for u in range(spec.n_replicas):
            if s.units.status[u] is UnitStatus.HOME and s.units.load[u] == 0:
                yield Lend(u, Role.AUX_TRAIN, colocated=True)
        if not s.units.trainer_home():
            return
        aux = [AuxExecutor(u, switch if s.units.status[u] is UnitStatus.LENDING else 0.0, 0.0)
               for u in range(spec.n_replicas) if s.units.status[u] in AWAY]
        yield build_step(s, batch_micro_batches(s), aux)
