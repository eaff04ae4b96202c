"""``one-step-off``: rollout of batch k+1 overlaps training of batch k, batch by batch.

veRL's one_step_off_policy and slime's train_async: fixed pools, and a batch-level
barrier.  Batch b starts only when batch b-1 is fully generated and the replicas hold
version >= b-1 (version b when the staleness bound is 0); weights are pushed only when
the replicas are drained, so there is no partial rollout and no group-level admission.
"""

from __future__ import annotations

from bidirl.controller.state import ClusterState
from bidirl.policy.asynchronous import AsyncPolicy
from bidirl.policy.base import register


@register("one-step-off")
class OneStepOffPolicy(AsyncPolicy):
    max_staleness = 1  # batch b starts once batch b-1 is generated, on version >= b-1

    def limit_batch(self, s: ClusterState) -> int:
        first_incomplete = s.next_step
        while s.queue.batch_ready(first_incomplete):
            first_incomplete += 1
        return min(s.synced + min(1, s.spec.staleness), first_incomplete)

    def may_sync(self, s: ClusterState) -> bool:
        return s.running == 0
