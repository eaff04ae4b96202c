"""What data-parallel ranks add up: the step's totals before a step, gradients and metrics after it.

Every loss is divided by the step's global totals (:class:`~bidirl.algo.aggregation.StepTotals`,
summed over the ranks first), so the gradients all-reduce with SUM and DP=k reproduces DP=1
up to float rounding.  Metrics are sums over those totals too and add up the same way,
except those named ``*_max``, reduced with MAX.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bidirl.algo.aggregation import StepTotals
from bidirl.engines.train_batch import Microbatch, step_totals


def global_totals(microbatches: Sequence[Microbatch], process_group=None) -> StepTotals:
    """The whole step's totals: this rank's, summed over the DP group."""
    local = step_totals(microbatches)
    if process_group is None:
        return local
    import torch.distributed as dist

    t = torch.tensor(list(local), dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=process_group)
    return StepTotals(*(int(x) for x in t.tolist()))


def all_reduce_step(params: Sequence[torch.nn.Parameter], metrics: dict[str, float],
                    process_group=None) -> dict[str, float]:
    """SUM the gradients (already globally normalised) and metrics over the DP group; ``*_max`` by MAX."""
    import torch.distributed as dist

    if process_group is None or dist.get_world_size(process_group) == 1:
        return metrics
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=process_group)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    return reduce_metrics(metrics, process_group)


def reduce_metrics(metrics: dict[str, float], process_group=None) -> dict[str, float]:
    """SUM the step's metrics over the DP group, ``*_max`` by MAX (a sharded trainer's
    gradients are reduce-scattered apart: ``engines/sharding.py``)."""
    import torch.distributed as dist

    if process_group is None or dist.get_world_size(process_group) == 1:
        return metrics
    # A rank without micro-batches has no metrics: the ranks agree on the names first.
    names: list = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(names, sorted(metrics), group=process_group)
    keys = sorted(set().union(*names))
    summed = [k for k in keys if not k.endswith("_max")]
    maxed = [k for k in keys if k.endswith("_max")]
    flat = torch.tensor([metrics.get(k, 0.0) for k in summed], dtype=torch.float32)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=process_group)
    out = {k: float(v) for k, v in zip(summed, flat.tolist(), strict=True)}
    if maxed:
        peaks = torch.tensor([metrics.get(k, 0.0) for k in maxed], dtype=torch.float64)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX, group=process_group)
        out.update(zip(maxed, peaks.tolist(), strict=True))
    return out
