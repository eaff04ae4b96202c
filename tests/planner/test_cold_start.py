"""The planner's first lending window is the policy's own decision at t = 0, and ties
between near-equal predictions go to the envelope that leans least on borrowing."""

from __future__ import annotations

import dataclasses

import pytest

from bidirl.planner import plan as plan_mod
from bidirl.planner.cold_start import first_window_units
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope
from bidirl.planner.pipeline import Pipeline
from bidirl.planner.plan import TIE, evaluate, plan, scenario_with_envelope
from bidirl.planner.predict import pipeline_timeline, predict, with_pipeline
from bidirl.planner.stages import _aux_theta, _model
from bidirl.policy import roll_borrow
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ResponseLength


def _at_max(make_scenario, max_len: int = 6144):
    """Every response runs to the maximum: the policy's prior (mean ``max / 4``) prices the
    fill at a quarter of its length (the regret bench's ``rand07``)."""
    sc = make_scenario(devices=14, hardware="H200-141GB", model="Qwen2.5-7B", staleness=4,
                       max_len=max_len, steps=8, prompts_per_step=96, group_size=4,
                       prompt_tokens=512)
    rl = ResponseLength("constant", median=max_len, sigma=0.5, min=16, max=max_len)
    return sc.replace(workload=dataclasses.replace(sc.workload, response_length=rl))


def _first_decision_in_simulation(sc, env, monkeypatch) -> int:
    """Units the ``bidirl`` policy really lends at t = 0 in the simulator."""
    seen = []
    judge = roll_borrow.RollLending.judge

    def record(self, s):
        d = judge(self, s)
        seen.append((s.t, d))
        return d

    monkeypatch.setattr(roll_borrow.RollLending, "judge", record)
    simulate(scenario_with_envelope(sc, env), "bidirl", steps=4, seed=sc.seed,
             record_intervals=False)
    first = [d for t, d in seen if t == 0.0]
    return (first[0].units if first[0].admit else 0) if first else 0


@pytest.mark.parametrize("case", ["lognormal", "at_max"])
def test_first_window_is_what_the_policy_decides_at_t0(make_scenario, monkeypatch, case):
    sc = (make_scenario(devices=16, model="Qwen3-4B", max_len=16384, steps=4)
          if case == "lognormal" else _at_max(make_scenario, max_len=1024).replace(steps=4))
    ctx = PlanContext.from_scenario(sc, 4)
    checked = set()
    for c in plan(sc, steps=4).candidates[:6]:
        mine = first_window_units(ctx, c.envelope)
        assert mine == _first_decision_in_simulation(sc, c.envelope, monkeypatch)
        checked.add(mine > 0)
    # the two cases exercise both sides of the rule: it lends on lognormal lengths, and
    # declines for some envelopes when every response runs to a short (1,024) maximum
    assert (True if case == "lognormal" else False) in checked


def test_a_declined_first_window_is_not_lent_in_the_recurrence(make_scenario):
    sc = _at_max(make_scenario)
    ctx = PlanContext.from_scenario(sc, 8)
    env = evaluate(ctx, Envelope(6, 8, 2, 4, 2)).envelope
    assert first_window_units(ctx, env) == 0
    m = _model(ctx, env)

    def run(first_lend, lend_roll=True):
        pipe = Pipeline(m, env, ctx.staleness, ctx.expected_max(ctx.group_size),
                        lambda idle: _aux_theta(m, env, idle),
                        ctx.rollout_model(env.rollout_tp).prefill_s,
                        ctx.lengths.prompt_tokens, ctx.lengths.mean, first_lend)
        return pipe.run(8, lend_roll, True)

    judged, declined = run(None), run(0)
    # judged on expected values the fill (100 s) is worth a lend: the lent units run
    # later batches ahead, and the run ends earlier ...
    assert judged.wall_s < 0.95 * declined.wall_s
    # ... the policy declines it, and the run without it is what the planner predicts
    _, wall = pipeline_timeline(ctx, env)
    assert wall == pytest.approx(min(declined.wall_s, run(0, lend_roll=False).wall_s),
                                 rel=1e-9)
    p = predict(ctx, env)
    assert p.first_lend == 0
    # the planner's two passes (a screen that assumes the lend, then the correction)
    # give the same prediction as one full call
    two = with_pipeline(ctx, env, predict(ctx, env, pipeline=False))
    assert two.first_lend == 0 and two.tokens_per_s == pytest.approx(p.tokens_per_s, rel=1e-12)


def test_no_training_units_means_no_first_lend(make_scenario):
    sc = make_scenario(devices=16)
    ctx = PlanContext.from_scenario(sc, 8)
    # a tp-8 rollout replica cannot be hosted by a 4-device training pool
    env = evaluate(ctx, Envelope(8, 8, 8, 2, 4)).envelope
    env = dataclasses.replace(env, train_devices=4)
    assert env.borrowable_replicas == 0 and first_window_units(ctx, env) == 0


def test_ties_go_to_the_envelope_leaning_least_on_borrowing(make_scenario, monkeypatch):
    sc = make_scenario(devices=16, model="Qwen3-4B", max_len=16384)
    res = plan(sc, steps=8)
    top = max(c.prediction.tokens_per_s for c in res.candidates)
    band = [c for c in res.candidates if c.prediction.tokens_per_s >= (1 - TIE) * top]
    assert len(band) >= 2, "the case must have a tie to break"
    ctx = PlanContext.from_scenario(sc, 8)
    alone = {c.envelope.key(): predict(ctx, c.envelope, options=("none",)).tokens_per_s
             for c in band}
    assert res.envelope.key() == max(alone, key=alone.get)
    assert res.prediction.no_borrow_tokens_per_s == pytest.approx(max(alone.values()))
    assert "leaning least on borrowing" in res.format()
    # every candidate is still there, once
    assert sorted(c.envelope.key() for c in res.candidates) == sorted(
        {c.envelope.key() for c in res.candidates})

    monkeypatch.setattr(plan_mod, "TIE", 0.0)  # no tie: the best prediction is the pick
    res0 = plan(sc, steps=8)
    assert res0.predicted_tokens_per_s == top
    assert res0.prediction.no_borrow_tokens_per_s is None
