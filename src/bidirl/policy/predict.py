"""When will batch b be complete?  The rollout-side prediction both admissions need.

A batch is complete when its last group finishes.  That happens ``tail`` seconds after the
last group *starts* (measured online: the long tail of response lengths), and the last
group starts once the queue ahead of it has drained into free replica slots::

    ready = start_lag + tail
    start_lag = 0                                  if the queued responses fit in free slots
              = (responses beyond the free slots) / (responses completing per second)

Borrowing changes both terms: extra replicas (after C_in) add slots and throughput;
replicas lent away remove them and crowd the others, whose decode steps get slower for
as long as they are away (``step_slowdown``).  When the queued responses fit in free
slots, extra replicas still spread them: filling leaves an arriving replica its share
(``ClusterState._fill_level``), each replica decodes a smaller batch, and the tail
shortens by the decode model's step-time ratio (``_spread_tail``); the groups beyond the
home replicas' share start after C_in.  That is the whole gain of lending in the fill at
t = 0, when the first batches fit on the home replicas but run there at a crowded batch.
Everything comes from the calibrated stage-time models and online statistics in
``controller.estimates``.  With DAPO's dynamic sampling the queued work is the groups still
to *generate*: the queued ones and the replacements the measured keep rate expects
(``groups_to_generate``: ``(queued + in flight x (1 - k)) / k``), so a lend is judged on the
extra rollout a batch needs.
"""

from __future__ import annotations

import math

from bidirl.controller.state import ClusterState
from bidirl.core.ledger import Pool


def groups_to_generate(s: ClusterState, b: int) -> float:
    """Expected groups still to start for batches ``next_step..b`` (DAPO's dynamic sampling):
    the queued ones and the replacements of those the measured keep rate ``k`` says will be
    filtered, of the queued and of the ones in flight: ``(queued + in_flight (1 - k)) / k``.
    ``queued_groups(b)`` exactly while every group is kept (``k = 1``, the prior)."""
    queued = s.queued_groups(b)
    k = s.est.keep_rate.value
    if k >= 1.0:
        return float(queued)
    return (queued + s.queue.in_flight(s.next_step, b) * (1.0 - k)) / k


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
    queued = groups_to_generate(s, b) * n
    # the admissible work: running + queued responses up to the staleness bound
    work = s.units.total_load + groups_to_generate(s, min(spec.steps - 1, s.version + spec.staleness)) * n
    tail = est.tail_s(min(cap, work / active))  # (the prior, before any group completed, at this load)
    if remove and remove >= active:  # nothing rolls out until the first one is back
        return remove_s + ready_in(s, b, add, max(0.0, add_delay_s - remove_s))
    if remove:
        kept = active - remove
        per_now = min(cap, work / active)
        per_then = min(cap, work / kept)
        slow = est.step_slowdown(per_now, per_then)
        tail += (slow - 1.0) * min(tail, remove_s)
        active = kept
    if queued <= 0:
        return max(0.0, s.queue.last_start[b] + tail - s.t)
    rate = est.replica_rate()
    free = max(0.0, active * cap - s.units.total_load)
    beyond = queued - free
    if beyond <= 0:
        return _spread_tail(s, queued, work, active, add, add_delay_s, tail) if add else tail
    drain = active * rate / mean_len  # responses completing per second
    lag = beyond / drain
    if add and lag > add_delay_s:
        beyond -= drain * add_delay_s + add * cap
        lag = add_delay_s + max(0.0, beyond) / ((active + add) * rate / mean_len)
    return lag + tail


def _spread_tail(s: ClusterState, queued: int, work: int, active: int, add: int,
                 add_delay_s: float, tail: float) -> float:
    """Batch b's tail when ``add`` replicas join after ``add_delay_s`` and its ``queued``
    responses (those of batches <= b not started yet) fit in the free slots.

    The admissible ``work`` (running + queued responses) is spread over ``active + add``
    replicas, as ``_fill_level`` fills them; a replica's decode step at that share is
    faster than at the crowded one by ``step_slowdown``.  If batch b's queued responses do
    not fit in the home replicas' share, its last groups wait for the arriving replicas
    (``add_delay_s``).  Responses already running stay where they are.
    """
    cap, load = s.spec.replica_cap, s.units.total_load
    share = min(cap, max(load / active, math.ceil(work / (active + add))))
    faster = s.est.step_slowdown(share, min(cap, work / active))
    if faster <= 1.0:
        return tail
    waits = queued > active * share - load
    return (add_delay_s if waits else 0.0) + tail / faster
