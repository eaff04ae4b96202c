"""Model A: the steady-state closed form of an envelope's period and wall time under the
staleness bound, with two-way borrowing.

No simulation: closed forms over the stage-time models and one monotone fixed point per
borrowing option (docs/planner.md summarises them and reports their measured error).
Notation per optimizer step: ``B`` responses in ``G`` groups of ``n``, lengths ``L``,
``N`` replicas each holding ``g = floor(cap / n)`` groups, decode step ``d(b) = a + beta b``
at ``b`` running sequences, ``s`` the staleness bound.

Rollout (continuous batching; the controller admits whole groups and frees a group's
slots only when its longest response ends)::

    b_max    = g n E[L] / E[max of n lengths]          running sequences of a full replica
    b(T)     = min(b_max, B E[L] a / (N T - B E[L] beta))   Little's law at period T
    T_fluid  = B E[L] d(b_max) / (N b_max) + prefill / N    the saturated period
    Q        = T_fluid x share of the batch that finds no free group slot at admission
    Lambda   = Q + d(b) S(Q / d(b))      S(x) = E[max_i (L_i - U_i x)]: the long tail of
                                         responses started over the queueing window
Training::

    theta    = ceil(M / dp) t_micro + o,   o = all-reduce + AdamW

The staleness bound admits batch ``k+s+1`` only when version ``k+1`` (trained, synced)
exists, so ``s+1`` batches share one critical path::

    T = max(T_fluid, theta + W, (Lambda(T) + W + theta) / (s + 1))

solved by bisection (the right side does not grow with ``T``).

Borrowing, modelled as the runtime's policy does it; an option is kept only when the
predicted wall time drops (the runtime admits a borrow only when it pays):

* Rollouter-on-TrainPool: the policy lends only the units queued groups can fill, and at
  most ``s + 1`` batches are admissible, so the queue is at most ``q_G = (s+1) G - N g``
  groups (``g`` group slots per replica) and ``N_b = min(T_devices / rollout_tp,
  ceil(q_G / g))`` (none when ``q_G <= 0``).  They serve during the trainer's idle window
  and take at most the queued share ``q = q_G / ((s+1) G)`` of the work:
  ``N -> N + min(N_b (T - theta - C_in - C_out) / T, N q / (1 - q))``.
  A batch is admitted when a step ends, when the lent replicas are home and have handed
  their groups back, so ``Q`` counts the primaries' free slots only.
* Trainer-on-RollPool: a replica that has run dry at step start (share
  ``1 - E[max of B/N lengths] d / T``) hosts an auxiliary trainer; micro-batches split by
  rate (``r_p = dp / t_micro``, ``r_a`` of the auxiliaries), each paying ``C_in + C_grad``:
  ``theta -> o + (M + r_a C) / (r_p + r_a)``.  If the pipeline is train-bound even so,
  every step starts at the weight sync that admits a new batch, no replica is idle when
  the policy lends, and only the first and the last ``s`` steps get auxiliaries.

A run of ``N`` steps pays the pipeline fill and ends with a shorter drain, both in the
simulator's throughput::

    wall = Q_0 + tail_0 + theta + (N - 1) T - (tail - tail_last)

with ``C_in`` added to the fill when units lent at the start must take part of batch 0.

``predict`` (``planner/predict.py``) solves it for each borrowing option and blends it
with model B, the step-by-step recurrence (``planner/pipeline.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bidirl.planner.envelope import Envelope
from bidirl.planner.stages import (
    _aux_theta,
    _feedable,
    _fluid,
    _held_tail,
    _Model,
    _queue,
    _running,
    _tail,
)


@dataclass(frozen=True)
class Steady:
    """The steady state at one period: the period equation's right side and its parts."""

    period: float
    latency: float
    theta: float
    running: float
    fluid: float
    queue: float
    step: float
    replicas: float  # primaries + lent replica-equivalents


def _windows(m: _Model, period: float, queue: float, replicas: float, later: bool = True,
             ) -> tuple[tuple[float, float, float], ...]:
    """The steady state's group starts around one batch's last start: batch ``k + j``
    starts over ``[j T - Q, j T]`` (``T`` the period, ``Q`` the queue), for the batches
    whose responses can overlap its tail; ``later=False``: none admitted after it (the
    run's last batch); each spread over ``replicas``."""
    hold = m.residual.top * (m.a + m.beta * m.full_running)
    span = min(_MAX_OVERLAP, math.ceil(hold / max(period, 1e-9)))
    js = range(-span, span + 1 if later else 1)
    return tuple((j * period - queue, j * period, m.responses / replicas) for j in js)


_MAX_OVERLAP = 16  # batches on either side of a tail that the steady state follows


def _lent_replicas(m: _Model, env: Envelope, s: int, period: float, theta: float) -> float:
    """Replica-equivalents the training pool adds while the trainer waits (Rollouter-on-TrainPool).

    ``N_b (T - theta - C_in - C_out) / T``, at most the queued share: ``N q / (1 - q)``
    (the module doc's first borrowing bullet).
    """
    lent = _feedable(m, env, s)
    if not lent:
        return 0.0
    groups = (s + 1) * m.responses / m.group_size
    share = 1.0 - env.rollout_replicas * m.group_slots / groups
    window = max(0.0, period - theta - m.c_roll)
    return min(lent * window / period, env.rollout_replicas * share / (1.0 - share))


def evaluate(m: _Model, env: Envelope, s: int, option: str, period: float,
              screen: bool = False, above: float | None = None) -> Steady | None:
    """The right-hand side of the period equation at a trial ``period``.

    ``above``: the bisection only asks whether the right side exceeds ``above``; when the
    rollout or training bound already does, the answer is known without the batch tail
    (the costly part), and ``None`` says so."""
    n = float(env.rollout_replicas)
    theta = m.max_rank_s + m.overhead_s
    if option in ("roll_on_train", "both"):
        n += _lent_replicas(m, env, s, period, theta)
    b = _running(m, period, n)
    step = m.a + m.beta * b
    if option in ("train_on_roll", "both") and env.aux_trainer_ranks:
        # A replica is lent at step start if it has run dry: the share of the period
        # after its own longest response.
        idle = max(0.0, 1.0 - m.longest_replica * step / period)
        theta = min(theta, _aux_theta(m, env, idle))
    fluid = _fluid(m, n)
    if above is not None and max(fluid, theta + m.weight_sync_s) > above:
        return None
    primaries = float(env.rollout_replicas)
    # A batch is admitted when a step ends: lent replicas are home then, their running
    # groups handed back, so only the primaries' free group slots take the new batch.
    queue = _queue(m, fluid, min(m.cap, b * n / primaries), primaries)
    latency = queue + (_held_tail(m, queue, step) if screen
                       else _tail(m, queue, step, _windows(m, period, queue, n), n))
    # The trainer pushes weights after every step before it starts the next: a train-bound
    # period is theta + W, not theta.
    rhs = max(fluid, theta + m.weight_sync_s, (latency + m.weight_sync_s + theta) / (s + 1))
    return Steady(rhs, latency, theta, b, fluid, queue, step, n)


def run_wall_s(m: _Model, env: Envelope, st: Steady, option: str, steps: int, s: int,
               end: Steady | None = None, start_lends: bool = True, screen: bool = False) -> float:
    """Wall time of ``steps`` steps: the pipeline fill, steady periods, a shorter last tail.

    At the start ``s + 1`` batches are admissible and every group slot is free, so batch
    0 queues only for what does not fit; the last batch drains with nothing admitted
    behind it, so its tail runs at the load of the batches before it alone.  ``end``: the steady state
    with auxiliary trainers, which a train-bound pipeline gets only at the first step and
    the last ``s`` steps (``predict``).  ``start_lends``: whether the policy, judging on
    its priors, lends trainer units at ``t = 0`` (``cold_start``).  ``screen``: every
    tail at the steady state's step (``stages._held_tail``), the planner's cheap screen.
    """
    n = float(env.rollout_replicas)
    if option in ("roll_on_train", "both") and start_lends:
        n += _feedable(m, env, s)  # the trainer idles from the start
    b0 = min(float(m.cap), m.first_running * env.rollout_replicas / n)
    q0 = _queue(m, _fluid(m, n), 0.0, n)
    together = float(min(s + 1, steps) * m.responses)  # the batches admitted at t = 0
    if screen:
        first = q0 + _held_tail(m, q0, m.a + m.beta * b0)
    else:
        first = q0 + _tail(m, q0, m.a + m.beta * b0, ((-q0, 0.0, together / n),), n)
    if n > env.rollout_replicas and m.responses / m.group_size > env.rollout_replicas * m.group_slots:
        first += m.c_roll_in  # batch 0 spills onto lent units, which serve only after C_in
    steady_tail = st.latency - st.queue
    if screen:
        last_tail = _held_tail(m, st.queue, m.a + m.beta * st.running / 2)
    else:
        last_tail = _tail(m, st.queue, st.step, _windows(m, st.period, st.queue, st.replicas, later=False),
                          st.replicas)
    ending = max(0.0, steady_tail - last_tail) if steps > 1 else 0.0
    if end is None:
        return first + st.theta + (steps - 1) * st.period - ending
    k = min(s, steps - 1)
    return first + end.theta + (steps - 1 - k) * st.period + k * end.period - ending


def solve(m: _Model, env: Envelope, s: int, option: str, screen: bool = False,
          guess: float | None = None, ceiling: float | None = None) -> Steady:
    """Bisection on ``T = f(T)``; ``f`` does not increase with ``T``.

    ``guess``: a period near the fixed point (the screen's, for the drained form).  Then a
    narrow bracket of the fixed point is found first (``_bracket``: a few evaluations), and
    the bisection evaluates ``f`` only at the midpoints inside it: ``g(T) = f(T) - T``
    decreases, so a midpoint left of the bracket has ``f > T`` and one right of it has not.
    The bisection takes the same steps and returns the same period, in about half the
    evaluations (each drained one costs about a millisecond).
    """
    lo = 1e-6
    f_lo = evaluate(m, env, s, option, lo, screen).period  # f(lo) >= fixed point
    if ceiling is None:  # the period without borrowing at a very long trial period
        ceiling = evaluate(m, env, s, "none", 1e9, screen).period
    hi = max(f_lo, ceiling)

    def g(t: float) -> float:
        return evaluate(m, env, s, option, t, screen).period - t

    left, right = _bracket(g, lo, f_lo - lo, hi, guess) if guess else (lo, hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mid <= left or mid >= right:
            up = mid <= left
        else:
            st = evaluate(m, env, s, option, mid, screen, above=mid)
            up = st is None or st.period > mid
        if up:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4 * hi:
            break
    return evaluate(m, env, s, option, hi, screen)


def _bracket(g, a: float, ga: float, b: float, guess: float, width: float = 1e-6,
             evals: int = 6) -> tuple[float, float]:
    """``(a, b)`` with ``g(a) > 0 >= g(b)`` around the root of a decreasing ``g`` (given
    ``g(a) = ga > 0`` and ``g(b) <= 0``), narrowed from ``guess`` and a point 1 % past it
    by Illinois steps (regula falsi that halves a stale end's weight) to ``width``
    relative, in at most ``evals`` more evaluations."""
    gb = None
    for t in (guess, None):
        if t is None:  # the second point: 1 % from the first, towards the root
            t = guess * (1.01 if ga > 0 and a == guess else 0.99)
        if a < t < b:
            gt = g(t)
            if gt > 0:
                a, ga = t, gt
            else:
                b, gb = t, gt
    if gb is None:
        gb = g(b)
    side = 0
    for _ in range(evals):
        if b - a <= width * b or gb >= ga:
            break
        c = b - gb * (b - a) / (gb - ga)
        if not a < c < b:
            c = 0.5 * (a + b)
        gc = g(c)
        if gc > 0:
            a, ga = c, gc
            gb, side = (gb * 0.5 if side > 0 else gb), 1
        else:
            b, gb = c, gc
            ga, side = (ga * 0.5 if side < 0 else ga), -1
    return a, b
