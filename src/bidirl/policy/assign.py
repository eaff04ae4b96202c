"""Keeping rollout replicas full: the admission loop shared by every policy.

Each call hands the next admissible group (partial prefixes first, then fresh groups in
group-id order) to the least-loaded replica that has room for a whole group, until no
replica has room or no group may start.  This is what makes ``async`` a strong baseline:
replicas stay at their concurrency cap up to the staleness bound, and a replica that
frees slots gets work at once.

The greedy runs in ``ClusterState.plan_fill`` (O(log replicas) per group) and is issued
as one ``AssignGroups`` per replica, in replica order, so an event that admits a whole
new batch costs one action per replica rather than one per group.
"""

from __future__ import annotations

from collections.abc import Iterator

from bidirl.controller.actions import AssignGroups
from bidirl.controller.state import ClusterState
from bidirl.policy import reproducible


def fill_replicas(s: ClusterState, limit_batch: int) -> Iterator[AssignGroups]:
    """Assign groups of batches <= ``limit_batch`` (and within staleness) to free replicas."""
    if s.spec.reproducible:  # units at different versions: each group to one at its batch's
        plan = reproducible.plan_fill(s, limit_batch)
    else:
        plan = s.plan_fill(limit_batch)
    for unit in sorted(plan):
        yield AssignGroups(unit, tuple(plan[unit]))
