"""``bench/real_policies.py``'s arguments: ``--steps`` sets each run's length and is recorded;
bad values and an ``--append`` that would mix run lengths are refused before any run starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
rp = pytest.importorskip("real_policies")


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
