"""When will batch b be complete?  The rollout-side prediction both admissions need.

A batch is complete when its last group finishes.  That happens ``tail`` seconds after the
last group *starts* (measured online: the long tail of response lengths), and the last
group starts once the queue ahead of it has drained into free replica slots::

    ready = start_lag + tail
    start_lag = 0                                  if the queued responses fit in free slots
              = (responses beyond the free slots) / (responses completing per second)

Borrowing changes both terms: extra replicas (after C_in) add slots and throughput;
replicas lent away remove them and crowd the others, whose decode steps get slower for
as long as they are away (``step_slowdown``).  Everything comes from the calibrated
stage-time models and online statistics in ``controller.estimates``.
"""

from __future__ import annotations

from bidirl.controller.state import ClusterState
from bidirl.core.ledger import Pool


def ready_in(s: ClusterState, b: int, add: int = 0, add_delay_s: float = 0.0,
             remove: int = 0, remove_s: float = 0.0) -> float:
    """Predicted seconds until batch ``b`` is complete.

    ``add`` replicas join after ``add_delay_s``; ``remove`` replicas leave for
    ``remove_s`` seconds.
    """
    spec, est = s.spec, s.est
    if b >= spec.steps or s.queue.batch_ready(b):
        return 0.0
    cap, n = spec.replica_cap, spec.group_size
    mean_len = max(est.response_len.value, 1.0)
    active = max(s.units.home_replicas() + s.units.away[Pool.TRAIN], 1)  # + borrowed replicas
    queued = s.queued_groups(b) * n
    tail = est.tail_s()
    if remove and remove >= active:  # nothing rolls out until the first one is back
        return remove_s + ready_in(s, b, add, max(0.0, add_delay_s - remove_s))
    if remove:
        kept = active - remove
        later = s.queued_groups(min(spec.steps - 1, s.version + spec.staleness)) * n
        per_now = min(cap, (s.units.total_load + later) / active)
        per_then = min(cap, (s.units.total_load + later) / kept)
        slow = est.step_slowdown(per_now, per_then)
        tail += (slow - 1.0) * min(tail, remove_s)
        active = kept
    if queued == 0:
        return max(0.0, s.queue.last_start[b] + tail - s.t)
    rate = est.replica_rate()
    free = max(0.0, active * cap - s.units.total_load)
    beyond = queued - free
    if beyond <= 0:
        return tail
    drain = active * rate / mean_len  # responses completing per second
    lag = beyond / drain
    if add and lag > add_delay_s:
        beyond -= drain * add_delay_s + add * cap
        lag = add_delay_s + max(0.0, beyond) / ((active + add) * rate / mean_len)
    return lag + tail
