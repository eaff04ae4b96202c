"""The attainable bound: ideal packing and the staleness chain of the longest responses."""

import pytest

from bidirl.sim.run import simulate
from bidirl.sim.scenario import from_dict

POLICIES = ("sync", "async", "bidirl-opportunistic", "bidirl")


def _scenario(staleness: int, sigma: float, max_len: int = 8192, steps: int = 4):
    return from_dict({
        "name": "chain", "hardware": "H100-80GB", "model": "Qwen3-4B", "devices": 8,
        "staleness": staleness, "steps": steps,
        "workload": {"prompts_per_step": 16, "group_size": 8, "prompt_tokens": 256,
                     "response_length": {"median": 1000, "sigma": sigma, "max": max_len}},
        "pools": {"rollout_devices": 4, "train_devices": 4, "train": {"dp": 4}},
        "sim": {"timing_noise_cv": 0.0, "prior_scale": 1.0},
    })


@pytest.mark.parametrize("staleness, sigma", [(0, 1.2), (1, 0.9), (2, 0.3)])
def test_no_policy_beats_the_attainable_bound(staleness, sigma):
    sc = _scenario(staleness, sigma)
    for policy in POLICIES:
        r = simulate(sc, policy, record_intervals=False)
        assert r.attainable_tokens_per_s <= r.ideal_tokens_per_s * (1 + 1e-12)
        assert r.throughput_tokens_per_s <= r.attainable_tokens_per_s * (1 + 1e-9), policy
        assert r.efficiency <= r.efficiency_attainable <= 1 + 1e-9


def test_a_long_tail_at_staleness_zero_is_bound_by_the_chain_not_the_work():
    """Long tails and no staleness: the longest responses, one batch after the other, take
    longer than the packed work, so the attainable bound sits below the ideal one; a
    shorter tail (same median) lifts it."""
    tail = simulate(_scenario(0, 1.4, max_len=16384), "async", record_intervals=False)
    assert tail.attainable_tokens_per_s < 0.9 * tail.ideal_tokens_per_s
    short = simulate(_scenario(0, 0.2, max_len=16384), "async", record_intervals=False)
    assert (short.attainable_tokens_per_s / short.ideal_tokens_per_s
            > tail.attainable_tokens_per_s / tail.ideal_tokens_per_s)
