"""Each policy declares the most staleness it keeps whatever its bound
(``Policy.max_staleness``, read by name through ``policy_max_staleness``), and keeps it."""

from __future__ import annotations

import pytest

from bidirl.policy import policy_max_staleness, policy_names
from bidirl.sim.run import simulate
from bidirl.sim.scenario import load


def test_the_lockstep_policies_declare_their_gap():
    assert policy_max_staleness("sync") == 0
    assert policy_max_staleness("one-step-off") == 1
    assert policy_max_staleness("async") is None  # the configured bound


@pytest.mark.parametrize("policy", policy_names())
def test_a_policy_keeps_the_staleness_it_declares(policy):
    bound = 3
    result = simulate(load("tiny-cpu").replace(staleness=bound), policy, steps=8, record_intervals=False)
    most = policy_max_staleness(policy)
    assert result.staleness["max"] <= (bound if most is None else most)
