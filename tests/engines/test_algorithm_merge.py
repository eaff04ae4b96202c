"""Borrowing stays neutral under every algorithm: the ordered merge of chunks computed by
different trainers (the Trainer-on-RollPool path) equals one trainer's step bit for bit, for
each aggregation mode, GSPO, and the corrections, because every chunk divides by the whole
step's totals (``StepTotals``); with a chunk's own totals instead, a seq-mean mode would not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bidirl.algo.aggregation import StepTotals
from bidirl.algo.algorithm_config import AlgorithmConfig, RolloutCorrection
from bidirl.engines.train_batch import TrainSample, make_microbatches, step_totals
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer

CFG = TrainerConfig(lr=1e-3, max_grad_norm=1.0, kl_coef=0.05)

CASES = {
    "token-mean": AlgorithmConfig(),
    "seq-mean-token-sum": AlgorithmConfig(loss_agg_mode="seq-mean-token-sum"),
    "seq-mean-token-mean": AlgorithmConfig(loss_agg_mode="seq-mean-token-mean"),
    "seq-mean-token-sum-norm": AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=20),
    "gspo": AlgorithmConfig(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean"),
    "tis-entropy-kl": AlgorithmConfig(rollout_correction=RolloutCorrection("sequence", 1.5), entropy_coeff=0.01,
                                      kl_loss_type="low_var_kl"),
}


@pytest.fixture(scope="module")
def samples(tiny_model_dir) -> list[TrainSample]:
    """Responses of 1-19 tokens (so the seq-mean modes weigh them differently), behaviour and
    reference log-probs off the current policy (ratios != 1, clipped and truncated ones too)."""
    rng = np.random.default_rng(3)
    raw = []
    for _ in range(10):
        r = int(rng.integers(1, 20))
        raw.append(TrainSample(list(rng.integers(7, 135, int(rng.integers(2, 9)))), list(rng.integers(7, 135, r)),
                               [0.0] * r, float(rng.normal())))
    base = TorchTrainer(tiny_model_dir, TrainerConfig()).compute_logprobs(raw)
    return [TrainSample(s.prompt_ids, s.response_ids, list(lp + rng.normal(0, 0.3, lp.shape)), s.advantage,
                        ref_logprobs=list(lp + rng.normal(0, 0.1, lp.shape))) for s, lp in zip(raw, base)]


def _same(a: TorchTrainer, b: TorchTrainer) -> bool:
    return all(torch.equal(p, b.params[n]) for n, p in a.params.items())


@pytest.mark.parametrize("case", list(CASES))
def test_chunks_merged_in_order_equal_one_trainer_bitwise(tiny_model_dir, samples, case):
    algorithm = CASES[case]
    mbs = make_microbatches(samples, 3)  # 4 micro-batches: 3, 3, 3, 1 samples
    alone = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    m_alone = alone.train_step(mbs)
    primary, aux = (TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm) for _ in range(2))
    totals = step_totals(mbs)
    m_merged = primary.apply_grads([primary.compute_chunk_grads(mbs[:1], totals),
                                    aux.compute_chunk_grads(mbs[1:], totals)])
    assert _same(alone, primary), case
    assert m_merged["loss"] == pytest.approx(m_alone["loss"], rel=1e-5, abs=1e-7)
    assert m_merged["rollout_is_max"] == m_alone["rollout_is_max"]
    fresh = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    assert not _same(alone, fresh), "the step must move the weights"


def test_a_chunks_own_totals_would_change_a_seq_mean_update(tiny_model_dir, samples):
    algorithm = CASES["seq-mean-token-mean"]
    mbs = make_microbatches(samples, 3)
    alone = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    alone.train_step(mbs)
    wrong, aux = (TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm) for _ in range(2))
    wrong.apply_grads([wrong.compute_chunk_grads(mbs[:1], step_totals(mbs[:1])),
                       aux.compute_chunk_grads(mbs[1:], step_totals(mbs[1:]))])
    assert not _same(alone, wrong)
    assert step_totals(mbs) == StepTotals(sum(len(s.response_ids) for s in samples), len(samples))


def _trajectories(samples: list[TrainSample], seed: int, noise: float = 0.0) -> list[TrainSample]:
    """The samples as multi-turn trajectories: a run of environment tokens masked out in the
    middle of each response of 4 tokens or more (``noise`` perturbs their behaviour and
    reference log-probs, which must not matter)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in samples:
        n = len(s.response_ids)
        mask = [1] * n
        if n >= 4:
            mask[n // 3: 2 * n // 3] = [0] * (2 * n // 3 - n // 3)
        bump = [noise * float(rng.normal()) * (1 - m) for m in mask]
        out.append(TrainSample(s.prompt_ids, s.response_ids, [a + b for a, b in zip(s.behaviour_logprobs, bump)],
                               s.advantage, ref_logprobs=[a + b for a, b in zip(s.ref_logprobs, bump)],
                               loss_mask=mask))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_trajectories_merge_bitwise_and_their_environment_tokens_never_train(tiny_model_dir, samples, case):
    """Multi-turn: the merge of chunks equals one trainer bit for bit with environment tokens
    masked, and what the masked tokens' log-probs say changes nothing; the totals count the
    model's tokens only."""
    algorithm = CASES[case]
    mbs = make_microbatches(_trajectories(samples, 0), 3)
    alone = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    alone.train_step(mbs)
    primary, aux = (TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm) for _ in range(2))
    totals = step_totals(mbs)
    primary.apply_grads([primary.compute_chunk_grads(mbs[:1], totals), aux.compute_chunk_grads(mbs[1:], totals)])
    assert _same(alone, primary), case
    noisy = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    noisy.train_step(make_microbatches(_trajectories(samples, 1, noise=2.0), 3))
    assert _same(alone, noisy), "a masked token's log-probs reached the update"
    unmasked = TorchTrainer(tiny_model_dir, CFG, algorithm=algorithm)
    unmasked.train_step(make_microbatches(samples, 3))
    assert not _same(alone, unmasked)
    masked = sum(sum(s.loss_mask) for mb in mbs for s in mb)
    assert totals == StepTotals(masked, len(samples)) and masked < sum(len(s.response_ids) for s in samples)
