"""Loss aggregation: per-token losses to the step's scalar, whatever the micro-batch split (pure torch).

Notation: ``loss[b, t]`` the loss of response token t of sequence b, ``n_b`` the response
tokens of sequence b, over the *whole step* (every micro-batch, data-parallel rank and
gradient chunk): ``N`` response tokens, ``S`` sequences (those with at least one token),
``T`` a constant length (``loss_scale_factor``)::

    token-mean                L = sum_b sum_t loss[b, t] / N
    seq-mean-token-sum        L = sum_b (sum_t loss[b, t]) / S
    seq-mean-token-mean       L = sum_b (sum_t loss[b, t] / n_b) / S
    seq-mean-token-sum-norm   L = sum_b (sum_t loss[b, t]) / (S * T)

Every mode is a sum over sequences of a term that needs only its own sequence, divided
by a constant of the step (``N``, ``S``, ``S * T``).  So a micro-batch computes its own
sum over the step's constant (:class:`StepTotals`, counted once for the step and passed
to every micro-batch, chunk and rank), and the step's gradient is exactly the sum of the
micro-batch gradients: borrowing (chunks computed elsewhere, merged in order) and data
parallelism (all-reduce with SUM) do not change what is optimised.  A sequence is never
split across micro-batches, so ``n_b`` is always whole.  A normaliser counted per
micro-batch instead (a mean of means) would weight short micro-batches more and make the
update depend on the split.

``seq-mean-token-sum-norm`` is Dr.GRPO's: a mean over responses of their token sum over
a generation budget ``T`` (TRL's ``dr_grpo``: ``max_completion_length``); veRL divides
each micro-batch's token sum by ``T`` and then scales by its gradient-accumulation count,
which is this up to a constant factor.

Metrics that are token sums over ``N`` add up over micro-batches too; a metric named
``*_max`` is merged by max instead (:func:`merge_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

from bidirl.algo.registry import choose


class StepTotals(NamedTuple):
    """The normalisers of a whole step, passed to every micro-batch of it."""

    tokens: int
    """Response tokens of the step (``N``)."""
    sequences: int
    """Responses of the step with at least one token (``S``)."""

    @classmethod
    def of(cls, response_lengths: Iterable[int]) -> StepTotals:
        lengths = list(response_lengths)
        return cls(sum(lengths), sum(1 for n in lengths if n > 0))

    def plus(self, other: StepTotals) -> StepTotals:
        return StepTotals(self.tokens + other.tokens, self.sequences + other.sequences)


def _token_mean(loss_B_T, mask_B_T, on_B_T, totals: StepTotals, scale: float | None):
    """sum of token losses / N (the expression bidirl has always used, kept bit for bit)."""
    return torch.where(on_B_T, loss_B_T * mask_B_T, 0.0).sum() / totals.tokens


def _seq_token_sums(loss_B_T, mask_B_T, on_B_T):
    return torch.where(on_B_T, loss_B_T * mask_B_T, 0.0).sum(dim=-1)


def _seq_mean_token_sum(loss_B_T, mask_B_T, on_B_T, totals: StepTotals, scale: float | None):
    """sum over sequences of (token sum) / S."""
    return _seq_token_sums(loss_B_T, mask_B_T, on_B_T).sum() / totals.sequences


def _seq_mean_token_mean(loss_B_T, mask_B_T, on_B_T, totals: StepTotals, scale: float | None):
    """sum over sequences of (token sum / n_b) / S; a sequence without tokens adds 0."""
    n_B = mask_B_T.sum(dim=-1).clamp(min=1.0)
    return (_seq_token_sums(loss_B_T, mask_B_T, on_B_T) / n_B).sum() / totals.sequences


def _seq_mean_token_sum_norm(loss_B_T, mask_B_T, on_B_T, totals: StepTotals, scale: float | None):
    """sum over sequences of (token sum) / (S * T), T = ``loss_scale_factor``."""
    if scale is None:
        raise ValueError("loss_agg_mode seq-mean-token-sum-norm needs loss_scale_factor (the constant length T)")
    return _seq_token_sums(loss_B_T, mask_B_T, on_B_T).sum() / (totals.sequences * scale)


AGGREGATIONS = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(loss_B_T: torch.Tensor, mask_B_T: torch.Tensor, mode: str, totals: StepTotals,
              loss_scale_factor: float | None = None) -> torch.Tensor:
    """This micro-batch's share of the step's loss under ``mode`` (see the module doc).

    ``mask_B_T`` is 1 on response tokens, 0 on prompt and padding positions (whose losses
    may be anything, even NaN or inf: they are never multiplied, only dropped).
    """
    fn = choose("loss_agg_mode", mode, AGGREGATIONS)
    if totals.tokens <= 0 or totals.sequences <= 0:
        raise ValueError(f"the step's totals must be > 0, got {totals}")
    mask_B_T = mask_B_T.to(loss_B_T.dtype)
    return fn(loss_B_T, mask_B_T, mask_B_T > 0, totals, loss_scale_factor)


def merge_metrics(into: dict[str, float], new: Mapping[str, float]) -> dict[str, float]:
    """Add ``new`` into ``into`` (token sums over the step's totals add up); ``*_max`` by max."""
    for k, v in new.items():
        if k.endswith("_max"):
            into[k] = max(into[k], v) if k in into else v
        else:
            into[k] = into.get(k, 0.0) + v
    return into


def merge_all(metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in metrics:
        merge_metrics(out, m)
    return out
