"""``bench/efficiency_plot.py`` on hand-made ``real_policies`` results (no run, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import efficiency_plot as ep
from bench import real_policies as rp


def _run(pair: int, policy: str, tps: float, ideal: float) -> dict:
    return {"pair": pair, "policy": policy, "tokens_per_s": tps, "ideal_tokens_per_s": ideal,
            "idle_ratio": {}, "borrows": {}, "stage_model_median_error": {}, "audit_ok": True,
            "load_average": [0.0, 0.0], "sim_predicted_tokens_per_s": None,
            "reclaim_latency_s": [], "reclaim_bound_s": []}


def _result(path: Path, workload: str, pairs: list[tuple[float, float, float]]) -> Path:
    """A result as ``bench/real_policies.py`` summarises it, from runs of known numbers.

    pairs: (async tok/s, async bound, bidirl tok/s); the bidirl run's own bound is a decoy."""
    runs = []
    for i, (a, bound, b) in enumerate(pairs):
        runs += [_run(i, "async", a, bound), _run(i, "bidirl", b, 10 * bound)]
    runs.append(_run(len(pairs), "async", 1.0, 2.0))  # an unfinished pair: left out
    path.write_text(json.dumps(rp.summarise(workload, rp.WORKLOADS[workload], runs)))
    return path


def test_each_pair_is_scored_against_its_own_async_bound(tmp_path, capsys):
    f = _result(tmp_path / "real_policies_train-heavy_quiet.json", "train-heavy",
                [(100.0, 200.0, 180.0), (120.0, 150.0, 150.0), (90.0, 100.0, 81.0)])
    png, js = tmp_path / "p.png", tmp_path / "p.json"
    assert ep.main([str(f), "--png", str(png), "--json", str(js)]) == 0
    got = json.loads(js.read_text())["train-heavy"]["quiet"]  # labelled by the file name
    assert got["pairs"] == 3
    assert got["ratios"] == pytest.approx([1.8, 1.25, 0.9])
    assert got["efficiencies"] == pytest.approx([0.9, 1.0, 0.81])
    assert got["median_ratio"] == pytest.approx(1.25)
    assert got["median_efficiency"] == pytest.approx(0.9)
    assert png.stat().st_size > 0
    assert "train-heavy" in capsys.readouterr().out


def test_series_are_kept_apart_by_label_and_all_workload_files_are_read(tmp_path):
    a = _result(tmp_path / "a.json", "balanced", [(100.0, 130.0, 110.0)])
    both = tmp_path / "all.json"
    both.write_text(json.dumps({"workloads": [
        json.loads(_result(tmp_path / "x.json", "balanced", [(100.0, 140.0, 120.0)]).read_text()),
        json.loads(_result(tmp_path / "y.json", "shifting", [(100.0, 150.0, 135.0)]).read_text())]}))
    s = ep.summarise([ep.load(f"before={a}"), ep.load(f"after={both}")])
    assert s["balanced"]["before"]["ratios"] == pytest.approx([1.1])
    assert s["balanced"]["after"]["ratios"] == pytest.approx([1.2])
    assert s["shifting"]["after"]["efficiencies"] == pytest.approx([0.9])


@pytest.mark.parametrize("content, says", [
    ("{not json", "not JSON"),
    (json.dumps({"workload": "tiny", "ratios": []}), "not a bench.real_policies result"),
    (json.dumps({"workload": "balanced", "runs": []}), "not a bench.real_policies result"),
    (json.dumps({"workload": "balanced", "ratios": [1.1], "policies": {}}), "1 ratios but 0 efficiencies"),
    (json.dumps([1, 2]), "not a bench.real_policies result"),
])
def test_bad_files_are_refused_with_the_reason(tmp_path, content, says):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(SystemExit, match=says):
        ep.load(str(f))


def test_a_missing_file_and_files_without_a_pair_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        ep.load(str(tmp_path / "missing.json"))
    f = _result(tmp_path / "r.json", "balanced", [])
    with pytest.raises(SystemExit, match="no complete async/bidirl pair"):
        ep.main([str(f), "--png", str(tmp_path / "p.png"), "--json", str(tmp_path / "p.json")])


def test_each_pair_splits_into_its_own_bound_and_its_work_over_async(tmp_path):
    """eff = own / work per pair, from the summarised fields or, in an older result, its runs."""
    runs = [_run(0, "async", 100.0, 160.0), _run(0, "bidirl", 140.0, 150.0),
            _run(1, "async", 90.0, 150.0), _run(1, "bidirl", 120.0, 125.0)]
    new = rp.summarise("shifting", rp.WORKLOADS["shifting"], runs)
    old = {k: v for k, v in new.items() if not k.startswith("bidirl_")}  # written before the split
    for name, res in (("new", new), ("old", old)):
        (tmp_path / f"{name}.json").write_text(json.dumps(res))
    s = ep.summarise([ep.load(f"{n}={tmp_path / f'{n}.json'}") for n in ("new", "old")])
    for n in ("new", "old"):
        e = s["shifting"][n]
        assert e["own_efficiencies"] == pytest.approx([140 / 150, 120 / 125])
        assert e["work_over_async"] == pytest.approx([160 / 150, 150 / 125])
        assert e["efficiencies"] == pytest.approx([o / w for o, w in zip(e["own_efficiencies"],
                                                                          e["work_over_async"])])
