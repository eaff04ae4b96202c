"""The public entry point: built-in scenarios, overrides, calibration, result fields."""

import dataclasses

import pytest

from bidirl.sim.result import POLICIES
from bidirl.sim.run import simulate
from bidirl.sim.scenario import Pools, ScenarioError, TrainLayout, builtin_names, load


def test_builtin_scenarios_load_and_run():
    names = builtin_names()
    assert {"default", "tiny-cpu", "a6000-32-qwen3-4b", "h100-32-qwen3-8b",
            "scale-1024"} <= set(names)
    for name in names:
        sc = load(name)
        if sc.devices <= 64:
            r = simulate(sc, "bidirl", steps=2, record_intervals=False)
            assert r.groups_lost == 0 and r.steps == 2


def test_result_fields_are_filled():
    r = simulate(load("tiny-cpu"), "async", steps=3)
    assert r.policy == "async" and r.scenario == "tiny-cpu" and r.devices == 2
    assert len(r.trace_sha256) == 64 and r.intervals
    assert r.throughput_tokens_per_s == pytest.approx(r.tokens_trained / r.wall_s)
    assert 0 < r.efficiency <= 1
    assert set(r.pool_busy_fraction) == {"rollout", "train"}
    assert set(r.to_json()) >= {"trace_sha256", "efficiency", "admission"}
    assert r.extra["decision_us_p99"] > 0


def test_pools_override_runs_any_envelope():
    sc = load("default")
    pools = Pools(rollout_devices=4, train_devices=4, rollout_tp=2, train=TrainLayout(2, 2))
    r = simulate(sc, "bidirl", steps=2, pools=pools, record_intervals=False)
    assert r.devices == 8 and r.extra["replicas"] == 2
    with pytest.raises(ScenarioError, match="pools.train.dp"):
        simulate(sc, "async", steps=1,
                 pools=dataclasses.replace(pools, train=TrainLayout(3, 2)))


def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: sync, one-step-off"):
        simulate(load("tiny-cpu"), "nope", steps=1)
    assert len(POLICIES) == 7


def test_scheduler_models_calibrate_in_the_loop():
    sc = load("default")
    sc = sc.replace(sim=dataclasses.replace(sc.sim, prior_scale=1.5))
    r = simulate(sc, "async", steps=10, record_intervals=False)
    err = r.stage_model_median_error
    assert err["decode"] < 0.05 and err["prefill"] < 0.05
