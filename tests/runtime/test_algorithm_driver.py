"""The train driver lays a step out with the run's advantage estimator (``algorithm.adv_estimator``)
over the whole step, and sends every micro-batch the step's totals (fake devices, no Ray)."""

from __future__ import annotations

import pytest
from fake_run import reward, run_fake

from bidirl.algo.advantages import step_advantages
from bidirl.algo.algorithm_config import AlgorithmConfig


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus_baseline"])
def test_the_driver_trains_on_the_configured_advantages(estimator):
    algorithm = AlgorithmConfig(adv_estimator=estimator)

    def setup(ex):
        ex.job.algorithm = algorithm

    run = run_fake("async", steps=3, group_size=4, setup=setup)
    primary = run.backend.workers[run.spec.train_devices[0]].roles["train"]
    for step in primary.applied:
        samples = [s for mb in step for s in mb]
        groups = [samples[i:i + 4] for i in range(0, len(samples), 4)]
        rewards = [[reward("fake", " ".join(map(str, s["response_ids"])), "x") for s in g] for g in groups]
        lengths = [[len(s["response_ids"]) for s in g] for g in groups]
        want = step_advantages(rewards, lengths, algorithm)
        assert [[s["advantage"] for s in g] for g in groups] == want
    assert any(s["advantage"] != 0 for step in primary.applied for mb in step for s in mb)
