"""Timeline PNG: valid file, small and large runs, dense rows drawn per pixel column.

How long a 100k-interval plot takes is measured by ``bench/timeline_plot.py``, not here.
"""

from __future__ import annotations

import pytest

from bidirl.core.timeline import Activity, Interval
from bidirl.obs.timeline_plot import (
    _ROW_PIXELS,
    _row_spans,
    _shown_devices,
    category_of,
    plot_timeline,
    utilisation,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000


def test_small_run_png(tmp_path, schedule):
    out = plot_timeline(
        schedule(n_rollout=2, n_train=2, wall_s=8.0), tmp_path / "a" / "t.png", title="unit"
    )
    assert out == str(tmp_path / "a" / "t.png")
    _assert_png(tmp_path / "a" / "t.png")


def test_empty_run_still_writes_png(tmp_path):
    plot_timeline([], tmp_path / "empty.png")
    _assert_png(tmp_path / "empty.png")


def test_categories():
    busy, idle, switching = Activity.BUSY, Activity.IDLE, Activity.SWITCHING
    assert category_of(Interval(0, "rollout", "rollout", busy, 0, 1)) == "rollout"
    assert category_of(Interval(0, "train", "rollout", busy, 0, 1, "", True)) == (
        "rollout_borrowed"
    )
    assert category_of(Interval(0, "rollout", "aux_train", busy, 0, 1, "", True)) == (
        "aux_train_borrowed"
    )
    assert category_of(Interval(0, "train", "train", busy, 0, 1)) == "train"
    assert category_of(Interval(0, "train", "rollout", switching, 0, 1, "C_in", True)) == (
        "switching"
    )
    assert category_of(Interval(0, "train", "train", idle, 0, 1)) == "idle"


def test_utilisation_fractions_sum_to_one(schedule):
    intervals = schedule(n_rollout=3, n_train=1, wall_s=10.0)
    edges, fractions = utilisation(intervals, [0, 1, 2], 10.0, bins=50)
    assert len(edges) == 51
    total = sum(fractions.values())
    assert total == pytest.approx([1.0] * 50, abs=1e-9)


def test_rows_are_shared_between_pools():
    pools = {"rollout": list(range(1000)), "train": list(range(1000, 1024))}
    shown = _shown_devices(pools, 64)
    assert shown == {"rollout": list(range(63)), "train": [1000]}
    assert _shown_devices({"rollout": [0, 1], "train": [2]}, 64) == {
        "rollout": [0, 1],
        "train": [2],
    }


def test_max_devices_validated(tmp_path):
    with pytest.raises(ValueError, match="max_devices"):
        plot_timeline([], tmp_path / "x.png", max_devices=0)


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_rollout=512, n_train=512, wall_s=300.0, mean_s=30.0),  # many devices
        dict(n_rollout=4, n_train=4, wall_s=200.0, mean_s=0.08),  # few dense rows
    ],
    ids=["1024-devices", "dense-rows"],
)
def test_large_run_png(tmp_path, schedule, shape):
    intervals = schedule(**shape, seed=2)
    assert len(intervals) >= 10_000
    plot_timeline(intervals, tmp_path / "big.png", title="big", max_devices=64)
    _assert_png(tmp_path / "big.png")


def test_only_shown_devices_get_rows(schedule):
    intervals = schedule(n_rollout=6, n_train=2, wall_s=20.0)
    tagged = [(iv, category_of(iv)) for iv in intervals]
    spans = _row_spans(tagged, {0: 0, 6: 1}, 20.0)  # device 0 -> row 0, device 6 -> row 1
    assert {row for row, _ in spans} == {0, 1}
    assert {cat for row, cat in spans if row == 1} <= {"train", "rollout_borrowed", "switching",
                                                        "idle"}


def test_dense_row_shows_one_category_per_pixel_column(schedule):
    """A row with more intervals than pixels is drawn as runs of whole pixel columns that
    tile the row exactly, each in the category the device spent most of it in."""
    wall = 1000.0
    intervals = schedule(n_rollout=1, n_train=0, wall_s=wall, mean_s=0.08, seed=3)
    assert len(intervals) > _ROW_PIXELS
    spans = _row_spans([(iv, category_of(iv)) for iv in intervals], {0: 0}, wall)
    runs = sorted((s, w, cat) for (_, cat), xs in spans.items() for s, w in xs)
    px = wall / _ROW_PIXELS
    assert runs[0][0] == 0.0 and runs[-1][0] + runs[-1][1] == pytest.approx(wall)
    for (s, w, _), (s2, _, _) in zip(runs, runs[1:], strict=False):
        assert s + w == pytest.approx(s2)  # contiguous, no overlap
        assert w / px == pytest.approx(round(w / px))  # whole pixel columns
    assert len(runs) <= _ROW_PIXELS
    # the most common category in the schedule (busy, 60 % of draws) wins most columns
    width = {cat: sum(w for s, w, c in runs if c == cat) for cat in {c for _, _, c in runs}}
    assert max(width, key=width.get) == "rollout"
