"""Training batches: groups in group-id order, packed into micro-batches by tokens.

A batch is assembled from its groups in group-id order (never completion order), and
micro-batches are cut from its samples in that order, so the same run always trains the
same micro-batches and chunking them among executors cannot change the update.
"""

from __future__ import annotations

from collections.abc import Iterable

from bidirl.controller.actions import MicroBatch


def pack_micro_batches(groups: Iterable[tuple[int, ...]], prompt_tokens: int,
                       target_tokens: int, max_samples: int | None = None) -> list[MicroBatch]:
    """Cut samples (prompt + response) into micro-batches of about ``target_tokens``, and of
    at most ``max_samples`` samples when given.

    A sample never splits; a micro-batch closes before the sample that would take it
    over the target (a sample longer than the target gets a micro-batch of its own), or
    when it holds ``max_samples``.
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples={max_samples}; allowed: >= 1 or None")
    out: list[MicroBatch] = []
    tokens = squares = samples = 0
    for lengths in groups:
        for response in lengths:
            x = prompt_tokens + response
            if samples and (tokens + x > target_tokens or samples == max_samples):
                out.append(MicroBatch(tokens, squares / tokens, samples))
                tokens = squares = samples = 0
            tokens += x
            squares += x * x
            samples += 1
    if samples:
        out.append(MicroBatch(tokens, squares / tokens, samples))
    return out
