"""``bench/peer_trl.py``'s report: what it summarises and plots from the pairs' records.

TRL is an optional extra, so this drives the summary and the plot on records shaped like
the two sides' (no TRL, no run): ratios per pair, validation first/last averaged over
pairs, and a PNG with a validation panel only when a side validated.
"""

from __future__ import annotations

import statistics

import pytest

from bench import peer_trl


def _side(tps: float, rewards: list[float], vals: list[tuple[int, float]]) -> dict:
    return {"completion_tokens_per_s": tps, "seconds_per_step": 1.0, "loop_wall_s": float(len(rewards)),
            "steps": len(rewards), "rewards": rewards,
            "val_scores": [{"step": s, "score": v} for s, v in vals]}


def _pairs() -> list[dict]:
    return [{"trl": _side(100.0, [0.1, 0.2, 0.3], [(0, 0.3), (3, 0.4)]),
             "bidirl": _side(150.0, [0.1, 0.25, 0.3], [(0, 0.3), (3, 0.5)])},
            {"trl": _side(200.0, [0.1, 0.2], [(0, 0.3), (3, 0.6)]),
             "bidirl": _side(100.0, [0.2, 0.2], [(0, 0.3), (3, 0.7)])}]


def test_summary_ratios_and_validation_are_per_pair():
    s = peer_trl.summarise(_pairs())
    assert s["ratios"] == [1.5, 0.5]
    assert s["ratio_completion_tokens_per_s"] == statistics.median([1.5, 0.5])
    assert s["bidirl"]["val_first"] == pytest.approx(0.3) and s["bidirl"]["val_last"] == pytest.approx(0.6)
    assert s["trl"]["val_last"] == pytest.approx(0.5)


def test_summary_without_validation_says_none():
    pairs = _pairs()
    for p in pairs:
        for side in ("trl", "bidirl"):
            p[side]["val_scores"] = []
    s = peer_trl.summarise(pairs)
    assert s["bidirl"]["val_first"] is None and s["trl"]["val_last"] is None


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    result = {"settings": {"model_size": "small"}, **peer_trl.summarise(_pairs()), "runs": _pairs()}
    png = peer_trl.plot(result, tmp_path / "peer.png")
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
