"""Simulated training step: primary data-parallel ranks, auxiliary chunks, ordered merge.

The primary deals its micro-batches round-robin to its ``dp`` ranks; every rank's time
is the sum of its micro-batch times (ground-truth ``TrainStageModel``, one noise draw per
rank).  An auxiliary trainer starts its chunk once it is up (after C_in), computes it as
one rank of ``rollout_tp`` devices and ships the gradient (C_grad).  The primary merges
the chunks in chunk order when the last one has arrived, then all-reduces over its ranks
(plus colocated ranks, for ``sync``) and steps the optimizer.

Measurements reach the controller when the real runtime would deliver them: ``train_micro``
as the primary's micro-batches finish (one per round of its ranks: at ``dp`` 1 the real
driver's one call per micro-batch), an auxiliary's ``aux_micro`` and C_grad when its chunk
arrives, the all-reduce once the merge is done.  A controller that saw the whole step's
times at its start would be clairvoyant: it lent replicas to a cold first step that the
real controller, waiting for the first micro-batch, does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bidirl.controller.actions import PRIMARY, StartTrainStep
from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import StageMeasured
from bidirl.policy.base import primary_ranks
from bidirl.sim.world import Truth


@dataclass
class AuxRun:
    unit: int
    start: float
    compute_end: float
    arrive: float
    colocated: bool


@dataclass
class StepTimeline:
    start: float
    primary_end: float
    merge_start: float
    end: float
    aux: list[AuxRun] = field(default_factory=list)
    rank_items: list[list[int]] = field(default_factory=list)  # each primary rank's micro-batches, in order
    rank_factor: list[float] = field(default_factory=list)  # each rank's noise draw
    primary_rounds: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)  # primary_micro_rounds
    measurements: list[tuple[float, StageMeasured]] = field(default_factory=list)  # (when, what), not primary
    sync_measurement: StageMeasured | None = None  # delivered when the merge is done
    device_seconds: float = 0.0  # ideal device-seconds of the step's micro-batches


def plan_step(a: StartTrainStep, now: float, spec: ClusterSpec, truth: Truth,
              ready_at: dict[int, float], colocated: set[int],
              noise: Callable[[], float]) -> StepTimeline:
    """When every part of step ``a`` happens (all times absolute)."""
    mbs, dp = a.micro_batches, spec.train_dp
    micro = micro_times(truth.train.micro.theta, mbs)
    aux_micro = micro_times(truth.aux.micro.theta, mbs)
    items = primary_ranks(a, dp)
    factor = [noise() for _ in range(dp)]
    ranks = [sum(micro[i] for i in idx) * f for idx, f in zip(items, factor)]
    tl = StepTimeline(now, now + max(ranks), 0.0, 0.0, rank_items=items, rank_factor=factor)
    tl.primary_rounds = primary_micro_rounds(tl, micro)
    merge_start = tl.primary_end
    computed, measured = 0.0, []  # one summed measurement for all aux chunks
    for chunk in a.chunks:
        if chunk.executor == PRIMARY or not chunk.micro_batches:
            continue
        u = chunk.executor
        start = max(now, ready_at.get(u, now))
        for i in chunk.micro_batches:
            measured.append(mbs[i])
        compute = sum(aux_micro[i] for i in chunk.micro_batches) * noise()
        computed += compute
        ship = 0.0 if u in colocated else truth.switch["train_on_roll.c_grad"] * noise()
        run = AuxRun(u, start, start + compute, start + compute + ship, u in colocated)
        tl.aux.append(run)
        if not run.colocated:
            tl.measurements.append((run.arrive, StageMeasured("train_on_roll.c_grad", (), ship)))
        merge_start = max(merge_start, run.arrive)
    if computed:
        last = max(r.compute_end for r in tl.aux)
        tl.measurements.insert(0, (last, StageMeasured("aux_micro", micro_features(measured), computed)))
    ranks_total = dp + sum(1 for r in tl.aux if r.colocated)
    wire = truth.train.grad_wire_s(ranks_total, spec.train_spans_nodes or ranks_total > dp)
    sync = truth.train.sync_s(ranks_total, spec.train_spans_nodes or ranks_total > dp) * noise()
    if ranks_total > 1:
        tl.sync_measurement = StageMeasured("train_sync", (1.0, wire), sync)
    tl.merge_start = merge_start
    tl.end = merge_start + sync + truth.step_overhead_s
    tl.device_seconds = sum(min(spec.train_tp * p, spec.rollout_tp * q)
                            for p, q in zip(micro, aux_micro))
    return tl


def primary_micro_rounds(tl: StepTimeline, micro: list[float]) -> list[tuple[float, list[tuple[int, float]]]]:
    """``(end, [(micro-batch, seconds), ...])`` for each round of the primary's micro-batches:
    the k-th of every rank, ending when the slowest rank has done its k-th.  At ``dp`` 1 a
    round is one call, as the real driver measures it; at cluster scale one summed
    measurement per round keeps the events at the rounds' count, not the calls'."""
    ends: dict[int, float] = {}
    rounds: dict[int, list[tuple[int, float]]] = {}
    for idx, f in zip(tl.rank_items, tl.rank_factor):
        t = tl.start
        for k, i in enumerate(idx):
            t += micro[i] * f
            ends[k] = max(ends.get(k, t), t)
            rounds.setdefault(k, []).append((i, micro[i] * f))
    return [(ends[k], rounds[k]) for k in sorted(rounds)]


def micro_features(mbs) -> tuple[float, float, float]:
    """The ``train_micro`` / ``aux_micro`` features of micro-batches computed together:
    (count, tokens, sum of tokens x seq_len); a linear model, so sums are exact."""
    mbs = list(mbs)
    return (float(len(mbs)), float(sum(mb.tokens for mb in mbs)),
            float(sum(mb.tokens * mb.seq_len for mb in mbs)))


def micro_times(theta, mbs) -> list[float]:
    """``TrainStageModel.microbatch_s`` for many micro-batches (same linear features)."""
    a, c, q = theta
    return [a + c * mb.tokens + q * mb.tokens * mb.seq_len for mb in mbs]

