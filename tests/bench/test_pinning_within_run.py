"""``bench/pinning_within_run.py``: measurements are assigned to the phase that holds them
whole, and the analysis aligns the run's clock to the wall clock by the steps' metrics lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
pin = pytest.importorskip("pinning_within_run")

PHASES = [(0.0, 3.0, "free"), (3.0, 6.0, "pinned"), (6.0, 9.0, "free")]


def test_a_measurement_counts_in_the_phase_that_holds_all_of_it():
    recs = [(2.5, 0.3), (3.4, 0.3), (3.2, 0.3), (8.0, 1.0), (9.5, 0.2)]  # (end, seconds)
    assert pin.classify(recs, PHASES) == {"free": [0, 3], "pinned": [1]}  # 3.2 straddles; 9.5 is after


def test_the_analysis_compares_full_batch_decode_steps_and_micro_batches_per_phase(tmp_path):
    """Two steps finished at 4.0 / 7.0 s on the run's clock, their lines seen at 104.0 / 107.0
    on the wall clock: the phases (wall) shift by 100 s onto the run's measurements."""
    rows = [
        {"event": "StageMeasured", "stage": "decode", "t": 2.0, "features": [10, 40, 4000], "seconds": 0.3},
        {"event": "StageMeasured", "stage": "decode", "t": 2.5, "features": [10, 20, 2000], "seconds": 0.1},  # half
        {"event": "StageMeasured", "stage": "decode", "t": 5.0, "features": [10, 40, 4000], "seconds": 0.27},
        {"event": "StageMeasured", "stage": "train_micro", "t": 5.5, "features": [1, 1000, 1e5], "seconds": 0.5},
        {"event": "StageMeasured", "stage": "aux_micro", "t": 8.5, "features": [1, 1000, 1e5], "seconds": 0.6},
        {"event": "TrainStepFinished", "step": 0, "t": 4.0}, {"event": "TrainStepFinished", "step": 1, "t": 7.0},
    ]
    (tmp_path / "profile.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    wall = [(100.0 + a, 100.0 + b, n) for a, b, n in PHASES]
    out = pin.analyse(tmp_path, wall, {0: 104.0, 1: 107.0})
    d, m = out["decode_step_ms"], out["micro_batch_us_per_token"]
    assert d["count"] == {"free": 1, "pinned": 1} and d["median"] == pytest.approx({"free": 30.0, "pinned": 27.0})
    assert d["pinned_over_free"] == pytest.approx(0.9)
    assert m["median"] == pytest.approx({"pinned": 500.0, "free": 600.0})


def test_phases_move_onto_the_run_clock_by_the_median_offset_and_need_a_seen_step():
    recs = [{"event": "TrainStepFinished", "step": 0, "t": 4.0}, {"event": "TrainStepFinished", "step": 1, "t": 7.0}]
    phases, spread = pin.run_clock_phases(recs, [(103.0, 106.0, "free")], {0: 104.0, 1: 107.2})
    assert phases == [(pytest.approx(2.9), pytest.approx(5.9), "free")] and spread == pytest.approx(0.2)
    with pytest.raises(ValueError, match="align"):
        pin.run_clock_phases(recs, [(0.0, 1.0, "free")], {})


def test_a_step_counts_as_seen_when_its_metrics_line_first_appears(tmp_path):
    metrics, seen = tmp_path / "metrics.jsonl", {}
    pin.note_steps_seen(metrics, seen, 1.0)  # not written yet
    metrics.write_text('{"step": 0}\n')
    pin.note_steps_seen(metrics, seen, 2.0)
    metrics.write_text('{"step": 0}\n{"step": 1}\n')
    pin.note_steps_seen(metrics, seen, 3.0)
    assert seen == {0: 2.0, 1: 3.0}
