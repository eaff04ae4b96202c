"""Keeping rollout replicas full: the admission loop shared by every policy.

Each call hands the next admissible group (partial prefixes first, then fresh groups in
group-id order) to the least-loaded replica that has room for a whole group, until no
replica has room or no group may start.  This is what makes ``async`` a strong baseline:
replicas stay at their concurrency cap up to the staleness bound, and a replica that
frees slots gets work at once.  Cost per assigned group: O(log replicas).
"""

from __future__ import annotations

from collections.abc import Iterator

from bidirl.controller.actions import AssignGroups
from bidirl.controller.state import ClusterState


def fill_replicas(s: ClusterState, limit_batch: int) -> Iterator[AssignGroups]:
    """Assign groups of batches <= ``limit_batch`` (and within staleness) to free replicas."""
    while True:
        unit = s.pick_replica()
        if unit is None:
            return
        gid = s.next_group(unit, limit_batch)
        if gid is None:
            return
        yield AssignGroups(unit, (gid,))
