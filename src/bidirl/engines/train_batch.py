"""What the torch trainer trains on: samples, micro-batches, collated tensors, gradient chunks.

Split from ``trainer_torch`` so that the trainer module holds only the model, the
optimizer and the gradient arithmetic; these are the data that cross process boundaries
(``TrainSample``, ``GradChunk``) and the padding that turns samples into tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bidirl.algo.aggregation import StepTotals


@dataclass(frozen=True)
class TrainSample:
    """One response to train on; ``behaviour_logprobs`` come from the engine that sampled it."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    advantage: float
    ref_logprobs: Sequence[float] | None = None
    images: tuple[bytes, ...] = ()
    """The prompt's images, encoded; ``prompt_ids`` then hold each one's placeholder expanded
    to its tokens, and the trainer runs the model's image processor on them."""
    loss_mask: Sequence[int] | None = None
    """A multi-turn trajectory's mask over ``response_ids``: 1 on the model's tokens, 0 on the
    environment's (which condition the model but never train); None: every token trains."""

    def __post_init__(self):
        if self.loss_mask is not None and len(self.loss_mask) != len(self.response_ids):
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {len(self.response_ids)} "
                             "response tokens; they must match")
        if len(self.behaviour_logprobs) != len(self.response_ids):
            raise ValueError(
                f"behaviour_logprobs has {len(self.behaviour_logprobs)} entries for "
                f"{len(self.response_ids)} response tokens; they must match"
            )
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty (the first response token needs a context)")


Microbatch = Sequence[TrainSample]


def make_microbatches(samples: Sequence[TrainSample], micro_batch_size: int) -> list[list[TrainSample]]:
    """Split samples, in order, into micro-batches of at most ``micro_batch_size``."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size}; allowed: >= 1")
    return [list(samples[i : i + micro_batch_size]) for i in range(0, len(samples), micro_batch_size)]


def padding_split(lengths: Sequence[int], overhead_tokens: int | None) -> list[list[int]]:
    """Sub-batches of one micro-batch (indices into ``lengths``) that waste little on padding.

    A padded batch costs its samples x its longest sequence, so a micro-batch of one
    128-token response and fifteen 20-token ones costs 2,048 tokens of work for 428 real
    ones.  This returns the grouping of the samples, sorted by length (ties by index), into
    runs that minimises the padded tokens plus ``overhead_tokens`` per sub-batch (what one
    more forward and backward pass costs, in tokens).  ``None``: the micro-batch as it is,
    in its own order (one padded batch).  Deterministic: a function of the lengths alone.
    """
    if overhead_tokens is None or len(lengths) <= 1:
        return [list(range(len(lengths)))]
    if overhead_tokens < 0:
        raise ValueError(f"overhead_tokens={overhead_tokens}; allowed: >= 0 or None")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    x = [lengths[i] for i in order]
    best = [0] + [0] * len(x)  # best[j]: cheapest cost of the first j sorted samples
    cut = [0] * (len(x) + 1)
    for j in range(1, len(x) + 1):
        costs = [best[i] + (j - i) * x[j - 1] + overhead_tokens for i in range(j)]
        cut[j] = min(range(j), key=lambda i: (costs[i], i))  # ties: the longer last run
        best[j] = costs[cut[j]]
    parts, j = [], len(x)
    while j > 0:
        parts.append(order[cut[j]:j])
        j = cut[j]
    return parts[::-1]


def trained(s: TrainSample) -> int:
    """Response tokens ``s`` trains on (a trajectory's model tokens; else all of them)."""
    return len(s.response_ids) if s.loss_mask is None else int(sum(s.loss_mask))


def count_tokens(microbatches: Iterable[Microbatch]) -> int:
    """Response tokens trained on in these micro-batches: the token-mean loss denominator."""
    return sum(trained(s) for mb in microbatches for s in mb)


def step_totals(microbatches: Iterable[Microbatch]) -> StepTotals:
    """The loss normalisers of these micro-batches taken as a whole step (tokens, sequences)."""
    return StepTotals.of(trained(s) for mb in microbatches for s in mb)


@dataclass
class GradChunk:
    """Gradients of a run of consecutive micro-batches, ready to ship to the primary."""

    grads: list[dict[str, np.ndarray]]
    """Flat fp32 gradients: one dict per micro-batch (per_microbatch) or one pre-summed dict."""
    num_tokens: int
    """Response tokens covered by this chunk (information; the loss used the batch total)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Loss metrics over the step's totals: chunk values add up to batch means (``*_max``: max)."""
    version: int = 0
    """Weights version the gradients were computed with."""


@dataclass
class Collated:
    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    targets_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    old_logp_B_T: torch.Tensor
    ref_logp_B_T: torch.Tensor | None
    adv_B: torch.Tensor
    spans: list[tuple[int, int]]
    """(first target index, length) of each sample's response in the T axis."""
    images: list[tuple[bytes, ...]] = field(default_factory=list)
    """Each sample's images (``engines/vision_inputs.py`` turns them into the model's inputs)."""


def collate(samples: Microbatch, pad_id: int, device: str = "cpu") -> Collated:
    """Right-pad prompt+response sequences; targets are shifted by one (T = L - 1)."""
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    L = max(len(q) for q in seqs)
    B = len(samples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L - 1), dtype=torch.float32)
    old = torch.zeros((B, L - 1), dtype=torch.float32)
    has_ref = all(s.ref_logprobs is not None for s in samples)
    ref = torch.zeros((B, L - 1), dtype=torch.float32) if has_ref else None
    spans = []
    for b, (seq, s) in enumerate(zip(seqs, samples, strict=True)):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[b, : len(seq)] = 1
        start, n = len(s.prompt_ids) - 1, len(s.response_ids)
        mask[b, start : start + n] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float32)
        old[b, start : start + n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
        if ref is not None:
            ref[b, start : start + n] = torch.tensor(s.ref_logprobs, dtype=torch.float32)
        spans.append((start, n))
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return Collated(
        to(input_ids), to(attention), to(input_ids[:, 1:].contiguous()), to(mask), to(old), to(ref),
        to(adv), spans, [tuple(s.images) for s in samples],
    )
