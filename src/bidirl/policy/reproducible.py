"""Reproducible mode (``scheduler.reproducible=true``): the same weights whatever the timing.

Free-running ``async`` generates a group at whatever version its replica holds (anything
within the staleness bound) and moves a replica's weights mid-response, so what is trained
depends on the machine's timing.  In reproducible mode:

* batch ``b`` is generated at exactly version ``v_b = max(0, b - s)``
  (``core.staleness.generation_version``): a group starts only on a unit holding ``v_b``
  (``ClusterState.next_group`` and :func:`plan_fill` below, through ``may_start(exact=True)``);
* the weights of the rollout replicas move from ``v`` to ``v + 1`` only at a batch
  boundary, when every batch generated at ``v`` (``b <= v + s``) is complete
  (:func:`sync_allowed`, checked by ``AsyncPolicy.train`` before ``SyncWeights``), so no
  response ever sees two versions;
* the runtime samples each response with its own seed (``GroupStore._seed``), and a
  response that is interrupted (a reclaim, a validation, a re-prefill) restarts from its
  first token with that seed instead of resuming its prefix (``GroupStore(reproducible)``,
  ``RolloutRole(reproducible)``), because a resumed request would draw from a new random
  stream.

Given vLLM's per-request sampling being independent of what else is in the batch (checked
on CPU in ``tests/runtime/test_reproducible.py``), every response, every behaviour log-prob
and so every update is a function of the data order and the seeds alone: ``async``,
``bidirl`` (with its borrows in both directions) and any replica count end with bitwise
equal weights.  The price is the pipeline's slack: at ``s = 1`` this is one-step-off's
schedule (rollout of batch b+1 overlaps training of batch b, never more), with borrowing.
"""

from __future__ import annotations

from bidirl.controller.state import ClusterState
from bidirl.core.staleness import generation_version


def sync_allowed(s: ClusterState) -> bool:
    """May the replicas move past version ``s.synced``?  Only when every batch generated at it
    (``b <= synced + s``, and the batches it shares with version 0 at the start) is complete."""
    if not s.spec.reproducible:
        return True
    last = min(s.synced + s.spec.staleness, s.spec.steps - 1)
    return all(s.queue.batch_ready(b) for b in range(s.next_step, last + 1))


def trainer_waits_for_sync(s: ClusterState) -> bool:
    """A trained version is held back by :func:`sync_allowed` (the trainer waits for data)."""
    return s.spec.reproducible and s.pending_sync is not None and not sync_allowed(s)


def plan_fill(s: ClusterState, limit_batch: int) -> dict[int, list[int]]:
    """``ClusterState.plan_fill`` for reproducible mode: unit -> group ids, in queue order.

    Units may hold different versions here (a borrowed replica holds the newest, the primary
    replicas the batch boundary's), and a group fits only the units at its batch's version,
    so the shared greedy's "the least-loaded unit refuses: stop" is not enough: each group
    goes to the least-loaded unit *at its version* with room for it.  Partial groups first
    (lowest id first), then fresh ones in id order, each bound to its batch as it is placed
    (``BatchMembers.bind``; the commits of the ``AssignGroups`` built from the plan do the
    rest).  O(groups x units): this mode is for small runs and tests.
    """
    spec, units, q = s.spec, s.units, s.queue
    cap, need, bound = spec.replica_cap, spec.group_size, spec.staleness
    level = s._fill_level(limit_batch) if units.returning or units.arriving else cap
    load = {u: units.load[u] for u in range(spec.n_units) if units.accepting[u] and u not in units.draining}
    plan: dict[int, list[int]] = {}

    def place(gid: int, b: int, n: int) -> bool:
        if b > limit_batch:
            return False
        want = generation_version(b, bound)
        fits = [(ld, u) for u, ld in load.items() if units.version[u] == want and (ld + n <= level or not ld)]
        if not fits:
            return False
        _, u = min(fits)
        load[u] += n
        plan.setdefault(u, []).append(gid)
        return True

    for gid in sorted(q.partial_seq):  # the partial groups waiting (the heap's valid entries)
        place(gid, s.groups.groups[gid].batch, q.partial_left[gid])
    members = q.members
    while True:  # fresh groups in id order, each bound to its batch once placed
        b = members.peek()
        if b is None or not place(members.next_unbound, b, need):
            break
        members.bind()
    return plan
