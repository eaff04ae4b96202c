"""The planner's multi-turn model (``planner/lengths.py``, ``planner/stages.py``): a
trajectory planned as one response of its model tokens, its later turns' prefills and its
tool waits beside it (on the critical path, off the device)."""

from __future__ import annotations

import pytest

from bidirl.planner.compat import check_envelope
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import envelope_of
from bidirl.planner.lengths import LengthStats
from bidirl.planner.predict import predict
from bidirl.sim.run import simulate
from bidirl.sim.scenario import from_dict, load


def _with_turns(sc, **turns):
    d = sc.to_dict()
    d["workload"]["turns"] = {**d["workload"]["turns"], **turns}
    return from_dict(d)


def _predict(sc, policy="bidirl") -> float:
    ctx = PlanContext.from_scenario(sc, policy=policy)
    return predict(ctx, check_envelope(ctx, envelope_of(sc))).tokens_per_s


def test_single_turn_statistics_are_as_before():
    w = load("default").workload
    one = LengthStats.from_workload(w, 4)
    assert one.env_tokens == one.tool_s == one.turn_prefills == 0
    assert one.sample_tokens == one.prompt_tokens + one.mean


def test_trajectory_statistics():
    sc = _with_turns(load("tiny-cpu"), count=3, env_tokens=10, tool_latency_s=0.5)
    one = LengthStats.from_workload(load("tiny-cpu").workload, 4)
    three = LengthStats.from_workload(sc.workload, 4)
    assert three.mean == pytest.approx(3 * one.mean, rel=1e-6)
    assert three.env_tokens == 20 and three.turn_prefills == 2 and three.tool_s == 1.5
    assert three.sample_tokens == pytest.approx(32 + 3 * one.mean + 20)


def test_tool_latency_lowers_the_prediction_and_turns_cost_more_than_one():
    sc = load("agentic-8turn")
    base = _predict(sc)
    assert _predict(_with_turns(sc, tool_latency_s=10.0)) < base < _predict(_with_turns(sc, tool_latency_s=0.0))
    assert _predict(_with_turns(sc, dist="constant", count=1)) > base


@pytest.mark.parametrize("policy", ["async", "bidirl"])
def test_prediction_is_near_the_simulator_on_the_agentic_scenario(policy):
    sc = load("agentic-8turn")
    sim = simulate(sc, policy, record_intervals=False).throughput_tokens_per_s
    assert _predict(sc, policy) == pytest.approx(sim, rel=0.2)
