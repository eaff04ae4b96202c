"""The pipeline recurrence: batch-by-batch expected timeline of an envelope.

The steady-state closed forms of ``closed_form`` assume a period that repeats; a short run
with a staleness bound of 2-4 never gets there (``s + 1`` batches are admitted together
at the start, finish together, and the steps alternate long and short).  This module
follows the pipeline step by step instead, with expected values only: no response is
sampled and no event queue is kept, so it is a recurrence over the ``N`` optimizer steps,
each a handful of vector operations over the group slots.

State: ``free``, the time each primary group slot is next free (sorted); ``pending``, the
admitted groups that have not started (FIFO, group-id order, as the controller admits).
For step ``k``::

    t0        = sync_end(k-1)                    batch k+s becomes admissible
    starts    = FIFO assignment of the pending groups to the earliest free slots
                (a group holds its slot tau = E[max of n lengths] d + prefill)
    ready(k)  = last start of batch k + tail(its start window)          (stages._tail)
    lend      Rollouter-on-TrainPool: if the trainer waits (ready(k) > t0) and groups
              queue at t0, ceil(queued / g) trainer units join as replicas at t0 + C_in
              and stay until ready(k), judged by the policy's rule (the last step they
              serve must start earlier, C_out included); the groups they still run at
              the reclaim go back as partial prefixes, queued first, and their batch is
              complete when the longest of them is
    start(k)  = max(ready(k), t0) [+ C_out]
    aux       Trainer-on-RollPool: primary replicas with no group left at start(k) and
              nothing queued train a share of the micro-batches (stages._aux_theta)
    sync_end(k) = start(k) + theta_k + W
    commit    the groups that start before sync_end(k); the rest stay pending

Which replica a group lands on is not tracked: the controller fills the least-loaded
replica, so groups spread evenly and a replica is empty only when its last slot is free
(``idle = #(free <= t) - (g - 1) N``).  Decode speed depends on the running load: a batch
runs at ``d(b)`` with ``b = cap x`` the slot occupancy when it is admitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bidirl.planner.stages import _drain, _tail
from bidirl.policy.admission import last_start

PRIMARY, LENT = 0, 1  # the pools a group can run on: a primary replica, a lent trainer unit


class _Plan(dict):
    """Planned starts per pending batch, ``(index, resumed) -> starts``; ``on_lent``: which
    of them run on borrowed slots (absent: none), ``units`` the borrowed replicas."""

    def __init__(self, units: float = 0.0) -> None:
        super().__init__()
        self.units = units
        self.on_lent: dict[tuple[int, bool], np.ndarray] = {}
        self.resumed: list[tuple[_Batch, float]] = []  # handed-back prefixes, last planned start
        self.ready: dict[int, float] = {}  # batch -> ready time under this plan (state fixed till commit)


@dataclass(frozen=True)
class Timeline:
    wall_s: float  # end of the last optimizer step
    step_ends_s: tuple[float, ...]  # end of each simulated step (horizon only)
    steady_period_s: float  # mean period between the fill and the drain
    lent_windows: int  # steps whose idle window lent trainer units
    aux_steps: int  # steps that used auxiliary trainers


@dataclass
class _Batch:
    index: int
    admit: float
    left: int  # groups not started yet
    tau: float  # how long one of its groups holds a slot
    step: float  # decode step time while it runs
    first: float = math.inf  # first group start (committed)
    last: float = -math.inf  # last group start (committed)
    resume: bool = False  # partial prefixes handed back by reclaimed borrowed replicas
    stall: float = 0.0  # replica-seconds of prefill the handed-back prefixes cost
    longest: float = 0.0  # resumed part: decode steps the batch's longest response has left
    left_responses: int = 0  # resumed part: responses handed back


class Pipeline:
    """One envelope's recurrence.  ``m`` is ``stages._Model``; ``group_longest`` is
    ``E[max of n lengths]`` in tokens."""

    def __init__(self, m, env, s: int, group_longest: float, theta_fn, prefill_fn=None,
                 prompt_tokens: float = 0.0, mean_length: float = 0.0,
                 first_lend: int | None = None) -> None:
        self.m, self.env, self.s = m, env, s
        self.n = env.rollout_replicas
        self.g = m.group_slots
        self.slots = self.n * self.g
        self.groups = max(1, round(m.responses / m.group_size))
        self.group_longest = group_longest
        self.theta_fn = theta_fn  # idle share -> theta with auxiliaries
        self.prefill_fn = prefill_fn  # prompt tokens -> prefill seconds on one replica
        self.prompt_tokens, self.mean_length = prompt_tokens, mean_length
        # units the policy lends at t = 0, judged on its priors (planner.cold_start);
        # None: judge the first window like every other
        self.first_lend = first_lend
        # committed group starts: (first, last, responses per replica of the pool, pool)
        self._chunks: list[tuple[float, float, float, int]] = []
        self._started: dict[int, _Batch] = {}  # batches whose every group has started
        self._pools: dict[int, set[int]] = {}  # pools each batch's started groups run on
        self._resumed: dict[int, list[tuple[_Batch, float]]] = {}  # started handbacks, last start

    # -- rollout ------------------------------------------------------------------------
    def _batch_speed(self, busy: float) -> tuple[float, float]:
        """Decode step and slot hold time of a batch admitted with ``busy`` slots taken."""
        m = self.m
        occ = min(1.0, (busy + self.groups) / self.slots)
        step = m.a + m.beta * m.cap * occ
        return step, self.group_longest * step + m.prefill_group_s

    @staticmethod
    def _assign(free: np.ndarray, admit: float, count: int, tau: float,
                expiry: np.ndarray | None = None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """FIFO: ``count`` groups admitted at ``admit`` take the earliest free slots.

        Returns the starts (nondecreasing), the new sorted free times, their expiry and
        which groups run on borrowed slots (``None`` without borrowed slots).
        Slot ``j`` (sorted) takes groups ``j, j + S, j + 2S, ...``: with one hold time per
        batch the slot freed first is always the next to be free again.
        """
        if expiry is not None:
            alive = free < expiry
            free, expiry = free[alive], expiry[alive]
        size = len(free)
        if size == 0 or count == 0:
            return np.empty(0), free, expiry, np.zeros(0, dtype=bool)
        first = np.maximum(admit, free[:min(count, size)])
        rounds = -(-count // size)
        if rounds == 1:
            starts = first
        else:
            starts = (first[None, :] + tau * np.arange(rounds)[:, None]).ravel()[:count]
        used = min(count, size)
        # slots used j = 0..used-1: the last round for slot j is the highest r with r*size+j < count
        last_idx = np.arange(used) + size * ((count - 1 - np.arange(used)) // size)
        ends = starts[last_idx] + tau
        new_free = np.concatenate((ends, free[used:]))
        if expiry is None:
            return starts, np.sort(new_free), None, None
        order = np.argsort(new_free, kind="stable")
        on_lent = np.isfinite(np.tile(expiry[:used], rounds)[:count])
        return starts, new_free[order], expiry[order], on_lent

    @staticmethod
    def _with_borrowed(free: np.ndarray, lent: tuple[float, int, float] | None,
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        """The primary slots plus ``lent = (from, slots, until)`` borrowed ones, sorted, with
        each slot's expiry (``inf`` for a primary slot); no expiry array when nothing is lent."""
        if lent is None:
            return free, None
        at, count, until = lent
        free = np.concatenate((free, np.full(count, at)))
        exp = np.concatenate((np.full(len(free) - count, np.inf), np.full(count, until)))
        order = np.argsort(free, kind="stable")
        return free[order], exp[order]

    def _plan(self, free: np.ndarray, pending: list[_Batch], lent: tuple[float, int, float] | None,
              ) -> tuple[_Plan, np.ndarray, np.ndarray | None]:
        """Assign every pending group; ``lent = (from, slots, until)`` adds borrowed slots."""
        free, exp = self._with_borrowed(free, lent)
        out = _Plan(units=lent[1] / self.g if lent is not None else 0.0)
        for b in pending:
            starts, free, exp, on_lent = self._assign(free, b.admit, b.left, b.tau, exp)
            out[(b.index, b.resume)] = starts
            if b.resume and len(starts):
                out.resumed.append((b, float(starts[-1])))
            if on_lent is not None and on_lent.any():
                out.on_lent[(b.index, b.resume)] = on_lent
        return out, free, exp

    def _pools_of(self, k: int, plan: _Plan) -> set[int]:
        """The pools (``PRIMARY``, ``LENT``) batch ``k``'s groups run on, started or planned."""
        pools = set(self._pools.get(k, ()))
        starts = plan.get((k, False))
        if starts is not None and len(starts):
            lent = plan.on_lent.get((k, False))
            pools |= {PRIMARY} if lent is None else {LENT} | ({PRIMARY} if not lent.all() else set())
        return pools

    def _windows(self, plan: _Plan, pool: int) -> list[tuple[float, float, float]]:
        """Group starts on one pool, committed and planned: ``(first, last, responses per
        replica of the pool)``."""
        size = self.n if pool == PRIMARY else plan.units
        out = [c[:3] for c in self._chunks if c[3] == pool]
        if pool == PRIMARY:  # handed-back prefixes, resumed or planned, load the primaries
            out += [self._resumed_window(b, last) for lst in self._resumed.values() for b, last in lst]
            out += [self._resumed_window(b, last) for b, last in plan.resumed]
        if size <= 0:
            return out
        n = self.m.group_size / size
        for key, st in plan.items():
            if key[1] or not len(st):
                continue
            lent = plan.on_lent.get(key)
            sel = (st if pool == PRIMARY else st[:0]) if lent is None else st[lent if pool == LENT else ~lent]
            if len(sel):
                out.append((float(sel[0]), float(sel[-1]), len(sel) * n))
        return out

    def _ready(self, batch: _Batch, starts: np.ndarray, plan: _Plan) -> float:
        """The batch's last response ends: its last group start plus the long tail of the
        responses started over its start window (``stages._tail``), at the load every
        batch's groups put on a replica of each pool it runs on while it drains."""
        first = min(batch.first, float(starts[0])) if len(starts) else batch.first
        last = float(starts[-1]) if len(starts) else batch.last
        tail = 0.0
        for pool in self._pools_of(batch.index, plan) or {PRIMARY}:
            rel = tuple((lo - last, hi - last, n) for lo, hi, n in self._windows(plan, pool))
            size = self.n if pool == PRIMARY else plan.units
            tail = max(tail, _tail(self.m, max(0.0, last - first), batch.step, rel, size))
        return last + tail

    def _resumed_ready(self, b: _Batch, last: float, plan: _Plan) -> float:
        """When handed-back prefixes whose last one resumes at ``last`` are done: the
        batch's longest response has ``b.longest`` decode steps left, run on the primaries
        at their load (``stages._drain``), which the resumed responses add to."""
        rel = [(lo - last, hi - last, n) for lo, hi, n in self._windows(plan, PRIMARY)]
        return last + _drain(self.m, b.longest, b.step, tuple(rel), self.n)

    def _resumed_window(self, b: _Batch, last: float) -> tuple[float, float, float]:
        """The load handed-back prefixes put on the primaries once resumed (the last at
        ``last``): their responses go on from where the reclaim cut them, as if started
        over their original start span shifted by the wait to resume."""
        shift = last - b.admit
        return (b.first + shift, b.last + shift, b.left_responses / self.n)

    def _ready_of(self, k: int, pending: list[_Batch], plan: _Plan) -> float:
        """When batch ``k`` is complete: its own groups and any resumed partial prefixes."""
        if k not in plan.ready:
            plan.ready[k] = self._complete(k, pending, plan)
        return plan.ready[k]

    def _complete(self, k: int, pending: list[_Batch], plan: _Plan) -> float:
        ready = -math.inf
        if k in self._started:  # its tail still depends on the groups started beside it
            ready = self._ready(self._started[k], np.empty(0), plan)
        for b, last in self._resumed.get(k, ()):
            ready = max(ready, self._resumed_ready(b, last, plan))
        for b in pending:
            if b.index == k:
                starts = plan[(b.index, b.resume)]
                ready = max(ready, self._resumed_ready(b, float(starts[-1]), plan) if b.resume
                            else self._ready(b, starts, plan))
        return ready

    def _chain(self, k: int, pending: list[_Batch], plan, c_out: float,
               steps: int) -> float:
        """When the trainer could start the last step whose batch is admitted now:
        ``start(k) = ready(k) + C_out``, ``start(i+1) = max(start(i) + theta + W, ready(i+1))``."""
        m = self.m
        ready = [self._ready_of(i, pending, plan)
                 for i in range(k, min(k + self.s, steps - 1) + 1)]
        return last_start(ready, m.max_rank_s + m.overhead_s + m.weight_sync_s, c_out)

    # -- the recurrence -----------------------------------------------------------------
    def run(self, steps: int, lend_roll: bool, lend_aux: bool) -> Timeline:
        m, s = self.m, self.s
        free = np.zeros(self.slots)
        pending: list[_Batch] = []
        ends: list[float] = []
        sync_end = 0.0
        lent_windows = aux_steps = 0
        lendable = self.env.borrowable_replicas if lend_roll else 0
        self._chunks, self._started, self._pools, self._resumed = [], {}, {}, {}
        hold = m.residual.top * (m.a + m.beta * m.full_running)  # the longest a response runs
        first_batches = min(s + 1, steps)
        for k in range(first_batches):  # all run together: the load of every one of them
            step, tau = self._batch_speed(self.groups * (first_batches - 1))
            pending.append(_Batch(k, 0.0, self.groups, tau, step))
        for k in range(steps):
            t0 = sync_end
            self._chunks = [c for c in self._chunks if c[1] + hold > t0]  # done decoding
            if k > 0 and k + s < steps:
                busy = float(np.count_nonzero(free > t0)) + sum(b.left for b in pending)
                step, tau = self._batch_speed(busy)
                pending.append(_Batch(k + s, t0, self.groups, tau, step))
            plan, planned, expiry = self._plan(free, pending, None)
            ready = self._ready_of(k, pending, plan)
            lent = None
            c_out = 0.0
            cold = k == 0 and self.first_lend is not None
            if lendable and ready > t0 and not (cold and self.first_lend == 0):
                queued = sum(int(np.count_nonzero(v > t0 + m.c_roll_in)) for v in plan.values())
                units = min(lendable, math.ceil(queued / self.g - 1e-9))
                if cold:  # the policy has decided already, on its priors
                    units = min(lendable, self.first_lend)
                if units > 0:
                    trial = (t0 + m.c_roll_in, units * self.g, math.inf)
                    plan_l, _, _ = self._plan(free, pending, trial)
                    ready_l = self._ready_of(k, pending, plan_l)
                    trial = (t0 + m.c_roll_in, units * self.g, ready_l)  # reclaimed then
                    plan_l, planned_l, expiry_l = self._plan(free, pending, trial)
                    c_out_l = m.c_roll - m.c_roll_in
                    # the policy's admission rule: lend only if the last step the borrowed
                    # replicas work for (up to the queue's head) starts earlier
                    if cold or (self._chain(k, pending, plan_l, c_out_l, steps)
                                < self._chain(k, pending, plan, 0.0, steps)):
                        lent, plan, planned, expiry = trial, plan_l, planned_l, expiry_l
                        c_out = c_out_l
                        ready = self._ready_of(k, pending, plan)
                        lent_windows += 1
            start = max(ready, t0) + c_out
            theta = m.max_rank_s + m.overhead_s
            if lend_aux and self.env.aux_trainer_ranks and not any(
                    np.count_nonzero(v > start) for v in plan.values()):
                # nothing admissible is waiting: primary replicas whose every slot is free
                # host auxiliary trainers for this step
                primaries = planned if expiry is None else planned[np.isinf(expiry)]
                idle = int(np.count_nonzero(primaries <= start)) - (self.g - 1) * self.n
                idle = max(0, min(self.n, idle))
                if idle and self.theta_fn(idle / self.n) < theta:
                    theta = self.theta_fn(idle / self.n)
                    aux_steps += 1
            end = start + theta
            ends.append(end)
            sync_end = end + m.weight_sync_s
            free, pending = self._commit(free, pending, lent, sync_end, plan)
        wall = ends[-1]
        lo, hi = min(s + 1, len(ends) - 1), max(0, len(ends) - 1 - s)
        period = (ends[hi] - ends[lo]) / (hi - lo) if hi > lo else wall / len(ends)
        return Timeline(wall, tuple(ends), period, lent_windows, aux_steps)

    def _commit(self, free: np.ndarray, pending: list[_Batch], lent, until: float,
                plan) -> tuple[np.ndarray, list[_Batch]]:
        """Start, for good, the groups whose planned start is before ``until``.

        Groups still running on borrowed slots when the trainer reclaims them go back as
        partial prefixes: their remaining hold is queued first, at the reclaim time, and
        their batch is ready only when the resumed part is done.
        """
        free, exp = self._with_borrowed(free, lent)
        keep, resumed, chunks = [], [], []
        units = lent[1] / self.g if lent is not None else 0.0
        for b in pending:
            take = b.left if b.resume else int(np.searchsorted(plan[(b.index, False)], until, side="left"))
            if take:
                st, free, exp, on_lent = self._assign(free, b.admit, take, b.tau, exp)
                if b.resume:
                    self._resumed.setdefault(b.index, []).append((b, float(st[-1])))
                    b.left = 0
                    continue
                b.first = min(b.first, float(st[0]))
                b.last = float(st[-1])
                b.left -= take
                for pool, sel in ((PRIMARY, st if on_lent is None else st[~on_lent]),
                                  (LENT, st[:0] if on_lent is None else st[on_lent])):
                    if len(sel):
                        size = self.n if pool == PRIMARY else units
                        chunks.append((float(sel[0]), float(sel[-1]), len(sel) * self.m.group_size / size, pool))
                        self._pools.setdefault(b.index, set()).add(pool)
                if on_lent is not None and lent is not None:
                    cut_starts = st[on_lent]
                    cut = cut_starts + b.tau - lent[2]
                    keep_cut = cut > 0
                    if keep_cut.any():
                        resumed.append(self._handback(b, cut_starts[keep_cut], cut[keep_cut],
                                                      lent[2]))
            if b.left > 0:
                keep.append(b)
            else:
                self._started[b.index] = b
        self._chunks += chunks
        if exp is not None:  # borrowed slots go home
            free = free[np.isinf(exp)]
        stall = sum(r.stall for r in resumed) / max(1, self.n)
        if stall > 0:  # re-prefilling the handed-back prefixes stops every primary replica
            free = np.where(free > lent[2], free + stall, free)
        return free, resumed + keep

    def _handback(self, b: _Batch, starts: np.ndarray, remaining: np.ndarray,
                  at: float) -> _Batch:
        """Groups a reclaimed borrowed replica was running: queued first at ``at``, each to
        hold a primary slot for its remaining time plus the prefill of prompt + prefix."""
        stall = 0.0
        if self.prefill_fn is not None:
            prefix = np.minimum((at - starts) / b.step, self.mean_length)
            n = self.m.group_size
            stall = float(sum(self.prefill_fn(n * (self.prompt_tokens + p)) for p in prefix))
        x = self.m.staggered(max(0.0, b.last - b.first) / b.step)  # the batch's longest, after its last start
        left = max(0.0, x - (at - b.last) / b.step)
        return _Batch(b.index, at, len(remaining), float(remaining.mean()), b.step, first=float(starts[0]),
                      last=float(starts[-1]), resume=True, longest=left, stall=stall,
                      left_responses=len(remaining) * self.m.group_size)
