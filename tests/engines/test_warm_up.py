"""TorchTrainer.warm_up: the start-up pass learns nothing and changes no later update."""

from __future__ import annotations

import pytest
import torch
from test_engines_trainer import _samples

from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer

CFG = TrainerConfig(lr=1e-3, max_grad_norm=1.0, kl_coef=0.05)  # the KL term: the reference forward warms too


def _steps(tr: TorchTrainer, samples, n: int = 2) -> list[dict]:
    out = []
    for _ in range(n):
        chunk = tr.compute_chunk_grads([samples[:4], samples[4:]])
        out.append(tr.apply_grads([chunk]))
    return out


def test_a_warmed_up_trainer_trains_bit_for_bit_like_a_cold_one(tiny_model_dir):
    samples = _samples(tiny_model_dir, 8)
    cold, warm = TorchTrainer(tiny_model_dir, CFG, seed=3), TorchTrainer(tiny_model_dir, CFG, seed=3)
    rng = torch.random.get_rng_state()
    seconds = warm.warm_up(samples=4, prompt_tokens=9, response_tokens=21)
    assert seconds > 0
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert warm.version == 0 and not warm.optimizer.state
    assert all(p.grad is None for p in warm.params.values())
    assert all(torch.equal(p, cold.params[n]) for n, p in warm.params.items())
    m_cold, m_warm = _steps(cold, samples), _steps(warm, samples)
    assert all(torch.equal(p, cold.params[n]) for n, p in warm.params.items())
    assert [m["loss"] for m in m_warm] == [m["loss"] for m in m_cold]
    assert warm.version == cold.version == 2


@pytest.mark.parametrize("shape", [(0, 8, 8), (4, 0, 8), (4, 8, 0)])
def test_warm_up_refuses_an_empty_shape(tiny_model_dir, shape):
    tr = TorchTrainer(tiny_model_dir, TrainerConfig())
    with pytest.raises(ValueError, match="samples, prompt_tokens and response_tokens >= 1"):
        tr.warm_up(*shape)
