"""Analytic throughput of an envelope under the staleness bound, with two-way borrowing.

No simulation: closed forms over the stage-time models and one monotone fixed point per
borrowing option (docs/planner.md derives them).  Notation per optimizer step: ``B``
responses, lengths ``L``, ``N`` rollout replicas of capacity ``c`` sequences, decode step
``d(b) = a + beta b`` at ``b`` running sequences (``beta`` = per-sequence FLOPs plus the
KV read of the time-weighted running context), ``s`` the staleness bound.

Rollout (continuous batching; a batch's groups start together when admission allows)::

    b(T)     = min(c, B E[L] a / (N T - B E[L] beta))  mean running sequences per replica
               (Little's law: B E[L] tokens per period at b / d(b) tokens/s per replica)
    T_fluid  = B E[L] d(c) / (N c) + prefill / N        the pool's saturated period
    Lambda   = E[max of B lengths] d(b) + prefill(group) a batch's latency: its longest
                                                        response decodes among b others
Training::

    theta    = max rank's micro-batches + o,   o = all-reduce + AdamW
    M        = micro-batches per step; r_p = dp / t_micro, r_a = n_a / t_aux their rates

The staleness bound admits batch ``k+s+1`` only when version ``k+1`` (trained, synced)
exists, so ``s+1`` batches share one critical path::

    T = max(T_fluid, theta, (Lambda(T) + W + theta) / (s + 1))

solved by bisection (the right side falls as ``T`` grows: more time per batch, fewer
sequences in flight, faster decode steps).

Borrowing changes the capacities the formula sees, minus switch costs, and an option is
taken only when it shortens ``T`` (the runtime admits a borrow only when it pays):

* Rollouter-on-TrainPool: ``N_b`` replicas on the training pool serve during its idle
  window ``T - theta`` less ``C_in + C_out``: ``N = N_r + N_b (T - theta - C) / T``;
* Trainer-on-RollPool: a replica idles once its own share of the batch is done, until the
  next admission: idle time ``T - E[max of B/N lengths] d(b)``.  In it each lent replica
  hosts an auxiliary trainer (``rollout_tp`` devices) that takes micro-batches, less
  ``C = C_in + C_grad``, beside the primary ranks:
  ``theta = o + max((M + r_a C) / (r_p + r_a), (M - r_a (idle - C)) / r_p)``.

A run of ``N`` steps also pays the pipeline fill (the first batch's latency and one
training step run alone), which the simulator's throughput includes::

    wall = Lambda + theta + (N - 1) T,    tokens/s = N x tokens per step / wall
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bidirl.perf.stage_models import weight_sync_s
from bidirl.perf.switch_costs import switch_priors
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope

OPTIONS = ("none", "roll_on_train", "train_on_roll", "both")


@dataclass(frozen=True)
class Prediction:
    tokens_per_s: float  # over the context's ``steps`` (pipeline fill included)
    step_time_s: float  # steady-state period with the chosen borrowing
    wall_s: float
    regime: str  # which bound sets the period: rollout, train or staleness
    rollout_s: float  # saturated rollout period of the primary pool (T_fluid)
    latency_s: float  # one batch's rollout latency at the steady state (Lambda)
    train_s: float  # theta with the chosen borrowing
    running_per_replica: float  # b at the steady state
    weight_sync_s: float
    no_borrow_step_s: float
    borrowed: str  # one of OPTIONS

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class _Model:
    """The envelope's stage constants, resolved once."""

    a: float  # decode step fixed part (weights read + overhead)
    beta: float  # decode step per running sequence
    cap: int  # sequences a replica holds
    tokens: float  # B E[L]: decoded tokens per step
    longest: float  # E[max of B lengths]
    longest_replica: float  # E[max of B / N_r lengths]
    prefill_step_s: float  # replica-seconds of prefill per batch
    prefill_group_s: float
    micro_count: float  # micro-batches per step (the last one partial)
    micro_s: float  # one full micro-batch on a primary rank
    aux_micro_s: float  # one full micro-batch on an auxiliary trainer (rollout_tp devices)
    max_rank_s: float  # the slowest primary rank's micro-batches
    overhead_s: float  # o
    weight_sync_s: float
    c_roll: float  # roll_on_train C_in + C_out
    c_train: float  # train_on_roll C_in + C_grad


def _spans_nodes(start: int, size: int, per_node: int) -> bool:
    return size > 0 and start // per_node != (start + size - 1) // per_node


def _switch_costs(ctx: PlanContext, env: Envelope) -> tuple[float, float]:
    pri = switch_priors(ctx.hw, ctx.model, env.rollout_tp, max(1, env.aux_group))
    c_roll = (ctx.cost("roll_on_train_c_in_s", pri["roll_on_train.c_in"])
              + ctx.cost("roll_on_train_c_out_s", pri["roll_on_train.c_out"]))
    c_train = (ctx.cost("train_on_roll_c_in_s", pri["train_on_roll.c_in"])
               + ctx.cost("train_on_roll_c_grad_s", pri["train_on_roll.c_grad"]))
    return c_roll, c_train


def _model(ctx: PlanContext, env: Envelope) -> _Model:
    L, hw = ctx.lengths, ctx.hw
    rm = ctx.rollout_model(env.rollout_tp)
    a, cc, k = rm.decode.theta
    prefill_group = rm.prefill_s(ctx.group_size * L.prompt_tokens)
    tm = ctx.train_model(env.train_tp)
    tokens = ctx.tokens_per_step
    full = int(tokens // ctx.micro_tokens)
    rest = tokens - full * ctx.micro_tokens
    t_full = tm.microbatch_s(ctx.micro_tokens, L.train_seq_len)
    t_rest = tm.microbatch_s(rest, L.train_seq_len) if rest > 0 else 0.0
    per_rank = math.ceil((full + (rest > 0)) / env.train_dp)
    max_rank = per_rank * t_full if full >= per_rank else full * t_full + t_rest
    t_aux = ctx.train_model(env.rollout_tp).microbatch_s(ctx.micro_tokens, L.train_seq_len)
    spans = _spans_nodes(env.rollout_devices, env.train_devices, hw.devices_per_node)
    w = ctx.cost("weight_sync_s", weight_sync_s(hw, ctx.model, ctx.devices > hw.devices_per_node))
    per_replica = max(1, round(ctx.responses_per_step / env.rollout_replicas))
    c_roll, c_train = _switch_costs(ctx, env)
    return _Model(
        a=a, beta=cc + k * L.running_context, cap=max(1, env.rollout_concurrency),
        tokens=ctx.responses_per_step * L.mean,
        longest=ctx.expected_max(ctx.responses_per_step),
        longest_replica=ctx.expected_max(per_replica),
        prefill_step_s=ctx.prompts_per_step * prefill_group, prefill_group_s=prefill_group,
        micro_count=full + (t_rest / t_full if t_full > 0 else 0.0), micro_s=t_full,
        aux_micro_s=t_aux, max_rank_s=max_rank,
        overhead_s=tm.sync_s(env.train_dp, spans) + tm.optimizer_s(), weight_sync_s=w,
        c_roll=c_roll, c_train=c_train)


def _running(m: _Model, period: float, replicas: float) -> float:
    """Mean running sequences per replica at a steady period (Little's law), capped."""
    spare = replicas * period - m.tokens * m.beta
    if spare <= 0:
        return float(m.cap)
    return min(float(m.cap), m.tokens * m.a / spare)


def _fluid(m: _Model, replicas: float) -> float:
    return (m.tokens * (m.a + m.beta * m.cap) / m.cap + m.prefill_step_s) / replicas


@dataclass(frozen=True)
class _Steady:
    period: float
    latency: float
    theta: float
    running: float
    fluid: float


def _evaluate(m: _Model, env: Envelope, s: int, option: str, period: float) -> _Steady:
    """The right-hand side of the period equation at a trial ``period``."""
    n = float(env.rollout_replicas)
    theta = m.max_rank_s + m.overhead_s
    if option in ("roll_on_train", "both") and env.borrowable_replicas:
        window = max(0.0, period - theta - m.c_roll)
        n += env.borrowable_replicas * window / period
    b = _running(m, period, n)
    step = m.a + m.beta * b
    if option in ("train_on_roll", "both") and env.aux_trainer_ranks:
        # Micro-batches per second of the primary ranks and of the auxiliary trainers.
        rate_p = env.train_dp / m.micro_s
        rate_a = env.aux_trainer_ranks / m.aux_micro_s
        idle = max(0.0, period - m.longest_replica * step)
        shared = (m.micro_count + rate_a * m.c_train) / (rate_p + rate_a)
        limited = (m.micro_count - rate_a * max(0.0, idle - m.c_train)) / rate_p
        theta = min(theta, m.overhead_s + max(shared, limited))
    latency = m.longest * step + m.prefill_group_s
    fluid = _fluid(m, n)
    rhs = max(fluid, theta, (latency + m.weight_sync_s + theta) / (s + 1))
    return _Steady(rhs, latency, theta, b, fluid)


def _solve(m: _Model, env: Envelope, s: int, option: str) -> _Steady:
    """Bisection on ``T = f(T)``; ``f`` does not increase with ``T``."""
    lo = 1e-6
    hi = _evaluate(m, env, s, option, 1e-6).period  # f(lo) >= fixed point
    hi = max(hi, _evaluate(m, env, s, "none", 1e9).period)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _evaluate(m, env, s, option, mid).period > mid:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4 * hi:
            break
    return _evaluate(m, env, s, option, hi)


def predict(ctx: PlanContext, env: Envelope) -> Prediction:
    """Predicted throughput of a hot-switch-compatible (sized) envelope."""
    m = _model(ctx, env)
    s = ctx.staleness
    results = {opt: _solve(m, env, s, opt) for opt in OPTIONS}
    base = results["none"]
    option = min(OPTIONS, key=lambda o: (results[o].period, OPTIONS.index(o)))
    st = results[option]
    if st.period >= base.period * (1 - 1e-9):
        option, st = "none", base
    gate = (st.latency + m.weight_sync_s + st.theta) / (s + 1)
    regime = ("staleness" if gate >= max(st.fluid, st.theta) * (1 - 1e-9)
              else "rollout" if st.fluid >= st.theta else "train")
    wall = st.latency + st.theta + (ctx.steps - 1) * st.period
    return Prediction(
        tokens_per_s=ctx.steps * ctx.tokens_per_step / wall, step_time_s=st.period,
        wall_s=wall, regime=regime, rollout_s=base.fluid, latency_s=st.latency,
        train_s=st.theta, running_per_replica=st.running, weight_sync_s=m.weight_sync_s,
        no_borrow_step_s=base.period, borrowed=option)
