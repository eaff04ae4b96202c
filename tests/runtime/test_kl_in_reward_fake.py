"""KL in the reward (``algorithm.use_kl_in_reward``) through the real runtime's executor, every
policy, on the fake device backend.

The train driver asks rank 0 for each response's summed KL to the reference before it
computes a step's advantages, then subtracts ``kl_ctrl.kl_coef`` times it from the reward.
Checked: the advantages every trainer merged are exactly the estimator's on the penalised
rewards (not on the bare ones), whoever computed which chunk; nothing is lost or trained
twice; and the step's metrics carry veRL's KL-in-reward names.
"""

from __future__ import annotations

import pytest
from fake_devices import FAKE_KL_PER_TOKEN, Costs
from fake_run import run_fake

from bidirl.algo.advantages import step_advantages
from bidirl.algo.algorithm_config import AlgorithmConfig, KLControl
from bidirl.algo.reward_shaping import kl_penalised
from bidirl.core.ledger import audit_trained
from bidirl.policy import policy_names

WORKLOAD = dict(rollout=2, train=1, max_new=64, steps=6, prompts=4,
                costs=Costs(c_in_s=0.01, c_out_s=0.01, decode_s=0.01))
BETA = 0.5


def _fake_kl(response_ids) -> float:  # FakeTrainer.reference_kl's made-up KL
    return FAKE_KL_PER_TOKEN * len(response_ids) + 1e-3 * (response_ids[0] % 7)


def _expected(run, rec, alg, with_kl: bool) -> list[float]:
    n = run.spec.group_size
    rewards = [list(rec.rewards[k * n:(k + 1) * n]) for k in range(len(rec.group_ids))]
    responses = [[run.responses[(g, i)].token_ids for i in range(n)] for g in rec.group_ids]
    if with_kl:
        rewards = kl_penalised(rewards, [[_fake_kl(r) for r in grp] for grp in responses], BETA)
    lengths = [[len(r) for r in grp] for grp in responses]
    return sorted(x for grp in step_advantages(rewards, lengths, alg) for x in grp)


@pytest.mark.parametrize("policy", policy_names())
def test_advantages_are_the_estimators_on_the_penalised_rewards(policy):
    alg = AlgorithmConfig(use_kl_in_reward=True, kl_ctrl=KLControl(kl_coef=BETA))
    run = run_fake(policy, **WORKLOAD, algorithm=alg)
    ex = run.executor
    created = ex.rollout.next_group_id()
    audit = audit_trained(range(created), run.trained, run.staleness, run.spec.staleness)
    assert audit.ok and audit.groups_trained == WORKLOAD["steps"] * WORKLOAD["prompts"]
    primary = run.backend.workers[run.spec.train_devices[0]].roles["train"]
    assert len(primary.applied) == WORKLOAD["steps"] == primary.kl_calls
    for step, merged in enumerate(primary.applied):
        rec = ex.steps[step]
        got = sorted(s["advantage"] for mb in merged for s in mb)
        assert got == _expected(run, rec, alg, with_kl=True), step
        assert got != _expected(run, rec, alg, with_kl=False), step  # the penalty changed something
        assert rec.metrics["reward_kl_penalty_coeff"] == BETA
        assert rec.metrics["reward_kl_penalty"] > 0
        assert rec.metrics["rewards_mean"] < sum(rec.rewards) / len(rec.rewards)


def test_off_by_default_asks_for_no_reference():
    run = run_fake("bidirl", **WORKLOAD)
    assert all("reward_kl_penalty" not in rec.metrics for rec in run.executor.steps.values())
    assert run.backend.workers[run.spec.train_devices[0]].roles["train"].kl_calls == 0


def _joined(run) -> int:
    return sum(n for rec in run.executor.steps.values() for ex, n in rec.chunks if ex.endswith("(joined)"))


def test_auxiliaries_that_join_during_the_reference_pass_still_compute():
    """``bidirl-opportunistic`` lends idle rollout devices to the running step (``JoinStep``);
    a join that arrives while rank 0 computes the reference KL waits for the step's
    micro-batches instead of being sent home with nothing done."""
    alg = AlgorithmConfig(use_kl_in_reward=True, kl_ctrl=KLControl(kl_coef=BETA))
    with_kl = run_fake("bidirl-opportunistic", **{**WORKLOAD, "steps": 8}, algorithm=alg)
    # 16 micro-batches joined on this virtual clock; sent home unserved, 3 were (the fake
    # backend is deterministic, so the count is too)
    assert _joined(with_kl) >= 10
    primary = with_kl.backend.workers[with_kl.spec.train_devices[0]].roles["train"]
    for step, merged in enumerate(primary.applied):
        got = sorted(s["advantage"] for mb in merged for s in mb)
        assert got == _expected(with_kl, with_kl.executor.steps[step], alg, with_kl=True), step
