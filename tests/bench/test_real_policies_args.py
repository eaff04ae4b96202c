"""``bench/real_policies.py``'s arguments: ``--steps`` sets each run's length and is recorded;
bad values and an ``--append`` that would mix run lengths are refused before any run starts."""

from __future__ import annotations

import json
import sys

import pytest

from bench import real_policies as rp


def _main(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["real_policies.py", *argv])
    return rp.main()


def test_steps_below_two_is_refused(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _main(monkeypatch, "--workload", "balanced", "--steps", "1")
    assert "--steps: must be >= 2" in capsys.readouterr().err


def test_append_refuses_to_mix_run_lengths(monkeypatch, capsys, tmp_path):
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps({"workload": "balanced", "steps": 12, "runs": [], "failed_runs": []}))
    with pytest.raises(SystemExit):
        _main(monkeypatch, "--workload", "balanced", "--steps", "24", "--append", "--json", str(prev))
    err = capsys.readouterr().err
    assert "holds runs of 12 steps, not 24" in err


def test_steps_reaches_every_run_and_the_summary(monkeypatch, tmp_path):
    """Each run is given ``run.steps=N`` and the summary records N (no run starts: run_once
    is replaced by one that records what it was given)."""
    seen = []

    def fake_run_once(name, w, policy, run, data, extra):
        seen.append(w.steps)
        return {"workload": name, "policy": policy, "error": "not run"}

    monkeypatch.setattr(rp, "run_once", fake_run_once)
    res = rp.run_workload("balanced", 1, [], tmp_path, steps=24)
    assert seen == [24, 24] and res["steps"] == 24
    assert rp.run_workload("balanced", 1, [], tmp_path)["steps"] == rp.WORKLOADS["balanced"].steps


def _run(policy: str, pair: int, tps: float, ideal: float) -> dict:
    return {"workload": "balanced", "policy": policy, "pair": pair, "tokens_per_s": tps, "ideal_tokens_per_s": ideal,
            "efficiency": tps / ideal, "sim_predicted_tokens_per_s": None, "stage_model_median_error": {},
            "reclaim_latency_s": [], "reclaim_bound_s": [], "idle_ratio": {"rollout": 0.1, "train": 0.1},
            "borrows": {}, "audit_ok": True, "load_average": [1.0, 1.0]}


def test_the_within_pair_efficiency_splits_into_own_bound_and_work():
    """Per pair: bidirl / async's bound = (bidirl / its own bound) / (async's bound / bidirl's)."""
    runs = [_run("async", 0, 100.0, 160.0), _run("bidirl", 0, 140.0, 150.0),
            _run("async", 1, 90.0, 150.0), _run("bidirl", 1, 120.0, 125.0)]
    res = rp.summarise("balanced", rp.WORKLOADS["balanced"], runs)
    within = res["policies"]["bidirl"]["efficiency_per_pair"]
    own, work = res["bidirl_own_efficiency_per_pair"], res["bidirl_work_over_async_per_pair"]
    assert own == pytest.approx([140 / 150, 120 / 125]) and work == pytest.approx([160 / 150, 150 / 125])
    assert within == pytest.approx([o / w for o, w in zip(own, work)])
    assert res["bidirl_own_efficiency"] == pytest.approx((140 / 150 + 120 / 125) / 2)


def test_a_pair_without_its_bidirl_run_adds_no_factor():
    runs = [_run("async", 0, 100.0, 160.0), _run("bidirl", 0, 140.0, 150.0), _run("async", 1, 90.0, 150.0)]
    res = rp.summarise("balanced", rp.WORKLOADS["balanced"], runs)
    assert len(res["bidirl_own_efficiency_per_pair"]) == 1 and res["pairs"] == 1


STAT = "cpu  846056 9507 87874 4334464 2852 0 1331 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def test_steal_fraction_is_the_stolen_share_of_all_cpu_time():
    before = rp.cpu_jiffies(STAT.format(steal=10909))
    total0 = 846056 + 9507 + 87874 + 4334464 + 2852 + 0 + 1331 + 10909
    assert before == (10909, total0)
    # 100 more jiffies of user time and 25 stolen: 25 of 125
    after = rp.cpu_jiffies(STAT.format(steal=10934).replace("846056", "846156"))
    assert rp.steal_fraction(before, after) == 0.2
    assert rp.steal_fraction(before, before) is None  # no time passed
    assert rp.steal_fraction(None, after) is None
    assert rp.cpu_jiffies("intr 1 2 3\n") is None  # not a cpu line
    assert rp.cpu_jiffies("") is None  # an empty read
    here = rp.cpu_jiffies()
    assert here is None or here[1] > 0  # this machine's, where it has one
