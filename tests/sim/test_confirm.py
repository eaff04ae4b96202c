"""The planner's short list confirmed by simulation (``bidirl.sim.confirm``)."""

from __future__ import annotations

import json

import pytest

from bidirl import cli
from bidirl.planner.plan import plan
from bidirl.sim import confirm as confirm_mod
from bidirl.sim.confirm import (
    CONFIRM_BAND,
    CONFIRM_SEED_OFFSET,
    CONFIRM_STEPS,
    confirm,
    simulate_envelope,
)
from bidirl.sim.scenario import load


@pytest.fixture(scope="module")
def planned():
    sc = load("default").replace(steps=4)
    return sc, plan(sc)


def _scripted(values: dict[str, float], calls: list):
    def runner(sc, env, steps, seed):
        calls.append((env.label(), steps, seed))
        return values[env.label()]
    return runner


def test_the_best_simulated_of_the_short_list_becomes_the_pick(planned):
    sc, res = planned
    labels = [c.envelope.label() for c in res.candidates[:3]]
    calls: list = []
    values = {labels[0]: 100.0, labels[1]: 90.0, labels[2]: 130.0}
    got = confirm(sc, res, k=3, band=0.99, runner=_scripted(values, calls))
    third = res.candidates[2]
    assert got.envelope == third.envelope and got.prediction is third.prediction
    assert got.candidates[0] is third and len(got.candidates) == len(res.candidates)
    assert {c.envelope.key() for c in got.candidates} == {c.envelope.key() for c in res.candidates}
    assert got.alternatives[0] is third and len(got.alternatives) == len(res.alternatives)
    # each envelope simulated once, on its own length seed, over the plan's horizon
    assert calls == [(lab, min(res.steps, CONFIRM_STEPS), sc.seed + CONFIRM_SEED_OFFSET)
                     for lab in labels]
    assert [r["simulated_tokens_per_s"] for r in got.confirmed] == [100.0, 90.0, 130.0]
    assert [r["rank"] for r in got.confirmed] == [0, 1, 2]
    assert got.to_json()["confirmed"]["envelopes"][2]["envelope"] == labels[2]
    text = got.format()
    assert "confirmed by simulation" in text and f"planner's own pick, {labels[0]}" in text
    assert "leaning least on borrowing" not in text  # the tie rule did not make this pick
    assert got.planner_pick == res.envelope and got.to_json()["confirmed"]["planner_pick"] == labels[0]
    assert res.envelope == res.candidates[0].envelope  # the planner's result is not changed


def test_a_simulated_tie_keeps_the_planners_order(planned):
    sc, res = planned
    got = confirm(sc, res, k=3, band=0.99, runner=lambda *a: 50.0)
    assert got.envelope == res.envelope and got.candidates[0] is res.candidates[0]
    assert "planner's own pick" not in got.format()


def test_only_envelopes_within_the_band_are_simulated(planned):
    """Predictions further below the best than the band are not simulated, whatever k."""
    sc, res = planned
    top = max(c.prediction.tokens_per_s for c in res.candidates)
    for band in (0.01, 0.03, CONFIRM_BAND):
        inside = [c.envelope.label() for c in res.candidates
                  if c.prediction.tokens_per_s >= (1 - band) * top][:8]
        calls: list = []
        got = confirm(sc, res, k=8, band=band, runner=_scripted(dict.fromkeys(inside, 1.0), calls))
        assert [c[0] for c in calls] == (inside if len(inside) >= 2 else [])
        assert (got is res) == (len(inside) < 2)


@pytest.mark.parametrize("k", [0, 1])
def test_nothing_to_choose_between_returns_the_planners_pick(planned, k):
    sc, res = planned
    called: list = []
    assert confirm(sc, res, k=k, runner=_scripted({}, called)) is res
    assert called == [] and res.to_json()["confirmed"] is None


def test_a_negative_short_list_is_refused(planned):
    sc, res = planned
    with pytest.raises(ValueError, match="k .* must be >= 0, got -1"):
        confirm(sc, res, k=-1)
    with pytest.raises(ValueError, match=r"band .* must be in \[0, 1\), got 1.5"):
        confirm(sc, res, band=1.5)


def test_the_simulator_confirms_with_the_figures_it_reports(planned):
    """With the real simulator: the pick is the best of the rows, and each row is what
    simulating that envelope on the confirmation's seed gives (the runs are deterministic)."""
    sc, res = planned
    got = confirm(sc, res, k=2, band=0.99)
    assert len(got.confirmed) == 2 and got.confirm_seed == sc.seed + CONFIRM_SEED_OFFSET
    best = max(got.confirmed, key=lambda r: r["simulated_tokens_per_s"])
    assert got.envelope.label() == best["envelope"]
    again = simulate_envelope(sc, got.envelope, got.confirm_steps, got.confirm_seed)
    assert round(again, 2) == best["simulated_tokens_per_s"]


def test_bidirl_plan_confirms_by_default_and_can_be_told_not_to(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--scenario", "default", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    rows = got["confirmed"]["envelopes"]
    res = plan(load("default"), runnable_only=True)  # what `bidirl plan` plans
    top = max(c.prediction.tokens_per_s for c in res.candidates)
    inside = [c for c in res.candidates if c.prediction.tokens_per_s >= (1 - CONFIRM_BAND) * top]
    assert len(rows) == min(len(inside), confirm_mod.DEFAULT_K) >= 2
    assert got["envelope"] == got["alternatives"][0]["envelope"]
    best = max(rows, key=lambda r: r["simulated_tokens_per_s"])
    captured = capsys.readouterr()
    assert "confirmed by simulation" in captured.out
    progress = [line for line in captured.err.splitlines() if line.startswith("[confirm ")]
    assert len(progress) == len(rows) and progress[-1].startswith(f"[confirm {len(rows)}/{len(rows)}] ")
    assert got["label"] == best["envelope"] == got["alternatives"][0]["label"]
    assert cli.main(["plan", "--scenario", "default", "--confirm", "0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["confirmed"] is None


def test_a_negative_confirm_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--confirm", "-1"])
    assert e.value.code == 2 and "--confirm" in capsys.readouterr().err


def test_the_parsers_default_is_the_modules():
    parser = cli.build_parser()
    assert parser.parse_args(["plan"]).confirm == confirm_mod.DEFAULT_K
    assert parser.parse_args(["simulate"]).confirm == confirm_mod.DEFAULT_K


def test_an_envelope_the_simulator_refuses_is_reported_and_not_picked(planned):
    from bidirl.sim.scenario import ScenarioError

    sc, res = planned
    first = res.candidates[0].envelope.label()

    def runner(s, env, steps, seed):
        if env.label() == first:
            raise ScenarioError("pools: the rollout replica needs 99 GiB per device")
        return 10.0

    got = confirm(sc, res, k=2, band=0.99, runner=runner)
    assert got.envelope == res.candidates[1].envelope
    refused = got.confirmed[0]
    assert refused["simulated_tokens_per_s"] is None and "99 GiB" in refused["refused"]
    assert "refused by the simulator" in got.format()

    def refuse_all(*a):
        raise ScenarioError("pools: nothing fits")

    kept = confirm(sc, res, k=2, band=0.99, runner=refuse_all)
    assert kept.envelope == res.envelope and len(kept.confirmed) == 2
