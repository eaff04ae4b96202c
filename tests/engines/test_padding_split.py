"""A micro-batch computed as length-sorted sub-batches: the cheapest grouping, the same gradient."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bidirl.engines.train_batch import TrainSample, padding_split
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer


def _cost(lengths, parts, overhead):
    return sum(len(p) * max(lengths[i] for i in p) + overhead for p in parts)


def _partitions(items):
    """Every set partition of ``items`` (brute force, for a handful)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first, *part[k]]] + part[k + 1:]
        yield [[first], *part]


@pytest.mark.parametrize("seed", range(12))
def test_the_split_is_the_cheapest_grouping_of_the_samples(seed):
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in rng.integers(1, 140, int(rng.integers(2, 8)))]
    overhead = int(rng.choice([0, 16, 64, 300]))
    parts = padding_split(lengths, overhead)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))  # each sample once
    flat = [i for p in parts for i in p]
    assert flat == sorted(range(len(lengths)), key=lambda i: (lengths[i], i))  # runs of the sorted order
    best = min(_cost(lengths, q, overhead) for q in _partitions(list(range(len(lengths)))))
    assert _cost(lengths, parts, overhead) == best
    assert padding_split(lengths, overhead) == parts  # a function of the lengths alone


def test_one_long_response_among_short_ones_is_split_off_and_none_keeps_the_batch():
    lengths = [20] * 15 + [140]
    parts = padding_split(lengths, 64)
    assert parts == [list(range(15)), [15]]  # 300 + 140 + 2 x 64 padded, against 2,240 + 64
    assert padding_split(lengths, 10_000) == [list(range(16))]  # a pass costs more than the padding
    assert padding_split([9, 3, 5], None) == [[0, 1, 2]]  # the micro-batch as it is, in its order
    with pytest.raises(ValueError, match="overhead_tokens"):
        padding_split([1, 2], -1)
    with pytest.raises(ValueError, match="padding_split_tokens"):
        TrainerConfig(padding_split_tokens=-1)


def test_a_split_micro_batch_has_the_gradient_and_metrics_of_the_whole_one(tiny_model_dir):
    rng = np.random.default_rng(3)
    samples = []
    for r in [2, 3, 40, 4, 5, 38, 3, 2]:  # two long responses: the split is not one batch
        samples.append(TrainSample(list(rng.integers(7, 135, 4)), list(rng.integers(7, 135, r)),
                                   list(rng.normal(-5, 0.1, r)), float(rng.normal())))
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    cfg = TrainerConfig(kl_coef=0.05, padding_split_tokens=8)
    assert len(padding_split(lengths, cfg.padding_split_tokens)) > 1
    whole = TorchTrainer(tiny_model_dir, dataclasses.replace(cfg, padding_split_tokens=None))
    split = TorchTrainer(tiny_model_dir, cfg)
    a = whole.compute_chunk_grads([samples], per_microbatch=True)
    b = split.compute_chunk_grads([samples], per_microbatch=True)
    for name, g in a.grads[0].items():
        assert np.allclose(g, b.grads[0][name], rtol=1e-4, atol=1e-7), name
    assert a.metrics.keys() == b.metrics.keys()
    for k, v in a.metrics.items():
        assert v == pytest.approx(b.metrics[k], rel=1e-4, abs=1e-7), k
