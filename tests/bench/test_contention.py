"""``bench/contention.py`` on small hand-made run directories with known numbers.

Each run is a ``trace.json`` with a few spans per device, a ``profile.jsonl`` of decode chunks
and training micro-batches placed where the other device is busy or idle, and a
``summary.json``; no run, no Ray.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
contention = pytest.importorskip("contention")

TOKENS = 1000


def _span(tid: int, name: str, start: float, end: float, role: str, activity: str = "busy") -> dict:
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": start * 1e6, "dur": (end - start) * 1e6,
            "args": {"activity": activity, "role": role, "device": tid - 1}}


def _chunks(stage: str, start: float, n: int, seconds: float, features: list[float]) -> list[dict]:
    """``n`` back-to-back measurements of ``stage`` from ``start``, each ``seconds`` long."""
    return [{"t": start + (i + 1) * seconds, "event": "StageMeasured", "stage": stage,
             "features": features, "seconds": seconds} for i in range(n)]


def _decode(start: float, n: int, batch: int, ms_per_step: float, steps: int = 100) -> list[dict]:
    return _chunks("decode", start, n, steps * ms_per_step / 1000, [steps, steps * batch, 0])


def _write(run: Path, spans: list[dict], profile: list[dict], summary: dict) -> Path:
    run.mkdir(parents=True)
    (run / "trace.json").write_text(json.dumps({"traceEvents": spans}))
    (run / "profile.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                               [{"t": 0.0, "event": "WeightsSynced"}, *profile]))
    (run / "summary.json").write_text(json.dumps({"devices": 2, "tokens_trained": TOKENS, **summary}))
    return run


def _rollout_bound(run: Path, policy: str = "async", tps: float = 30.0) -> Path:
    """Device 0 rolls out over [0, 40]; device 1 trains over [10, 20] only.

    Decode at batch 4: 5 ms/step alone, 6 ms/step beside training (x1.2); at batch 2: 4 -> 5
    (x1.25); batch 1 has too few chunks; one chunk straddles the training span (half overlap).
    """
    spans = [_span(1, "rollout", 0, 40, "rollout"),
             _span(2, "idle", 0, 10, "train", "idle"), _span(2, "train step 0", 10, 20, "train"),
             _span(2, "idle", 20, 40, "train", "idle")]
    profile = [*_decode(0.0, 6, 4, 5.0), *_decode(4.0, 5, 2, 4.0), *_decode(6.0, 2, 1, 3.0),  # alone
               *_decode(9.7, 1, 4, 6.0),  # [9.7, 10.3]: half beside training
               *_decode(11.0, 6, 4, 6.0), *_decode(15.0, 5, 2, 5.0), *_decode(17.6, 2, 1, 9.0),  # beside
               *_decode(21.0, 3, 4, 5.0)]  # alone again
    ideal = TOKENS / ((40 + 10) / 2)
    return _write(run, spans, profile, {"policy": policy, "throughput_tokens_per_s": tps,
                                        "ideal_tokens_per_s": ideal, "efficiency": tps / ideal})


def test_overlap_classification():
    assert contention.side(0.95) == "busy" and contention.side(0.9) == "busy"
    assert contention.side(0.1) == "alone" and contention.side(0.0) == "alone"
    assert contention.side(0.5) is None
    merged = contention.merge([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)])
    assert merged == [(0.0, 2.0), (3.0, 4.0)]
    assert contention.overlap(1.5, 3.5, merged) == pytest.approx(1.0)
    # both devices rolling out: a decode chunk cannot be placed on either
    both = {0: [(0.0, 10.0)], 1: [(0.0, 10.0)]}
    assert contention.device_of(1.0, 2.0, both) is None
    assert contention.device_of(1.0, 2.0, {0: [(0.0, 10.0)], 1: []}) == 0


def test_decode_slowdown_per_batch_and_weighted(tmp_path):
    run = _rollout_bound(tmp_path / "w-00-async")
    ss, unplaced = contention.samples(contention.load_profile(run), contention.load_spans(run), "decode")
    assert unplaced == 0 and {s.device for s in ss} == {0}
    straddling = [s for s in ss if 0.4 < s.other_busy < 0.6]
    assert len(straddling) == 1 and contention.side(straddling[0].other_busy) is None
    res = contention.slowdown(ss)
    per = {k["key"]: k for k in res["per_key"]}
    assert per[4]["n_busy"] == 6 and per[4]["n_alone"] == 9
    assert per[4]["median_busy"] == pytest.approx(6.0) and per[4]["median_alone"] == pytest.approx(5.0)
    assert per[2]["ratio"] == pytest.approx(1.25) and per[2]["counted"]
    assert not per[1]["counted"]  # 2 chunks a side: left out of the weighted figure
    w4, w2 = 15 * 100, 10 * 100  # steps of the counted chunks, both sides
    assert res["slowdown"] == pytest.approx((1.2 * w4 + 1.25 * w2) / (w4 + w2))


def test_corrected_bound_scales_alone_seconds(tmp_path):
    r = contention.analyse_run(_rollout_bound(tmp_path / "w-00-async"))
    s = r["decode_slowdown"]
    assert r["train_slowdown"] is None  # no micro-batches: the trainer is not scaled
    assert r["seconds"]["0"] == pytest.approx({"busy_s": 40.0, "alone_s": 30.0})
    assert r["seconds"]["1"] == pytest.approx({"busy_s": 10.0, "alone_s": 0.0})
    b = r["bound"]
    assert b["bound"] == pytest.approx(TOKENS / 25)  # the summary's bound, from the trace
    assert b["corrected_busy_s"] == pytest.approx(50 + (s - 1) * 30)
    assert b["corrected_bound"] == pytest.approx(TOKENS / ((50 + (s - 1) * 30) / 2))


def test_train_slowdown_and_trainer_alone_seconds(tmp_path):
    """Device 1 trains over [0, 30], device 0 rolls out over [0, 10]: train 2 ms/token beside, 1 alone."""
    spans = [_span(1, "rollout", 0, 10, "rollout"), _span(1, "idle", 10, 30, "rollout", "idle"),
             _span(2, "train step 0", 0, 30, "train")]
    profile = [*_chunks("train_micro", 1.0, 5, 1.0, [1, 500, 0]),  # 2e-3 s/token beside rollout
               *_chunks("train_micro", 12.0, 6, 1.0, [1, 1000, 0])]  # 1e-3 alone
    run = _write(tmp_path / "t-async", spans, profile, {"policy": "async", "throughput_tokens_per_s": 20.0,
                                                        "ideal_tokens_per_s": TOKENS / 20})
    r = contention.analyse_run(run)
    assert r["train_slowdown"] == pytest.approx(2.0)
    assert r["decode_slowdown"] is None
    assert r["bound"]["corrected_busy_s"] == pytest.approx(40 + (2.0 - 1) * 20)
    assert r["bound"]["corrected_bound"] == pytest.approx(TOKENS / 30)


def test_pair_efficiency_uncorrected_and_corrected(tmp_path, capsys):
    _rollout_bound(tmp_path / "w-00-async", "async", 30.0)
    _rollout_bound(tmp_path / "w-00-bidirl", "bidirl", 36.0)
    out = tmp_path / "out.json"
    assert contention.main([str(tmp_path), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (pair,) = data["pairs"]
    assert pair["workload"] == "w" and pair["pair"].endswith("w-00")
    assert pair["bidirl_efficiency"] == pytest.approx(36.0 / 40)
    a = next(r for r in data["runs"] if r["policy"] == "async")
    assert pair["bidirl_efficiency_corrected"] == pytest.approx(36.0 / a["bound"]["corrected_bound"])
    assert pair["bidirl_efficiency_corrected"] > pair["bidirl_efficiency"]
    assert data["workloads"]["w"]["pairs"] == 1
    assert "w-00" in capsys.readouterr().out


def test_missing_profile_names_the_directory(tmp_path, capsys):
    run = _rollout_bound(tmp_path / "broken-async")
    (run / "profile.jsonl").unlink()
    with pytest.raises(contention.RunDataError, match="broken-async: no profile.jsonl"):
        contention.analyse_run(run)
    assert contention.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(run) in err and "profile.jsonl" in err
