"""The default algorithm trains exactly as bidirl did before the registry: a trainer whose
objective is swapped for the frozen pre-registry ``grpo_loss`` ends two steps with the same
weights, bit for bit (KL term included)."""

from __future__ import annotations

import numpy as np
import torch
from grpo_reference import grpo_loss as grpo_loss_before

from bidirl.engines import trainer_torch
from bidirl.engines.train_batch import TrainSample, make_microbatches
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer


def _old_objective(logp, behaviour, adv, mask, totals, settings, ref_logp=None, entropy=None):
    return grpo_loss_before(logp, behaviour, adv, mask, totals.tokens, settings.clip_eps_low, settings.clip_eps_high,
                            ref_logp, settings.kl_coef)


def test_the_default_update_is_the_pre_registry_update(tiny_model_dir, monkeypatch):
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(6):
        r = int(rng.integers(2, 15))
        samples.append(TrainSample(list(rng.integers(7, 135, 4)), list(rng.integers(7, 135, r)),
                                   list(rng.normal(-3, 0.5, r)), float(rng.normal()),
                                   ref_logprobs=list(rng.normal(-3, 0.5, r))))
    mbs = make_microbatches(samples, 2)
    cfg = TrainerConfig(lr=1e-3, kl_coef=0.05)
    now = TorchTrainer(tiny_model_dir, cfg)
    for _ in range(2):
        now.train_step(mbs)
    monkeypatch.setattr(trainer_torch, "policy_objective", _old_objective)
    before = TorchTrainer(tiny_model_dir, cfg)
    for _ in range(2):
        before.train_step(mbs)
    assert all(torch.equal(p, before.params[n]) for n, p in now.params.items())
