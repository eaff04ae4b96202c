"""Training batches: groups in group-id order, packed into micro-batches by tokens.

A batch is assembled from its groups in group-id order (never completion order), and
micro-batches are cut from its samples in that order, so the same run always trains the
same micro-batches and chunking them among executors cannot change the update.

The cut is made from the batch's end, so the one short micro-batch that a cut leaves over
is the step's *first*.  Auxiliary trainers take their chunks from the tail
(``split.plan_chunks``, ``split.steal_schedule``): with the remainder last, a one-micro-batch
chunk was often a sliver of a micro-batch, and the next size up more than the rollout
device's idle time could hold.  Measured in the simulator on the calibrated scenarios of
twelve kept real ``bidirl`` runs (three of each workload of ``bench/real_policies.py``):
train-heavy +1.1-3.4 %, rollout-heavy +0.8 %, balanced -2.1 to +2.5 %, shifting unchanged;
``async`` unchanged (the same work).  BENCHMARKS.md has the real runs.  The cut depends on
the batch alone, never on who computes what.
"""

from __future__ import annotations

from collections.abc import Iterable

from bidirl.controller.actions import MicroBatch


def pack_micro_batches(groups: Iterable[tuple[int, ...]], prompt_tokens: int,
                       target_tokens: int, max_samples: int | None = None) -> list[MicroBatch]:
    """Cut samples (prompt + response) into micro-batches of about ``target_tokens``, and of
    at most ``max_samples`` samples when given; the micro-batches are in sample order.

    A sample never splits.  Walking from the last sample back, a micro-batch closes before
    the sample that would take it over the target (a sample longer than the target gets a
    micro-batch of its own), or when it holds ``max_samples``; what is left over at the
    front is the first micro-batch (the module docstring says why).
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples={max_samples}; allowed: >= 1 or None")
    xs = [prompt_tokens + response for lengths in groups for response in lengths]
    back: list[MicroBatch] = []  # from the end of the batch
    tokens = squares = samples = 0
    for x in reversed(xs):
        if samples and (tokens + x > target_tokens or samples == max_samples):
            back.append(MicroBatch(tokens, squares / tokens, samples))
            tokens = squares = samples = 0
        tokens += x
        squares += x * x
        samples += 1
    if samples:
        back.append(MicroBatch(tokens, squares / tokens, samples))
    return back[::-1]
