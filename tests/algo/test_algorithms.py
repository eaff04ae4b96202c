"""Each algorithm choice against a hand-computed reference on a tiny batch, the default
objective against the loss bidirl trained with before the registry, bit for bit, and the
registry's names and errors."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from grpo_reference import grpo_loss as grpo_loss_before

from bidirl.algo import advantages, aggregation, policy_loss, registry
from bidirl.algo.aggregation import StepTotals, aggregate, merge_metrics
from bidirl.algo.algorithm_config import AlgorithmConfig, FilterGroups
from bidirl.algo.grpo import group_advantages_lists, token_logprobs
from bidirl.algo.objective import LossSettings, policy_objective
from bidirl.algo.reward_shaping import overlong_penalty


def test_the_tables_hold_the_registry_names():
    assert tuple(advantages.ESTIMATORS) == registry.ADV_ESTIMATORS
    assert tuple(policy_loss.POLICY_LOSSES) == registry.POLICY_LOSSES
    assert tuple(aggregation.AGGREGATIONS) == registry.LOSS_AGG_MODES
    assert tuple(policy_loss.KL_PENALTIES) == registry.KL_LOSS_TYPES


def test_an_unknown_name_is_one_line_listing_the_choices():
    with pytest.raises(registry.UnknownChoice) as e:
        advantages.step_advantages([[1.0, 0.0]], [[1, 1]], SimpleNamespace(adv_estimator="gae"))
    with pytest.raises(ValueError, match=r"^loss_agg_mode: unknown 'seq-sum'; choices: token-mean, "
                                         r"seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm$"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "seq-sum", StepTotals(1, 1))
    with pytest.raises(ValueError, match="^policy_loss: unknown 'ppo'; choices: vanilla, gspo$"):
        policy_objective(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), StepTotals(1, 1),
                         LossSettings(policy_loss="ppo"))
    with pytest.raises(ValueError, match="must be one of grpo, rloo"):
        AlgorithmConfig(adv_estimator="gae")
    assert str(e.value) == ("adv_estimator: unknown 'gae'; choices: grpo, rloo, reinforce_plus_plus, "
                            "reinforce_plus_plus_baseline")


# -- advantages ------------------------------------------------------------------------------

REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5], [2.0]]
LENGTHS = [[3, 1, 2, 2], [1, 4, 1], [5]]


def test_grpo_is_bidirls_group_normalisation_bit_for_bit_and_dr_grpo_drops_the_std():
    assert advantages.step_advantages(REWARDS, LENGTHS) == group_advantages_lists(REWARDS)
    dr = advantages.step_advantages(REWARDS, LENGTHS, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert dr == [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0], [0.0]]


def test_rloo_subtracts_the_mean_of_the_other_responses():
    out = advantages.step_advantages(REWARDS, LENGTHS, AlgorithmConfig(adv_estimator="rloo"))
    # 1 - (0 + 0 + 1) / 3 = 2/3 ; 0 - (1 + 0 + 1) / 3 = -2/3 ; a flat group and a group of one: 0
    assert out[0] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], rel=1e-6)
    assert out[1] == [0.0, 0.0, 0.0] and out[2] == [0.0]


def _whiten_by_hand(values: list[list[float]], lengths: list[list[int]]) -> list[list[float]]:
    tokens = [x for vs, ns in zip(values, lengths) for x, n in zip(vs, ns) for _ in range(n)]
    mu, var = statistics.fmean(tokens), statistics.variance(tokens)  # variance: Bessel over the tokens
    return [[(x - mu) / math.sqrt(var + 1e-8) for x in vs] for vs in values]


def test_reinforce_plus_plus_whitens_the_rewards_over_the_steps_tokens():
    out = advantages.step_advantages(REWARDS, LENGTHS, AlgorithmConfig(adv_estimator="reinforce_plus_plus"))
    want = _whiten_by_hand(REWARDS, LENGTHS)
    for got, exp in zip(out, want):
        assert got == pytest.approx(exp, rel=1e-6)


def test_reinforce_plus_plus_baseline_whitens_the_group_centred_rewards():
    cfg = AlgorithmConfig(adv_estimator="reinforce_plus_plus_baseline")
    out = advantages.step_advantages(REWARDS, LENGTHS, cfg)
    centred = [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0], [0.0]]
    for got, exp in zip(out, _whiten_by_hand(centred, LENGTHS)):
        assert got == pytest.approx(exp, rel=1e-6)


def test_advantages_refuse_non_finite_rewards_and_mismatched_lengths():
    for name in registry.ADV_ESTIMATORS:
        with pytest.raises(ValueError, match="non-finite"):
            advantages.step_advantages([[1.0, float("nan")]], [[1, 1]], AlgorithmConfig(adv_estimator=name))
    with pytest.raises(ValueError, match="same shape"):
        advantages.step_advantages([[1.0, 0.0]], [[1]])


# -- aggregation -----------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, float("inf")], [3.0, float("nan"), 7.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3) / 3),
    ("seq-mean-token-sum", ((1 + 2) + 3) / 2),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 3 / 1) / 2),
    ("seq-mean-token-sum-norm", ((1 + 2) + 3) / (2 * 4)),
])
def test_each_aggregation_by_hand_ignoring_padding(mode, expected):
    assert float(aggregate(LOSS, MASK, mode, StepTotals(3, 2), loss_scale_factor=4)) == pytest.approx(expected)
    # one row at a time, each over the step's totals: the parts add up to the whole
    parts = sum(float(aggregate(LOSS[b:b + 1], MASK[b:b + 1], mode, StepTotals(3, 2), 4)) for b in range(2))
    assert parts == pytest.approx(expected)


def test_sum_norm_needs_its_constant_and_totals_count_sequences_with_tokens():
    with pytest.raises(ValueError, match="loss_scale_factor"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", StepTotals(3, 2))
    assert StepTotals.of([3, 0, 2]) == StepTotals(5, 2)


def test_metrics_add_except_maxima():
    m = merge_metrics({"pg_loss": 1.0, "rollout_is_max": 2.0}, {"pg_loss": 0.5, "rollout_is_max": 1.5})
    assert m == {"pg_loss": 1.5, "rollout_is_max": 2.0}


# -- policy losses -----------------------------------------------------------------------------

def _batch(seed: int = 0, B: int = 5, T: int = 7, V: int = 11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=g)
    old = token_logprobs(logits.detach() + 0.3 * torch.randn(B, T, V, generator=g), targets)
    ref = token_logprobs(logits.detach() + 0.2 * torch.randn(B, T, V, generator=g), targets)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    return logits, targets, old, ref, adv, mask


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_default_objective_is_the_old_grpo_loss_bit_for_bit(kl_coef):
    logits, targets, old, ref, adv, mask = _batch()
    total = int(mask.sum())
    before = grpo_loss_before(token_logprobs(logits, targets), old, adv, mask, total, 0.2, 0.28, ref, kl_coef)
    (grad_before,) = torch.autograd.grad(before.loss, logits)
    now = policy_objective(token_logprobs(logits, targets), old, adv, mask, StepTotals(total, 5),
                           LossSettings(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=kl_coef), ref)
    (grad_now,) = torch.autograd.grad(now.loss, logits)
    assert torch.equal(now.loss, before.loss) and torch.equal(grad_now, grad_before)
    for k, v in before.metrics.items():
        assert torch.allclose(now.metrics[k], v, rtol=1e-6, atol=0), k


def _two_tokens():
    return torch.tensor([[0.1, -0.5]], requires_grad=True), torch.zeros(1, 2), torch.ones(1, 2)


def test_gspo_clips_the_geometric_mean_ratio_of_the_sequence():
    logp, old, mask = _two_tokens()
    s = math.exp((0.1 - 0.5) / 2)  # 0.8187: inside (0.8, 1.28)
    out = policy_objective(logp, old, torch.tensor([1.0]), mask, StepTotals(2, 1),
                           LossSettings(policy_loss="gspo", clip_eps_low=0.2, clip_eps_high=0.28))
    assert float(out.loss.detach()) == pytest.approx(-s, rel=1e-6)  # both tokens carry -s * A; token-mean
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-s / 2, -s / 2], rel=1e-6)  # d s_t / d logp_t = s
    # A < 0 and a narrower clip: the whole sequence takes 1 - 0.1 = 0.9, and no gradient
    logp, old, mask = _two_tokens()
    out = policy_objective(logp, old, torch.tensor([-1.0]), mask, StepTotals(2, 1),
                           LossSettings(policy_loss="gspo", clip_eps_low=0.1, clip_eps_high=0.1))
    assert float(out.loss.detach()) == pytest.approx(0.9, rel=1e-6)
    assert float(out.metrics["clip_frac"]) == 1.0
    out.loss.backward()
    assert logp.grad.abs().sum() == 0


def test_kl_estimators_by_hand():
    logp, ref, on = torch.tensor([[0.1]]), torch.tensor([[-0.2]]), torch.tensor([[True]])
    d = -0.3  # ref - logp
    want = {"k1": 0.3, "kl": 0.3, "k2": 0.5 * 0.09, "mse": 0.5 * 0.09, "k3": math.exp(d) - d - 1,
            "low_var_kl": math.exp(d) - d - 1, "abs": 0.3}
    for name, fn in policy_loss.KL_PENALTIES.items():
        assert float(fn(logp, ref, on)) == pytest.approx(want[name], rel=1e-6), name
    far = torch.tensor([[30.0]])  # ref - logp = 30: k3 explodes, veRL's low_var_kl is clamped to 10
    assert float(policy_loss.kl_k3(torch.zeros(1, 1), far, on)) > 1e12
    assert float(policy_loss.kl_low_var(torch.zeros(1, 1), far, on)) == 10.0


def test_the_entropy_bonus_subtracts_the_aggregated_entropy():
    logits = torch.zeros(1, 2, 2, requires_grad=True)  # uniform over 2 tokens: H = ln 2
    entropy = policy_loss.token_entropy(logits[0]).unsqueeze(0)
    assert entropy[0].tolist() == pytest.approx([math.log(2)] * 2)
    logp, old, mask = torch.full((1, 2), -math.log(2)), torch.full((1, 2), -math.log(2)), torch.ones(1, 2)
    plain = policy_objective(logp, old, torch.tensor([0.0]), mask, StepTotals(2, 1))
    bonus = policy_objective(logp, old, torch.tensor([0.0]), mask, StepTotals(2, 1),
                             LossSettings(entropy_coeff=0.1), entropy_B_T=entropy)
    assert float(bonus.loss.detach()) == pytest.approx(float(plain.loss) - 0.1 * math.log(2))
    bonus.loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() == 0  # uniform is the entropy's maximum


def test_truncated_importance_weights_token_and_sequence():
    behaviour = torch.tensor([[-0.1, -2.0]])  # the rollout's log-probs
    for level, w in (("token", [math.exp(0.1), 2.0]), ("sequence", [2.0, 2.0])):  # seq: e^2.1 capped
        logp = torch.zeros(1, 2, requires_grad=True)  # the current (proximal) weights
        out = policy_objective(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 2), StepTotals(2, 1),
                               LossSettings(rollout_is=level, rollout_is_threshold=2.0))
        # ratio to the proximal policy is 1 (never clipped); the loss is -w * A, token-mean
        assert float(out.loss.detach()) == pytest.approx(-sum(w) / 2, rel=1e-6)
        out.loss.backward()
        assert logp.grad[0].tolist() == pytest.approx([-x / 2 for x in w], rel=1e-6)
        assert float(out.metrics["clip_frac"]) == 0.0
    ratios = [math.exp(0.1), math.exp(2.0)]
    m = policy_objective(torch.zeros(1, 2), behaviour, torch.tensor([1.0]), torch.ones(1, 2), StepTotals(2, 1)).metrics
    assert float(m["rollout_is_mean"]) == pytest.approx(sum(ratios) / 2, rel=1e-6)  # reported without TIS too
    assert float(m["rollout_is_max"]) == pytest.approx(ratios[1], rel=1e-6)
    assert float(m["rollout_is_fraction_high"]) == 0.5


def test_overlong_penalty_by_hand():
    # cap 16, buffer 4: no penalty up to 12 tokens, then linear to -factor at the cap (DAPO)
    assert [overlong_penalty(n, 16, 4, 1.0) for n in (5, 12, 13, 14, 16)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(16, 16, 4, 0.5) == -0.5


def test_kl_in_the_reward_by_hand():
    """r - beta * sum_t kl_t, per response (veRL's apply_kl_penalty summed by an outcome estimator)."""
    from bidirl.algo.reward_shaping import kl_penalised

    assert kl_penalised([[1.0, 0.0], [0.5]], [[2.0, -1.0], [0.0]], 0.1) == [[0.8, 0.1], [0.5]]
    with pytest.raises(ValueError, match="same shape"):
        kl_penalised([[1.0, 0.0]], [[2.0]], 0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(use_kl_in_reward=True, adv_estimator="reinforce_plus_plus"), "not with adv_estimator=reinforce_plus_plus"),
    (dict(use_kl_in_reward=True, filter_groups=FilterGroups(enable=True, metric="seq_final_reward")),
     "seq_final_reward not allowed with use_kl_in_reward"),
])
def test_kl_in_the_reward_refuses_what_it_cannot_mean(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlgorithmConfig(**kwargs)
