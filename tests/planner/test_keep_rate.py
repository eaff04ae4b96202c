"""DAPO's dynamic sampling in the planner: a step generates ``prompts_per_step / keep_rate``
groups, so a lower keep rate predicts a longer rollout period, a slower step, and a split
that gives rollout more devices."""

from __future__ import annotations

import pytest

from bidirl.perf.scenario import KeepRate
from bidirl.planner.context import PlanContext
from bidirl.planner.plan import candidate_envelopes, evaluate
from bidirl.planner.predict import predict


def _best_split_without_borrowing(ctx: PlanContext):
    best = None
    for env in candidate_envelopes(ctx):
        c = evaluate(ctx, env, pipeline=False)
        if not hasattr(c, "prediction"):
            continue  # refused (memory)
        p = predict(ctx, c.envelope, options=("none",), pipeline=False)
        if best is None or p.tokens_per_s > best[0].tokens_per_s:
            best = (p, c.envelope)
    return best


def test_the_context_generates_more_groups_than_it_trains(make_scenario):
    sc = make_scenario(keep_rate=KeepRate(start=0.5, end=1.0), steps=2)
    ctx = PlanContext.from_scenario(sc)
    assert ctx.keep_rate == pytest.approx(2 / (1 / 0.5 + 1 / 1.0))  # 1 / mean(1 / k) over the steps
    assert ctx.generated_groups_per_step == round(64 / ctx.keep_rate) > ctx.prompts_per_step
    assert ctx.tokens_per_step == PlanContext.from_scenario(make_scenario(steps=2)).tokens_per_step


def test_a_lower_keep_rate_predicts_a_slower_step_on_the_same_split(make_scenario):
    env = _best_split_without_borrowing(PlanContext.from_scenario(make_scenario(max_len=1024)))[1]
    preds = [predict(PlanContext.from_scenario(make_scenario(max_len=1024, keep_rate=KeepRate(start=keep))), env)
             for keep in (1.0, 0.7, 0.4)]
    assert preds[0].rollout_s < preds[1].rollout_s < preds[2].rollout_s
    assert preds[0].step_time_s < preds[1].step_time_s < preds[2].step_time_s
    assert preds[0].tokens_per_s > preds[1].tokens_per_s > preds[2].tokens_per_s


def test_a_lower_keep_rate_shifts_the_split_toward_rollout(make_scenario):
    rollout = [_best_split_without_borrowing(PlanContext.from_scenario(
        make_scenario(max_len=1024, keep_rate=KeepRate(start=keep))))[1].rollout_devices
        for keep in (1.0, 0.5, 0.25)]
    assert rollout == sorted(rollout) and rollout[-1] > rollout[0], rollout
