"""``bench/first_microbatch.py`` on hand-made run directories with known numbers (no run, no Ray)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
fm = pytest.importorskip("first_microbatch")


def _run(root: Path, name: str, primary: list[tuple[float, float]], aux: list[tuple[float, float]]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    rows = [{"t": 0.0, "event": "StageMeasured", "stage": "weight_sync", "features": [1.0], "seconds": 0.03}]
    rows += [{"t": i + 1.0, "event": "StageMeasured", "stage": "train_micro", "features": [1.0, t, t * 100.0],
              "seconds": s} for i, (t, s) in enumerate(primary)]
    rows += [{"t": i + 1.5, "event": "StageMeasured", "stage": "aux_micro", "features": [1.0, t, t * 100.0],
              "seconds": s} for i, (t, s) in enumerate(aux)]
    (d / "profile.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_the_first_micro_batch_is_priced_against_the_runs_steady_rate(tmp_path):
    # steady: 1 ms a token from the fourth micro-batch on; the first costs 3 ms a token
    primary = [(1000.0, 3.0), (1000.0, 1.5), (500.0, 0.6)] + [(1000.0, 1.0), (800.0, 0.8), (1200.0, 1.2)]
    run = _run(tmp_path, "balanced-00-bidirl", primary, aux=[(500.0, 1.0), (500.0, 0.5)])
    got = fm.first_over_typical(run)
    assert got["primary_first"] == pytest.approx(3.0)
    assert got["aux_first"] == pytest.approx(2.0)


def test_medians_per_workload_and_policy_and_the_json(tmp_path, capsys):
    steady = [(1000.0, 1.0)] * 4
    _run(tmp_path / "a", "train-heavy-00-async", [(1000.0, 1.2)] + steady, [])
    _run(tmp_path / "a", "train-heavy-01-async", [(1000.0, 1.4)] + steady, [])
    _run(tmp_path / "b", "train-heavy-00-bidirl", [(1000.0, 1.1)] + steady, [(100.0, 0.3)])
    out = tmp_path / "out.json"
    assert fm.main([str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["train-heavy async"]["primary_first_median"] == pytest.approx(1.3)
    assert data["train-heavy async"]["primary_first_max"] == pytest.approx(1.4)
    assert data["train-heavy async"]["aux_first_median"] is None
    assert data["train-heavy bidirl"]["aux_first_median"] == pytest.approx(3.0)
    assert "train-heavy" in capsys.readouterr().out


def test_a_run_too_short_for_a_steady_rate_reports_nothing(tmp_path):
    run = _run(tmp_path, "balanced-00-async", [(1000.0, 2.0), (1000.0, 1.0)], [])
    assert fm.first_over_typical(run) == {"primary_first": None, "aux_first": None}


def test_bad_input_names_what_is_wrong(tmp_path):
    _run(tmp_path, "not-a-run", [(1000.0, 1.0)] * 5, [])
    with pytest.raises(ValueError, match="WORKLOAD-NN-POLICY"):
        fm.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="does not exist"):
        fm.main([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no profile.jsonl"):
        fm.main([str(tmp_path / "empty")])
