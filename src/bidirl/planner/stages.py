"""The envelope's stage constants, and the per-batch quantities both throughput models use.

``_model(ctx, env)`` resolves an envelope's stage-time models, lengths and switch costs
into constants once (``_Model``).  The helpers are the pieces the closed form
(``closed_form``) and the recurrence (``pipeline``, which ``predict`` hands ``_Model`` and
``_aux_theta``) are built from: the running sequences at a period (Little's law), the
saturated rollout period, a batch's wait for group slots and its long tail, the units a
lend can feed, and the step with auxiliary trainers.  Notation as in ``closed_form``.

With DAPO's dynamic sampling the rollout side of a step is the groups it *generates*,
``G / keep_rate`` (``PlanContext.generated_per_step``): ``B``, the decoded tokens, the
prefill and the batch's tail are sized by them, the training side by the ``G`` groups it
trains.  So a lower keep rate predicts a longer rollout period, a later batch and a split
that gives rollout more devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from bidirl.perf.stage_models import weight_sync_s
from bidirl.perf.switch_costs import switch_priors
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope
from bidirl.planner.residual import Residual


@dataclass(frozen=True)
class _Model:
    """The envelope's stage constants, resolved once."""

    a: float  # decode step fixed part (weights read + overhead)
    beta: float  # decode step per running sequence
    cap: float  # running sequences of a replica whose group slots are all taken
    group_slots: int  # prompt groups a replica holds at once
    tokens: float  # B E[L]: decoded tokens per step
    longest_replica: float  # E[max of B / N_r lengths]
    staggered: object  # x -> E[max_i (L_i - U_i x)] over the B responses of a batch
    residual: Residual  # tokens responses decode inside a window
    responses: int  # B
    group_size: int
    first_running: float  # sequences per replica in flight when the run starts
    prefill_step_s: float  # replica-seconds of prefill per batch
    prefill_group_s: float  # a group's prefill (+ the tool waits of its slowest trajectory): ends a tail
    micro_count: float  # micro-batches per step (the last one partial)
    micro_s: float  # one full micro-batch on a primary rank
    aux_micro_s: float  # one full micro-batch on an auxiliary trainer (rollout_tp devices)
    max_rank_s: float  # the slowest primary rank's micro-batches
    overhead_s: float  # o
    weight_sync_s: float
    c_roll: float  # roll_on_train C_in + C_out
    c_roll_in: float  # roll_on_train C_in
    c_train: float  # train_on_roll C_in + C_grad

    @property
    def full_running(self) -> float:
        """Sequences a replica runs when every group slot has just been filled."""
        return float(self.group_slots * self.group_size)


def _spans_nodes(start: int, size: int, per_node: int) -> bool:
    return size > 0 and start // per_node != (start + size - 1) // per_node


def _switch_costs(ctx: PlanContext, env: Envelope) -> tuple[float, float, float]:
    """``C_in + C_out`` of a lent trainer unit, its ``C_in``, ``C_in + C_grad`` of an auxiliary."""
    pri = switch_priors(ctx.hw, ctx.model, env.rollout_tp, max(1, env.aux_group))
    c_roll_in = ctx.cost("roll_on_train_c_in_s", pri["roll_on_train.c_in"])
    c_roll = c_roll_in + ctx.cost("roll_on_train_c_out_s", pri["roll_on_train.c_out"])
    c_train = (ctx.cost("train_on_roll_c_in_s", pri["train_on_roll.c_in"])
               + ctx.cost("train_on_roll_c_grad_s", pri["train_on_roll.c_grad"]))
    return c_roll, c_roll_in, c_train


def _model(ctx: PlanContext, env: Envelope) -> _Model:
    L, hw = ctx.lengths, ctx.hw
    rm = ctx.rollout_model(env.rollout_tp)
    a, cc, k = rm.decode.theta
    prefill_group = rm.prefill_s(ctx.group_size * L.prompt_tokens)
    tm = ctx.train_model(env.train_tp)
    tokens = ctx.tokens_per_step
    micro = ctx.micro_mean_tokens
    full = int(tokens // micro)
    rest = tokens - full * micro
    t_full = tm.microbatch_s(micro, L.train_seq_len)
    t_rest = tm.microbatch_s(rest, L.train_seq_len) if rest > 0 else 0.0
    per_rank = math.ceil((full + (rest > 0)) / env.train_dp)
    max_rank = per_rank * t_full if full >= per_rank else full * t_full + t_rest
    t_aux = ctx.train_model(env.rollout_tp).microbatch_s(micro, L.train_seq_len)
    spans = _spans_nodes(env.rollout_devices, env.train_devices, hw.devices_per_node)
    per_gb = getattr(ctx.costs, "weight_sync_s_per_gb", None) if ctx.costs is not None else None
    w = ctx.cost("weight_sync_s", weight_sync_s(hw, ctx.model, ctx.devices > hw.devices_per_node, per_gb))
    generated = ctx.generated_per_step  # B: responses rolled out per step (dynamic sampling: / keep rate)
    per_replica = max(1, round(generated / env.rollout_replicas))
    c_roll, c_roll_in, c_train = _switch_costs(ctx, env)
    residual = ctx._cached(("residual", 0), lambda: Residual(L.quantiles))  # one per plan
    group_slots = max(1, env.rollout_concurrency // ctx.group_size)
    cap = group_slots * ctx.group_size * L.mean / ctx.expected_max(ctx.group_size)
    beta = cc + k * (L.running_context + L.env_tokens / 2 if L.env_tokens else L.running_context)
    if L.turn_prefills:  # multi-turn: later turns re-prefill their contexts, pausing the replica's decode
        beta += L.turn_prefills * rm.prefill_s(L.turn_prefill_tokens) / L.mean  # their share per decoded token
    if L.tool_s:  # multi-turn: a trajectory on its tool holds its group's slot but does not decode
        decode_s = L.mean * (a + beta * cap)
        cap *= decode_s / (decode_s + L.tool_s)
    return _Model(
        a=a, beta=beta,
        cap=cap,
        group_slots=group_slots,
        tokens=generated * L.mean,
        longest_replica=ctx.expected_max(per_replica),
        staggered=ctx.staggered_max(generated), residual=residual,
        responses=generated,
        group_size=ctx.group_size,
        first_running=(ctx.staleness + 1) * generated * L.mean
        / (env.rollout_replicas * ctx.expected_max(generated)),
        prefill_step_s=ctx.generated_groups_per_step * prefill_group,
        prefill_group_s=prefill_group + L.tool_tail_s,
        micro_count=full + (t_rest / t_full if t_full > 0 else 0.0), micro_s=t_full,
        aux_micro_s=t_aux, max_rank_s=max_rank,
        overhead_s=tm.sync_s(env.train_dp, spans) + tm.optimizer_s(), weight_sync_s=w,
        c_roll=c_roll, c_roll_in=c_roll_in, c_train=c_train)


def _running(m: _Model, period: float, replicas: float) -> float:
    """Mean running sequences per replica at a steady period (Little's law), capped."""
    spare = replicas * period - m.tokens * m.beta
    if spare <= 0:
        return float(m.cap)
    return min(float(m.cap), m.tokens * m.a / spare)


def _fluid(m: _Model, replicas: float) -> float:
    return (m.tokens * (m.a + m.beta * m.cap) / m.cap + m.prefill_step_s) / replicas


def _queue(m: _Model, fluid: float, running: float, replicas: float) -> float:
    """How long a batch's last group waits for a group slot after the batch is admitted:
    all of the fluid period when the pool is saturated, none when its free group slots
    hold the whole batch."""
    groups = m.responses / m.group_size
    free = replicas * m.group_slots * max(0.0, 1.0 - running / m.cap)
    return fluid * min(1.0, max(0.0, (groups - free) / groups))


def _held_tail(m: _Model, queue: float, step: float) -> float:
    """The closed form's tail: responses started over the ``queue`` window finish
    ``step * staggered(queue / step)`` after it closes, at the steady state's step (the
    recurrence, ``pipeline``, drains it instead: ``_tail``)."""
    return step * m.staggered(queue / step) + m.prefill_group_s


def _tail(m: _Model, queue: float, step: float,
          windows: tuple[tuple[float, float, float], ...], replicas: float = 1.0) -> float:
    """From the last group's start to the batch's last response.

    Its longest response has ``X = staggered(queue / step)`` decode steps left (responses
    started over the ``queue`` window); each step costs ``a + beta b`` at the replica's
    running load ``b``, which falls as the batch drains unless other groups refill the
    slots.  ``b`` over the tail = tokens decoded in it by every batch in flight, per
    replica, over ``X`` (``residual.Residual``); ``windows``: ``(first, last, responses per
    replica)``, each batch's group starts in seconds from the last group's start (negative:
    before it).
    The batch is complete when the slowest of the ``replicas`` it runs on has drained:
    their loads are sums of independent lengths, so the slowest decodes ``e_N sigma`` more
    tokens than the mean (``e_N`` the expected maximum of ``N`` standard normals, ``sigma``
    from the lengths' coefficient of variation).  The tail is the fixed point
    ``T = X (a + beta b(T))`` from ``T = X step``: starts before the tail opens become
    decode steps at ``step`` (the load they ran at), starts inside it at ``T / X``.
    (Holding the step at its value at admission under-predicted few, wide replicas by up
    to 14 %: their fixed part ``a`` is large, so a drained step is much shorter.)
    """
    return _drain(m, m.staggered(queue / step), step, windows, replicas)


def _drain(m: _Model, x: float, step: float, windows: tuple[tuple[float, float, float], ...],
           replicas: float = 1.0) -> float:
    """``_tail`` for a longest response with ``x`` decode steps left."""
    if x <= 0:
        return m.prefill_group_s
    spread = _expected_max_normal(replicas) * m.residual.cv
    lo, hi, n = _split(np.asarray(windows, dtype=float).reshape(-1, 3))
    past = hi <= 0  # starts before the tail opens: decode steps at ``step``, fixed
    y = m.residual.in_window(x, lo[past] / step, hi[past] / step)
    fixed = (float(n[past] @ y), float(n[past] @ (y * y)))
    later, t = ~past, x * step
    for _ in range(_TAIL_ITERATIONS if later.any() else 1):
        sec = t / x  # starts inside the tail: at its mean step
        y = m.residual.in_window(x, lo[later] / sec, hi[later] / sec)
        first, second = fixed[0] + float(n[later] @ y), fixed[1] + float(n[later] @ (y * y))
        tokens = first + spread * math.sqrt(second)  # + the slowest replica's excess
        t = x * (m.a + m.beta * min(m.full_running, tokens / x))
    return t + m.prefill_group_s


def _split(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows ``(first, last, responses)`` as arrays, each window across the tail's
    opening cut in two at it, its responses shared by its span on either side."""
    lo, hi, n = w[:, 0], w[:, 1], w[:, 2]
    across = (lo < 0) & (hi > 0)
    if not across.any():
        return lo, hi, n
    share = -lo[across] / (hi[across] - lo[across])
    keep = ~across
    return (np.concatenate((lo[keep], lo[across], np.zeros(len(share)))),
            np.concatenate((hi[keep], np.zeros(len(share)), hi[across])),
            np.concatenate((n[keep], n[across] * share, n[across] * (1 - share))))


_TAIL_ITERATIONS = 4


def _expected_max_normal(n: float) -> float:
    """``E[max]`` of ``n`` standard normals (Blom's approximation; 0 for one)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _feedable(m: _Model, env: Envelope, s: int) -> int:
    """Units the policy lends when the trainer starts waiting: ``ceil(queued / g)``, with
    ``queued = (s + 1) G - N g`` admissible groups beyond the primaries' group slots."""
    queued = (s + 1) * m.responses / m.group_size - env.rollout_replicas * m.group_slots
    if queued <= 0 or not env.borrowable_replicas:
        return 0
    return min(env.borrowable_replicas, math.ceil(queued / m.group_slots - 1e-9))


def _aux_theta(m: _Model, env: Envelope, idle: float) -> float:
    """The step with auxiliary trainers on an ``idle`` share of the replicas: micro-batches
    split by rate (``r_p = dp / t_micro``, ``r_a`` of the auxiliaries), each auxiliary
    paying ``C_in + C_grad``."""
    rate_p = env.train_dp / m.micro_s
    rate_a = env.aux_trainer_ranks * idle / m.aux_micro_s
    return m.overhead_s + (m.micro_count + rate_a * m.c_train) / (rate_p + rate_a)
