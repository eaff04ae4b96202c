"""Splitting work between the primary and auxiliary executors, in proportion to capacity.

Two pure functions:

* ``split_by_capacity`` divides ``n`` indivisible items (prompt groups, micro-batches)
  in proportion to capacities with the largest-remainder method; ties go to the lower
  index, so the split is deterministic.
* ``plan_chunks`` decides how many of a training batch's micro-batches the primary
  trainer keeps and how many each auxiliary trainer computes.  It applies the two
  refinements of the veRL RFC that earn their place here:

  - *startup drain*: an auxiliary trainer that is still being brought up (C_in) starts
    late, so the primary keeps the work it finishes meanwhile (the aux's offset);
  - *joint tail split*: the primary deals micro-batches round-robin to its ``dp`` ranks,
    so it only gets faster by whole rounds; the plan finds the round count where the
    primary's and the auxiliaries' finish times cross (binary search: one grows, the
    other shrinks) and gives the remainder to the auxiliaries by water-filling their
    finish times (offset = start delay + C_grad), keeping the slowest executor's
    makespan minimal.

A third, ``steal_schedule``, says what happens when an auxiliary trainer *joins a step in
progress* (``JoinStep``): each primary rank keeps ``PRIMARY_DEPTH`` calls on its device (at
2, one micro-batch queued behind the one it computes, and it claims its next one when it
starts the queued one; at 1, it claims its next one when the current one ends); the
auxiliary takes the last micro-batch nobody has claimed each time it is free.  The
simulator runs it on true times, the admission on predicted ones, the real runtime by
pulling work as calls return.
Chunk plans stay fixed at step start; a join only moves micro-batches, never the merge
order (each is merged where the plan put it).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Calls a primary rank keeps on its device.  At 2 (one computing, one queued) the device never
# waits for a round trip to the driver, but the queued one is claimed, and a replica that joins
# the step late finds nothing to take (balanced's rollout device idled 0.5-0.8 s a step for
# it; BENCHMARKS.md, issue 11).  At 1 a rank claims its next micro-batch only when its current
# one returns: one round trip (a few ms) per ~0.1-0.6 s micro-batch buys joiners the tail.
# The real train driver keeps this many calls and the join rule below plays out the same;
# 1 and 2 compared in the simulator: docs/notes/2026-12-contention-investigations.md; on real
# devices: BENCHMARKS.md.
PRIMARY_DEPTH = 1


def split_by_capacity(n: int, capacities: Sequence[float]) -> list[int]:
    """``n`` items split in proportion to ``capacities`` (largest remainder, stable)."""
    if n < 0:
        raise ValueError(f"cannot split a negative count ({n})")
    if any(c < 0 for c in capacities):
        raise ValueError(f"capacities must be >= 0: {list(capacities)}")
    total = float(sum(capacities))
    if n == 0 or not capacities:
        return [0] * len(capacities)
    if total <= 0:
        raise ValueError("no capacity to split work over")
    quotas = [n * c / total for c in capacities]
    shares = [math.floor(q) for q in quotas]
    left = n - sum(shares)
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


@dataclass(frozen=True, slots=True)
class AuxExecutor:
    """An auxiliary trainer: it can start after ``delay_s`` and ships its chunk in ``tail_s``."""

    unit: int
    delay_s: float
    tail_s: float
    cap: int | None = None  # at most this many micro-batches (None: as capacity allows)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    primary: int  # micro-batches the primary keeps (the first ones, in order)
    aux: tuple[int, ...]  # micro-batches per auxiliary executor, in the given order
    makespan_s: float  # predicted time until the last gradient is at the primary


def _aux_makespan(m: int, micro_s: float, offsets: Counter) -> float:
    """Smallest T such that the auxiliaries can finish ``m`` micro-batches by T.

    ``offsets`` counts auxiliaries by when they can start (offset = start delay + C_grad);
    one that starts at ``off`` finishes its q-th micro-batch at ``off + q * micro_s``.  T is
    one of those instants: per distinct offset, binary-search the smallest q whose instant
    has capacity for ``m``, and keep the earliest.  O(distinct offsets^2 * log m), exact.
    """
    if m <= 0:
        return 0.0
    if len(offsets) == 1:  # all start together: ceil(m / n) micro-batches each
        ((off, n),) = offsets.items()
        return off + math.ceil(m / n) * micro_s

    def capacity(t: float) -> int:
        return sum(n * max(0, math.floor((t - off) / micro_s + 1e-9))
                   for off, n in offsets.items())

    best = math.inf
    for off in offsets:
        lo, hi = 1, m  # the first auxiliary alone finishes m micro-batches by q = m
        while lo < hi:
            q = (lo + hi) // 2
            if capacity(off + q * micro_s) >= m:
                hi = q
            else:
                lo = q + 1
        best = min(best, off + lo * micro_s)
    return best


def plan_chunks(n_micro: int, primary_micro_s: float, dp: int, aux: Sequence[AuxExecutor],
                aux_micro_s: float) -> ChunkPlan:
    """Best split of ``n_micro`` micro-batches (see module docstring)."""
    if dp < 1:
        raise ValueError("dp must be >= 1")
    rounds_all = math.ceil(n_micro / dp)
    best = ChunkPlan(n_micro, tuple(0 for _ in aux), rounds_all * primary_micro_s)
    if not aux or n_micro == 0 or aux_micro_s <= 0:
        return best
    offsets = Counter(a.delay_s + a.tail_s for a in aux)

    def times(rounds: int) -> tuple[int, float, float]:
        n_p = min(n_micro, rounds * dp)
        return n_p, rounds * primary_micro_s, _aux_makespan(n_micro - n_p, aux_micro_s, offsets)

    # The primary's time grows with its rounds and the auxiliaries' shrinks, so the best
    # split is at their crossing: the fewest rounds with t_p >= t_a, or one round fewer.
    lo, hi = 0, rounds_all
    while lo < hi:
        mid = (lo + hi) // 2
        _, t_p, t_a = times(mid)
        if t_p >= t_a:
            hi = mid
        else:
            lo = mid + 1
    for rounds in (lo, lo - 1):  # more primary rounds first: they win ties
        if not 0 <= rounds < rounds_all:
            continue
        n_p, t_p, t_a = times(rounds)
        span = max(t_p, t_a)
        if span < best.makespan_s - 1e-9:
            caps = [max(0, math.floor((t_a - (a.delay_s + a.tail_s)) / aux_micro_s + 1e-9))
                    for a in aux]
            best = ChunkPlan(n_p, tuple(split_by_capacity(n_micro - n_p, caps)), span)
    return _within_caps(best, n_micro, primary_micro_s, dp, aux, aux_micro_s)


def _within_caps(plan: ChunkPlan, n_micro: int, primary_micro_s: float, dp: int,
                 aux: Sequence[AuxExecutor], aux_micro_s: float) -> ChunkPlan:
    """``plan`` with each auxiliary's share cut to its ``cap``; the primary takes the rest."""
    shares = tuple(n if a.cap is None else min(n, a.cap) for a, n in zip(aux, plan.aux))
    if shares == plan.aux:
        return plan
    n_p = n_micro - sum(shares)
    span = max([math.ceil(n_p / dp) * primary_micro_s]
               + [a.delay_s + a.tail_s + n * aux_micro_s for a, n in zip(aux, shares) if n])
    return ChunkPlan(n_p, shares, span)


@dataclass(frozen=True, slots=True)
class RankProgress:
    """Where a primary rank stands when an auxiliary joins: the micro-batch it computes
    ends at ``current_end_s`` (absolute), one of ``queued_s`` seconds waits behind it (None:
    none), and ``todo`` holds the ones it has not claimed, ``(index, seconds)`` in order."""

    current_end_s: float
    queued_s: float | None
    todo: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class StealPlan:
    # per auxiliary: the micro-batches it computes, ``(index, claim time)`` in the order taken
    stolen: tuple[tuple[tuple[int, float], ...], ...]
    primary_end_s: float  # when the last primary rank is done (absolute)
    aux_end_s: tuple[float, ...]  # per auxiliary: when it is free for good (absolute)


def steal_schedule(ranks: Sequence[RankProgress], aux_free_s: Sequence[float],
                   aux_micro_s: Mapping[int, float], aux_scale: Sequence[float] | None = None) -> StealPlan:
    """The two-ended pull of a join (module docstring), event by event: O(n log n).

    A rank claims the head of its ``todo`` when it starts its queued micro-batch, or, with
    none queued (depth 1), when its current one ends; an auxiliary, free from
    ``aux_free_s[j]``, takes the highest unclaimed index of all ranks each time it is free,
    and computes it in ``aux_micro_s[index] * aux_scale[j]``.  Ties in time go to the
    primary (a call that returns first is answered first), then to the auxiliary listed
    first.
    """
    scale = list(aux_scale) if aux_scale is not None else [1.0] * len(aux_free_s)
    todo = [deque(r.todo) for r in ranks]
    queued = [r.queued_s for r in ranks]
    events = [(r.current_end_s, 0, i) for i, r in enumerate(ranks)]
    events += [(t, 1, j) for j, t in enumerate(aux_free_s)]
    heapq.heapify(events)
    primary_end = max((r.current_end_s for r in ranks), default=min(aux_free_s, default=0.0))
    stolen: list[list[tuple[int, float]]] = [[] for _ in aux_free_s]
    aux_end = list(aux_free_s)
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == 1:  # auxiliary ``i`` is free: the highest unclaimed index, if any
            tails = [(q[-1][0], j) for j, q in enumerate(todo) if q]
            if not tails:
                aux_end[i] = t
                continue
            idx, _ = todo[max(tails)[1]].pop()
            stolen[i].append((idx, t))
            heapq.heappush(events, (t + aux_micro_s[idx] * scale[i], 1, i))
        elif queued[i] is not None:  # it starts the queued one and claims the next behind it
            d = queued[i]
            queued[i] = todo[i].popleft()[1] if todo[i] else None
            heapq.heappush(events, (t + d, 0, i))
        elif todo[i]:  # depth 1: nothing queued, it claims its next one now
            heapq.heappush(events, (t + todo[i].popleft()[1], 0, i))
        else:  # nothing behind the one that just ended: this rank is done
            primary_end = max(primary_end, t)
    return StealPlan(tuple(tuple(x) for x in stolen), primary_end, tuple(aux_end))


def rank_progress(rank_items: Sequence[Sequence[tuple[int, float]]], started_s: float, now_s: float,
                  depth: int | None = None) -> list[RankProgress]:
    """Each rank's ``RankProgress`` at ``now_s`` if it has computed its ``(index, seconds)``
    items back to back since ``started_s`` (the admission's view of a step in progress),
    keeping ``depth`` calls on its device (``PRIMARY_DEPTH`` unless given: 1 or 2)."""
    depth = PRIMARY_DEPTH if depth is None else depth
    if depth not in (1, 2):
        raise ValueError(f"depth: {depth} calls on a primary's device; allowed: 1, 2")
    out = []
    for items in rank_items:
        t, k = started_s, 0
        while k < len(items) and t + items[k][1] <= now_s:
            t += items[k][1]
            k += 1
        if k >= len(items):  # done: nothing running, nothing queued
            out.append(RankProgress(t, None, ()))
            continue
        current_end = t + items[k][1]
        if depth == 1:
            out.append(RankProgress(current_end, None, tuple(items[k + 1:])))
            continue
        queued = items[k + 1][1] if k + 1 < len(items) else None
        out.append(RankProgress(current_end, queued, tuple(items[k + 2:])))
    return out
