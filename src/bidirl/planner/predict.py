"""Analytic throughput of an envelope under the staleness bound, with two-way borrowing.

No simulation: a handful of closed forms over the stage-time models (docs/planner.md
derives them).  Per optimizer step, with ``N_r`` primary replicas, ``dp`` trainer ranks::

    T_r   rollout pool time   = (decode + prefill replica-seconds of one batch) / N_r
          decode              = B E[L] d / c     c: replica concurrency from its KV budget,
                                d: decode step at c sequences of the running mean context
    T_t   training time       = max rank's micro-batches + grad all-reduce + AdamW
    tau   long tail           = (E[max of B lengths] - E[L]) x d: the batch's last response
                                outlives the fluid estimate of when the batch is done
    W     weight sync         trainer -> rollout replicas, once per step

Borrowing moves the idle side's capacity to the bottleneck, minus the switch costs::

    rollout-bound  T = (N_r T_r + N_b (T_t + C_in + C_out)) / (N_r + N_b)
                   N_b = train devices / rollout_tp replicas hosted in the trainer's idle
                   window T - T_t, less the switch in and out
    train-bound    T = o + (X + n_a (T_r + C_in + C_grad)) / (dp + n_a)
                   X rank-seconds of micro-batches, o = all-reduce + optimizer, n_a
                   auxiliary ranks on the rollout pool's idle window

and is used only when it pays (``T`` below the no-borrow period), as the runtime's
admission rule does.  The staleness bound ``s`` lets at most ``s + 1`` batches be in flight,
so one batch's critical path (roll out, tail, sync, train) is shared by ``s + 1`` periods::

    T_step = max(T_balanced, (rho + tau + W + theta) / (s + 1))

A finite run of ``N`` steps also pays the pipeline fill (the first batch's rollout and
training run alone), which the simulator's throughput includes::

    wall(N) = rho_0 + tau + theta + (N - 1) T_step,   tokens/s = N x tokens per step / wall(N)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bidirl.perf.stage_models import weight_sync_s
from bidirl.perf.switch_costs import switch_priors
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope


@dataclass(frozen=True)
class Prediction:
    tokens_per_s: float  # over the context's ``steps`` (pipeline fill included)
    step_time_s: float  # steady-state period with borrowing
    wall_s: float
    regime: str  # which bound sets the period: rollout, train or staleness
    rollout_s: float  # T_r: one batch on the primary rollout pool alone
    train_s: float  # T_t: one step on the primary trainer alone
    tail_s: float
    weight_sync_s: float
    no_borrow_step_s: float
    borrowed: str  # "roll_on_train", "train_on_roll" or "none"

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class _Stages:
    """Per-step stage times of an envelope without borrowing."""

    rollout_replica_s: float  # replica-seconds of rollout work per batch
    decode_step_s: float
    train_compute_rank_s: float  # X: rank-seconds of micro-batches
    train_max_rank_s: float  # the slowest rank's micro-batches (round-robin)
    train_overhead_s: float  # all-reduce + optimizer


def _spans_nodes(start: int, size: int, per_node: int) -> bool:
    return size > 0 and start // per_node != (start + size - 1) // per_node


def _stages(ctx: PlanContext, env: Envelope) -> _Stages:
    L, hw = ctx.lengths, ctx.hw
    rm = ctx.rollout_model(env.rollout_tp)
    c = max(1, env.rollout_concurrency)
    d = rm.decode_step_s(c, c * L.running_context)
    decode = ctx.responses_per_step * L.mean * d / c
    prefill = ctx.prompts_per_step * rm.prefill_s(ctx.group_size * L.prompt_tokens)
    tm = ctx.train_model(env.train_tp)
    tokens = ctx.tokens_per_step
    full = int(tokens // ctx.micro_tokens)
    rest = tokens - full * ctx.micro_tokens
    t_full = tm.microbatch_s(ctx.micro_tokens, L.train_seq_len)
    t_rest = tm.microbatch_s(rest, L.train_seq_len) if rest > 0 else 0.0
    micro = full + (rest > 0)
    per_rank = math.ceil(micro / env.train_dp)
    max_rank = per_rank * t_full if full >= per_rank else full * t_full + t_rest
    spans = _spans_nodes(env.rollout_devices, env.train_devices, hw.devices_per_node)
    overhead = tm.sync_s(env.train_dp, spans) + tm.optimizer_s()
    return _Stages(decode + prefill, d, full * t_full + t_rest, max_rank, overhead)


def _switch_costs(ctx: PlanContext, env: Envelope) -> dict[str, float]:
    pri = switch_priors(ctx.hw, ctx.model, env.rollout_tp, max(1, env.aux_group))
    names = {"roll_on_train.c_in": "roll_on_train_c_in_s",
             "roll_on_train.c_out": "roll_on_train_c_out_s",
             "train_on_roll.c_in": "train_on_roll_c_in_s",
             "train_on_roll.c_out": "train_on_roll_c_out_s",
             "train_on_roll.c_grad": "train_on_roll_c_grad_s"}
    return {k: ctx.cost(v, pri[k]) for k, v in names.items()}


def predict(ctx: PlanContext, env: Envelope) -> Prediction:
    """Predicted throughput of a hot-switch-compatible (sized) envelope."""
    st = _stages(ctx, env)
    sw = _switch_costs(ctx, env)
    n_r, n_b = env.rollout_replicas, env.borrowable_replicas
    dp, n_a = env.train_dp, env.aux_trainer_ranks
    t_roll = st.rollout_replica_s / n_r
    t_train = st.train_max_rank_s + st.train_overhead_s
    w = ctx.cost("weight_sync_s", weight_sync_s(ctx.hw, ctx.model, ctx.devices
                                                > ctx.hw.devices_per_node))
    tail = max(0.0, ctx.lengths.expected_max(ctx.responses_per_step) - ctx.lengths.mean) \
        * st.decode_step_s
    s = ctx.staleness

    # Borrowing, each direction when it pays.
    c_rt = sw["roll_on_train.c_in"] + sw["roll_on_train.c_out"]
    roll_bal = (n_r * t_roll + n_b * (t_train + c_rt)) / (n_r + n_b) if n_b else t_roll
    c_tr = sw["train_on_roll.c_in"] + sw["train_on_roll.c_grad"]
    train_bal = (st.train_overhead_s + (st.train_compute_rank_s + n_a * (t_roll + c_tr))
                 / (dp + n_a)) if n_a else t_train
    # Critical path of one batch when both pools lend in their idle phase.
    rho = min(t_roll, (n_r * t_roll + n_b * c_rt) / (n_r + n_b)) if n_b else t_roll
    theta = min(t_train, st.train_overhead_s + (st.train_compute_rank_s + n_a * c_tr)
                / (dp + n_a)) if n_a else t_train

    no_borrow = max(t_roll, t_train, (t_roll + tail + w + t_train) / (s + 1))
    if t_roll >= t_train:
        balanced, borrowed = min(t_roll, max(roll_bal, t_train)), "roll_on_train"
    else:
        balanced, borrowed = min(t_train, max(train_bal, t_roll)), "train_on_roll"
    gate = (rho + tail + w + theta) / (s + 1)
    period = max(balanced, gate)
    if period >= no_borrow - 1e-12:
        period, borrowed = no_borrow, "none"
    regime = "staleness" if gate >= balanced else ("rollout" if t_roll >= t_train else "train")
    wall = rho + tail + theta + (ctx.steps - 1) * period
    return Prediction(
        tokens_per_s=ctx.steps * ctx.tokens_per_step / wall,
        step_time_s=period, wall_s=wall, regime=regime, rollout_s=t_roll, train_s=t_train,
        tail_s=tail, weight_sync_s=w, no_borrow_step_s=no_borrow, borrowed=borrowed)
