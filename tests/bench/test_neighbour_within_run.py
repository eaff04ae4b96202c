"""``bench/neighbour_within_run.py``: each full-batch decode measurement is counted in the
neighbour phase that holds it whole and by what the training device did meanwhile."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
nb = pytest.importorskip("neighbour_within_run")

PHASES = [(0.0, 3.0, "off"), (3.0, 6.0, "spin"), (6.0, 9.0, "off")]


def _trace(busy: list[tuple[float, float]]) -> dict:
    return {"traceEvents": [{"ph": "X", "tid": 2, "ts": a * 1e6, "dur": (b - a) * 1e6,
                             "name": "train step", "args": {"activity": "busy"}} for a, b in busy]}


def test_decode_steps_are_split_by_neighbour_phase_and_trainer_activity(tmp_path):
    """Steps finished at 4.0 / 7.0 s on the run's clock, seen at 104.0 / 107.0 on the wall
    clock; the training device trains over 6.5-8.0 s."""
    def decode(t: float, seqs: int, seconds: float) -> dict:  # 10 steps of ``seqs`` sequences
        return {"event": "StageMeasured", "stage": "decode", "t": t, "features": [10, 10 * seqs, 400],
                "seconds": seconds}

    rows = [
        decode(2.0, 2, 0.05),  # off, trainer idle
        decode(2.5, 1, 0.01),  # half a batch: left out
        decode(4.0, 2, 0.045),  # spin, trainer idle
        decode(6.1, 2, 0.2),  # straddles the switch at 6.0
        decode(7.0, 2, 0.06),  # off, trainer busy
        decode(6.55, 2, 0.1),  # the trainer busy for half of it: left out
        {"event": "TrainStepFinished", "step": 0, "t": 4.0}, {"event": "TrainStepFinished", "step": 1, "t": 7.0},
    ]
    (tmp_path / "profile.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "trace.json").write_text(json.dumps(_trace([(6.5, 8.0)])))
    wall = [(100.0 + a, 100.0 + b, n) for a, b, n in PHASES]
    out = nb.analyse(tmp_path, wall, {0: 104.0, 1: 107.0})
    assert out["count"] == {"off / trainer idle": 1, "spin / trainer idle": 1, "off / trainer busy": 1}
    assert out["decode_step_ms"] == pytest.approx({"off / trainer idle": 5.0, "spin / trainer idle": 4.5,
                                                   "off / trainer busy": 6.0})
    assert out["spin_over_off_trainer_idle"] == pytest.approx(0.9)
    assert out["trainer_busy_over_idle_spin_off"] == pytest.approx(1.2)


def test_a_run_whose_steps_were_never_seen_cannot_be_aligned(tmp_path):
    (tmp_path / "profile.jsonl").write_text(json.dumps({"event": "TrainStepFinished", "step": 0, "t": 1.0}))
    (tmp_path / "trace.json").write_text(json.dumps(_trace([])))
    with pytest.raises(ValueError, match="align"):
        nb.analyse(tmp_path, [(0.0, 1.0, "off")], {})
