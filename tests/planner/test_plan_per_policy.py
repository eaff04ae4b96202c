"""A plan is for one policy: what it may borrow and the staleness it keeps
(``context.borrow_options``, ``context.policy_staleness``); the default is ``bidirl``."""

from __future__ import annotations

import json

import pytest

from bidirl import cli
from bidirl.planner.context import OPTIONS, PlanContext, borrow_options, policy_staleness
from bidirl.planner.plan import plan
from bidirl.policy import policy_names
from bidirl.sim.scenario import load

STEPS = 4  # a short horizon keeps the tests fast (the picks for 20 steps are in docs/planner.md)


@pytest.fixture(scope="module")
def h100():
    return load("h100-32-qwen3-8b")


def test_each_policy_plans_for_the_borrowing_it_does():
    got = {p: borrow_options(p) for p in policy_names()}
    assert got == {"sync": OPTIONS, "one-step-off": ("none",), "async": ("none",),
                   "roll-borrow": ("none", "roll_on_train"),
                   "train-borrow": ("none", "train_on_roll"),
                   "bidirl-opportunistic": OPTIONS, "bidirl": OPTIONS}
    assert [policy_staleness(p, 2) for p in ("sync", "one-step-off", "async", "bidirl")] == [0, 1, 2, 2]
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        borrow_options("nope")


def test_a_policy_that_never_borrows_is_predicted_without_borrowing(h100):
    got = plan(h100, steps=STEPS, policy="async")
    assert got.policy == "async" and got.to_json()["policy"] == "async"
    assert all(c.prediction.borrowed == "none" and c.prediction.first_lend is None
               and c.prediction.lent_windows == c.prediction.aux_steps == 0 for c in got.candidates)
    assert got.prediction.no_borrow_tokens_per_s is None  # no tie rule: nothing to lean on
    assert "for policy async" in got.format() and "leaning least on borrowing" not in got.format()
    # not the rollout-starved split that only lent trainer units make good (bidirl's)
    bidirl = plan(h100, steps=STEPS)
    assert got.envelope.rollout_devices > bidirl.envelope.rollout_devices
    assert got.envelope.label() == "R20/T12 roll tp4 x5, train dp12 tp1 fsdp"


def test_bidirls_plan_is_the_default_and_as_before(h100):
    """The planner's bidirl pick on h100-32-qwen3-8b, as it was before plans were per policy."""
    default, named = plan(h100, steps=STEPS), plan(h100, steps=STEPS, policy="bidirl")
    assert default.to_json() == named.to_json() and default.policy == "bidirl"
    assert default.envelope.label() == "R8/T24 roll tp4 x2, train dp24 tp1 fsdp"
    assert round(default.predicted_tokens_per_s) == 50_716
    assert PlanContext.from_scenario(h100).options == OPTIONS


def test_one_step_off_and_sync_are_planned_at_the_staleness_they_keep(make_scenario):
    sc = make_scenario(devices=16, staleness=3)
    assert PlanContext.from_scenario(sc, policy="one-step-off").staleness == 1
    assert PlanContext.from_scenario(sc, policy="sync").staleness == 0
    assert PlanContext.from_scenario(sc, policy="async").staleness == 3
    assert plan(sc, steps=4, policy="sync").policy == "sync"


def test_bidirl_plan_takes_the_policy(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--scenario", "h100-32-qwen3-8b", "--policy", "async", "--confirm", "0",
                     "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["policy"] == "async" and got["prediction"]["borrowed"] == "none"
    assert "tokens/s for policy async" in capsys.readouterr().out
    assert got["label"] == plan(load("h100-32-qwen3-8b"), policy="async", runnable_only=True).envelope.label()
