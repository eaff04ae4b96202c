"""Hot-switch compatibility: which envelopes the runtime can actually run and borrow in.

An envelope is kept only if all of these hold (each failure is reported as a
``Rejection`` whose ``reason`` names the constraint and the numbers):

``node_alignment``  a rollout replica, a trainer tensor-parallel group, a borrowed replica
                    and an auxiliary trainer group never span nodes unless they are a
                    whole multiple of a node and start on a node boundary (rollout pool on
                    devices ``0..R-1``, training pool after it, as ``Envelope`` lays out);
``rollout_memory``  a replica holds its weights shard and the KV cache of at least one
                    prompt group (``group_size`` sequences) at the longest context
                    (prompt + max response), so no admitted group can be starved of KV;
``train_memory``    the primary trainer fits (DDP if it does, else FSDP over dp);
``roll_on_train``   the training pool can host whole rollout replicas: ``rollout_tp``
                    divides ``train_devices`` (devices are the same hardware, so the
                    replica's memory check above also holds there), and the trainer state a
                    lent device parks fits in host memory;
``train_on_roll``   one rollout replica's devices (the unit the runtime lends: a replica
                    is whole or not at all) host an auxiliary trainer for one micro-batch,
                    its params and fp32 gradients sharded over the ``rollout_tp`` devices;
                    the weights a lent rollout device parks fit in host memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bidirl.perf.profiles import GIB
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope
from bidirl.planner.memory import (
    MemoryNeed,
    aux_trainer_need,
    host_bytes,
    rollout_concurrency,
    rollout_need,
    rollout_offload_bytes,
    trainer_need,
    trainer_offload_bytes,
)


@dataclass(frozen=True)
class Rejection:
    envelope: Envelope
    constraint: str
    reason: str
    needed_bytes: float = 0.0  # per device, for memory constraints
    available_bytes: float = 0.0

    def to_json(self) -> dict:
        return {"envelope": self.envelope.to_json(), "constraint": self.constraint,
                "reason": self.reason}


def first_misaligned(start: int, size: int, count: int, per_node: int) -> int | None:
    """The first device of the first group that breaks node alignment, or None."""
    if count <= 0:
        return None
    if size % per_node == 0:
        return None if start % per_node == 0 else start
    # Offsets modulo a node repeat every lcm(size, per_node) / size groups.
    for i in range(min(count, math.lcm(size, per_node) // size)):
        first = start + i * size
        if first // per_node != (first + size - 1) // per_node:
            return first
    return None


def _misaligned(what: str, start: int, size: int, per_node: int) -> str:
    return (f"node_alignment: {what} of {size} devices starting at device {start} would span "
            f"nodes of {per_node} devices (a group must fit in one node or be a whole "
            f"multiple of a node on a node boundary)")


def _memory_rejection(env: Envelope, constraint: str, need: MemoryNeed,
                      extra: str = "") -> Rejection:
    return Rejection(env, constraint, f"{constraint}: {need.describe()}{extra}",
                     need.total, need.budget)


def _check_alignment(ctx: PlanContext, env: Envelope) -> Rejection | None:
    n = ctx.hw.devices_per_node
    r, t = env.rollout_tp, env.train_tp
    checks = (("rollout replica", 0, r, env.rollout_replicas),
              ("trainer tp group", env.rollout_devices, t, env.train_dp))
    for what, start, size, count in checks:
        bad = first_misaligned(start, size, count, n)
        if bad is not None:
            return Rejection(env, "node_alignment", _misaligned(what, bad, size, n))
    return None


def _trainer(ctx: PlanContext, env: Envelope) -> tuple[MemoryNeed, bool]:
    for sharded in (False, True):
        need = trainer_need(ctx.hw, ctx.model, env.train_dp, env.train_tp, sharded,
                            ctx.micro_memory_tokens)
        if need.fits:
            return need, sharded
    return need, True


def _aux_need(ctx: PlanContext, env: Envelope) -> MemoryNeed:
    """An auxiliary trainer on one lent rollout replica (its ``rollout_tp`` devices)."""
    r = env.rollout_tp
    return aux_trainer_need(ctx.hw, ctx.model, r, r, ctx.micro_memory_tokens)


def check_envelope(ctx: PlanContext, env: Envelope) -> Envelope | Rejection:
    """The envelope with its budgets sized, or the first constraint it breaks."""
    hw, m = ctx.hw, ctx.model
    bad = _check_alignment(ctx, env)
    if bad:
        return bad
    r = env.rollout_tp
    roll_min = rollout_need(hw, m, r, ctx.min_concurrency, ctx.max_context)
    if not roll_min.fits:
        return _memory_rejection(env, "rollout_memory", roll_min,
                                 f" (one prompt group of {ctx.min_concurrency} sequences "
                                 f"at the longest context)")
    train, sharded = _trainer(ctx, env)
    if not train.fits:
        return _memory_rejection(env, "train_memory", train)
    if env.train_devices % r:
        return Rejection(env, "roll_on_train",
                         f"roll_on_train: rollout_tp {r} does not divide train_devices "
                         f"{env.train_devices}: the training pool cannot host whole replicas")
    n = hw.devices_per_node
    bad = first_misaligned(env.rollout_devices, r, env.train_devices // r, n)
    if bad is not None:
        return Rejection(env, "node_alignment", _misaligned("borrowed rollout replica", bad, r, n))
    host = host_bytes(hw)
    parked = trainer_offload_bytes(train)
    if parked > host:
        return Rejection(env, "roll_on_train",
                         f"roll_on_train: a lent trainer device parks {parked / GIB:.2f} GiB "
                         f"(params + optimizer) > {host / GIB:.2f} GiB host memory per device",
                         parked, host)
    aux = _aux_need(ctx, env)
    if not aux.fits:
        return _memory_rejection(env, "train_on_roll", aux,
                                 f" (a lent rollout replica of {r} devices hosts it)")
    parked = rollout_offload_bytes(m, r)
    if parked > host:
        return Rejection(env, "train_on_roll",
                         f"train_on_roll: a lent rollout device parks {parked / GIB:.2f} GiB "
                         f"of weights > {host / GIB:.2f} GiB host memory per device",
                         parked, host)
    conc = rollout_concurrency(hw, m, r, ctx.plan_context)
    roll = rollout_need(hw, m, r, conc, ctx.plan_context)
    return replace(env, train_sharded=sharded, aux_group=r, rollout_concurrency=conc,
                   rollout_memory_bytes=roll.total, train_memory_bytes=train.total)


@dataclass(frozen=True)
class SplitFit:
    """What the memory model says of a committed split (``split_fit``)."""

    refusal: Rejection | None  # the role that does not fit at all, with its reason
    concurrency: int  # sequences one replica holds at the planned context (0: weights do not fit)
    aux_fits: bool  # a lent rollout replica can host an auxiliary trainer
    lend_fits: bool  # a train device can park its state in host memory and host a replica
    sharded: bool  # the trainer needs FSDP (DDP does not fit)


def split_fit(ctx: PlanContext, env: Envelope) -> SplitFit:
    """The memory checks of ``check_envelope`` for a split the user fixed.

    The simulator runs a fixed split only if its roles fit (``rollout_memory``,
    ``train_memory``: refused otherwise, with the reason), and lends a role only where it
    fits (``train_on_roll``: an auxiliary trainer on one replica's devices;
    ``roll_on_train``: the parked trainer state in host memory).  The planner keeps only
    envelopes where all of these hold, so both sides decide with one memory model.
    """
    hw, m, r = ctx.hw, ctx.model, env.rollout_tp
    refusal = None
    roll_min = rollout_need(hw, m, r, ctx.min_concurrency, ctx.max_context)
    if not roll_min.fits:
        refusal = _memory_rejection(env, "rollout_memory", roll_min,
                                    f" (one prompt group of {ctx.min_concurrency} sequences at the longest "
                                    "context)")
    train, sharded = _trainer(ctx, env)
    if refusal is None and not train.fits:
        refusal = _memory_rejection(env, "train_memory", train)
    host = host_bytes(hw)
    return SplitFit(
        refusal=refusal, concurrency=rollout_concurrency(hw, m, r, ctx.plan_context),
        aux_fits=_aux_need(ctx, env).fits and rollout_offload_bytes(m, r) <= host,
        lend_fits=trainer_offload_bytes(train) <= host and roll_min.fits, sharded=sharded)
