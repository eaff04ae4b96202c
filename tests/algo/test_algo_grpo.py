"""GRPO advantages and the default loss against hand-computed values, and the token-level normalisation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bidirl.algo.aggregation import StepTotals
from bidirl.algo.grpo import group_advantages, group_advantages_lists, token_logprobs
from bidirl.algo.objective import LossSettings, policy_objective


def grpo_loss(logp, old, adv, mask, total_tokens, clip_eps_low=0.2, clip_eps_high=0.2, ref_logp_B_T=None,
              kl_coef=0.0):
    """The default objective (vanilla, token-mean) in the old ``grpo_loss``'s terms."""
    settings = LossSettings(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, kl_coef=kl_coef)
    return policy_objective(logp, old, adv, mask, StepTotals(total_tokens, logp.shape[0]), settings, ref_logp_B_T)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = group_advantages(rewards, eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # Bessel-corrected std of (1, 0, 0, 1) is sqrt(1/3)
    assert torch.allclose(adv[0], torch.tensor([a, -a, -a, a]))
    assert torch.equal(adv[1], torch.zeros(4))  # equal rewards: no signal, no NaN
    centred = group_advantages(rewards, scale_by_std=False)
    assert torch.allclose(centred[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_group_of_one_has_zero_advantage_and_ragged_groups():
    assert torch.equal(group_advantages(torch.tensor([[3.0], [1.0]])), torch.zeros(2, 1))
    out = group_advantages_lists([[1.0, 0.0], [2.0], [0.0, 0.0, 3.0]], eps=0.0)
    assert out[1] == [0.0]
    assert out[0][0] == pytest.approx(0.5 / math.sqrt(0.5))
    assert sum(out[2]) == pytest.approx(0.0, abs=1e-6)


@given(st.lists(st.floats(-10, 10), min_size=2, max_size=16))
@settings(max_examples=50, deadline=None)
def test_advantages_are_centred(rewards):
    adv = group_advantages(torch.tensor([rewards]))
    assert abs(float(adv.sum())) < 1e-3 * len(rewards)


def _case():
    logp = torch.tensor([[0.1, -0.5]])
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    return logp, old, mask


def test_loss_positive_advantage_hand_computed():
    logp, old, mask = _case()
    out = grpo_loss(logp, old, torch.tensor([1.0]), mask, total_tokens=2)
    # ratios e^0.1 = 1.10517 (inside the clip range), e^-0.5 = 0.60653 (below 0.8, but the
    # min picks the unclipped term for A > 0)
    expected = -(math.exp(0.1) + math.exp(-0.5)) / 2
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)
    assert float(out.metrics["clip_frac"]) == 0.0


def test_loss_negative_advantage_is_clipped():
    logp, old, mask = _case()
    out = grpo_loss(logp, old, torch.tensor([-1.0]), mask, total_tokens=2)
    # A < 0: token 2 takes the clipped ratio 0.8 -> per-token losses (1.10517, 0.8)
    assert float(out.loss) == pytest.approx((math.exp(0.1) + 0.8) / 2, rel=1e-6)
    assert float(out.metrics["clip_frac"]) == pytest.approx(0.5)
    # the clipped token contributes no gradient
    logp.requires_grad_(True)
    grpo_loss(logp, old, torch.tensor([-1.0]), mask, total_tokens=2).loss.backward()
    assert logp.grad[0, 1] == 0.0
    assert logp.grad[0, 0] == pytest.approx(math.exp(0.1) / 2, rel=1e-6)


def test_asymmetric_clip_and_kl_term():
    logp, old, mask = _case()
    ref = torch.zeros(1, 2)
    out = grpo_loss(logp, old, torch.tensor([1.0]), mask, 2, clip_eps_low=0.2, clip_eps_high=0.05,
                    ref_logp_B_T=ref, kl_coef=0.1)
    # A > 0 with eps_high 0.05: token 1 ratio 1.10517 is clipped to 1.05
    k3 = [math.exp(-0.1) + 0.1 - 1, math.exp(0.5) - 0.5 - 1]
    expected = (-(1.05 + math.exp(-0.5)) + 0.1 * sum(k3)) / 2
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)
    assert float(out.metrics["kl_ref"]) == pytest.approx(sum(k3) / 2, rel=1e-6)


def test_mask_excludes_padding_even_if_infinite():
    logp = torch.tensor([[0.0, -float("inf")]])
    out = grpo_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]), 1)
    assert torch.isfinite(out.loss)
    assert float(out.loss) == pytest.approx(-1.0)


def test_microbatches_sum_to_the_full_batch_loss_and_gradient():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 9
    logits = torch.randn(B, T, 11, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (B, T), generator=g)
    old = token_logprobs(logits.detach() + 0.1 * torch.randn(B, T, 11, generator=g), targets)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    total = int(mask.sum())

    full = grpo_loss(token_logprobs(logits, targets), old, adv, mask, total).loss
    (grad_full,) = torch.autograd.grad(full, logits)
    parts, grad_sum = 0.0, torch.zeros_like(logits)
    for sl in (slice(0, 1), slice(1, 4), slice(4, 6)):  # uneven micro-batches
        part = grpo_loss(token_logprobs(logits[sl], targets[sl]), old[sl], adv[sl], mask[sl], total).loss
        (grad,) = torch.autograd.grad(part, logits)
        parts, grad_sum = parts + part, grad_sum + grad
    assert float(parts.detach()) == pytest.approx(float(full.detach()), rel=1e-6)
    assert torch.allclose(grad_sum, grad_full, atol=1e-7)


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 3, 7)
    targets = torch.randint(0, 7, (2, 3))
    ref = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), ref, atol=1e-6)


def test_bad_arguments_fail_loudly():
    logp, old, mask = _case()
    with pytest.raises(ValueError, match="total_tokens"):
        grpo_loss(logp, old, torch.tensor([1.0]), mask, 0)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, torch.tensor([1.0]), mask, 2, kl_coef=0.1)
    with pytest.raises(ValueError, match="2-D"):
        group_advantages(torch.ones(3))
