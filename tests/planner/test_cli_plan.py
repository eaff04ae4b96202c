"""`bidirl plan` and `bidirl simulate --plan auto` from the command line."""

from __future__ import annotations

import json
import math

from bidirl.cli import main


def test_plan_prints_the_pick_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "default", "--top", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan for default: R") and "models: closed form" in text
    got = json.loads(out.read_text())
    env = got["envelope"]
    assert {"rollout_devices", "train_devices", "rollout_tp", "train_layout"} <= set(env)
    assert env["rollout_devices"] + env["train_devices"] == 16
    assert got["predicted_tokens_per_s"] > 0 and len(got["alternatives"]) == 3
    assert got["alternatives"][0]["envelope"] == env  # the pick heads the alternatives
    assert isinstance(got["rejected"], list) and got["steps"] == 20
    p = got["prediction"]  # the blend of the two models, both reported
    assert math.isclose(p["tokens_per_s"], math.sqrt(p["steady_tokens_per_s"]
                                                     * p["pipeline_tokens_per_s"]), rel_tol=1e-5)


def test_simulate_runs_on_the_planners_envelope(capsys):
    assert main(["simulate", "--scenario", "default", "--plan", "auto", "--steps", "2"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    chosen = [line for line in lines if line.startswith("planner envelope: R")]
    assert len(chosen) == 1 and "predicted" in chosen[0]
    # the short list's simulations come first, one progress line each (bidirl.sim.confirm)
    assert lines[:lines.index(chosen[0])] and all(
        line.startswith("[confirm ") for line in lines[:lines.index(chosen[0])])
    assert "groups            trained" in captured.out


def test_plan_of_an_unknown_scenario_is_a_user_error(capsys):
    assert main(["plan", "--scenario", "no-such-scenario"]) == 2
    assert "no-such-scenario" in capsys.readouterr().err
