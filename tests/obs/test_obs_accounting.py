"""Device-time accounting: pool sums, borrowed seconds, bubbles and conservation."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bidirl.core.timeline import Activity, Interval
from bidirl.obs.accounting import (
    accounting_metrics,
    borrow_counts,
    borrowed_seconds,
    bubble_seconds,
    check_borrow_flags,
    check_conservation,
    clip_intervals,
    idle_ratios,
    pool_times,
    switch_seconds,
)

BUSY, IDLE, SWITCHING = Activity.BUSY, Activity.IDLE, Activity.SWITCHING


def _run() -> list[Interval]:
    """Device 0 (rollout pool) lends itself to training; device 1 (train pool) to rollout."""
    return [
        Interval(0, "rollout", "rollout", BUSY, 0.0, 4.0, "gen"),
        Interval(0, "rollout", "rollout", IDLE, 4.0, 5.0, "staleness bound"),
        Interval(0, "rollout", "aux_train", SWITCHING, 5.0, 5.5, "C_in", True),
        Interval(0, "rollout", "aux_train", BUSY, 5.5, 9.0, "step 2", True),
        Interval(0, "rollout", "aux_train", SWITCHING, 9.0, 10.0, "C_out", True),
        Interval(1, "train", "train", IDLE, 0.0, 2.0, "waiting for data: batch 1"),
        Interval(1, "train", "train", BUSY, 2.0, 6.0, "step 1"),
        Interval(1, "train", "train", IDLE, 6.0, 7.0, "waiting for data: batch 2"),
        Interval(1, "train", "rollout", SWITCHING, 7.0, 7.5, "C_in", True),
        Interval(1, "train", "rollout", BUSY, 7.5, 10.0, "", True),
    ]


def test_pool_sums_and_ratios():
    times = pool_times(_run())
    assert times["rollout"].busy_s == 7.5
    assert times["rollout"].idle_s == 1.0
    assert times["rollout"].switching_s == 1.5
    assert times["train"].total_s == 10.0
    assert idle_ratios(_run()) == {"rollout": 0.1, "train": 0.3}


def test_borrowed_bubbles_and_switches():
    lent = borrowed_seconds(_run())
    assert lent["train_on_roll"] == 5.0 and lent["train_on_roll_busy"] == 3.5
    assert lent["roll_on_train"] == 3.0 and lent["roll_on_train_busy"] == 2.5
    assert borrow_counts(_run()) == {"roll_on_train": 1, "train_on_roll": 1}
    assert bubble_seconds(_run()) == {
        "rollout": {"staleness bound": 1.0},
        "train": {"waiting for data": 3.0},  # the ": batch n" detail is not a new cause
    }
    assert switch_seconds(_run()) == {"C_in": (2, 1.0), "C_out": (1, 1.0)}


def test_accounting_metrics_are_flat_and_finite():
    metrics = accounting_metrics(_run())
    assert metrics["trainer/idle_ratio"] == 0.3
    assert metrics["rollout/idle_ratio"] == 0.1
    assert metrics["borrow/roll_on_train_s"] == 3.0
    assert metrics["borrow/train_on_roll_count"] == 1.0
    assert metrics["bubble_s/train/waiting for data"] == 3.0
    assert metrics["switch/C_in_count"] == 2.0
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


def test_empty_pool_ratio_is_zero():
    assert accounting_metrics([]) == {
        "borrow/roll_on_train_s": 0.0,
        "borrow/train_on_roll_s": 0.0,
        "borrow/roll_on_train_busy_s": 0.0,
        "borrow/train_on_roll_busy_s": 0.0,
        "borrow/roll_on_train_count": 0.0,
        "borrow/train_on_roll_count": 0.0,
    }


def test_conservation_holds_for_a_correct_run(schedule):
    assert check_conservation(_run(), n_devices=2, wall_s=10.0) == []
    assert check_conservation(schedule(n_rollout=4, n_train=4, wall_s=30.0), 8, 30.0) == []
    assert check_borrow_flags(_run()) == []


def test_conservation_catches_gap_and_overlap():
    run = _run()
    gap = [iv for iv in run if iv.label != "step 1"]  # device 1 loses [2, 6)
    (violation,) = check_conservation(gap, 2, 10.0)
    assert (violation.device, violation.time_s, violation.kind) == (1, 2.0, "gap")
    assert "device 1 at 2.000000s: gap" in str(violation)

    overlap = run + [Interval(0, "rollout", "rollout", BUSY, 3.0, 4.5, "again")]
    kinds = {(v.device, v.time_s, v.kind) for v in check_conservation(overlap, 2, 10.0)}
    assert (0, 3.0, "overlap") in kinds


def test_conservation_catches_edges_and_devices():
    run = _run()
    short = [iv for iv in run if iv.end_s < 10.0 or iv.device == 1]
    assert [(v.device, v.time_s, v.kind) for v in check_conservation(short, 2, 10.0)] == [
        (0, 9.0, "gap")
    ]
    late = run + [Interval(1, "train", "train", IDLE, 10.0, 11.0, "no work")]
    assert [v.kind for v in check_conservation(late, 2, 10.0)] == ["beyond_wall"]
    missing = check_conservation(run, 3, 10.0)
    assert [(v.device, v.time_s, v.kind) for v in missing] == [(2, 0.0, "gap")]
    unknown = check_conservation(run, 1, 10.0)
    assert [(v.device, v.kind) for v in unknown] == [(1, "unknown_device")]
    inverted = run + [Interval(0, "rollout", "rollout", BUSY, 8.0, 7.0)]
    assert "inverted" in {v.kind for v in check_conservation(inverted, 2, 10.0)}
    # rounding at the boundaries is within tolerance
    nudged = [dataclasses.replace(iv, end_s=iv.end_s + 1e-9) for iv in run]
    assert check_conservation(nudged, 2, 10.0) == []


def test_borrow_flag_mismatch_is_reported():
    bad = [Interval(3, "train", "rollout", BUSY, 0.0, 1.0, borrowed=False)]
    (violation,) = check_borrow_flags(bad)
    assert violation.device == 3 and violation.kind == "borrow_flag"


def test_module_stays_pure_python():
    """The simulator calls accounting in tight loops; it must not drag in plotting."""
    code = (
        "import sys, bidirl.obs.accounting, bidirl.obs.trace, bidirl.obs.progress; "
        "heavy = {'matplotlib', 'numpy', 'torch'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@st.composite
def _tilings(draw):
    """Random exact tilings of [0, wall_s] for a few devices, as a correct runtime makes."""
    wall_s = draw(st.floats(1.0, 100.0))
    n_devices = draw(st.integers(1, 4))
    intervals = []
    for device in range(n_devices):
        cuts = sorted(draw(st.lists(st.floats(0.0, 1.0), max_size=8)))
        points = [0.0] + [c * wall_s for c in cuts] + [wall_s]
        pool = "rollout" if device % 2 == 0 else "train"
        for start, end in zip(points, points[1:]):
            activity = draw(st.sampled_from(list(Activity)))
            intervals.append(Interval(device, pool, pool, activity, start, end, "x"))
    return n_devices, wall_s, intervals


@settings(max_examples=60, deadline=None)
@given(_tilings(), st.data())
def test_property_conservation(case, data):
    n_devices, wall_s, intervals = case
    assert check_conservation(intervals, n_devices, wall_s) == []
    total = sum(t.total_s for t in pool_times(intervals).values())
    assert total == pytest.approx(n_devices * wall_s)

    victim = data.draw(st.sampled_from(intervals))
    if victim.duration_s > 1e-3:
        dropped = [iv for iv in intervals if iv is not victim]
        found = check_conservation(dropped, n_devices, wall_s)
        assert any(
            v.device == victim.device
            and v.kind == "gap"
            and v.time_s == pytest.approx(victim.start_s)
            for v in found
        )
        doubled = intervals + [victim]
        found = check_conservation(doubled, n_devices, wall_s)
        assert any(v.device == victim.device and v.kind == "overlap" for v in found)



def _replay(intervals, n_devices: int, until: float):
    """A ``Recorder`` told every change of ``intervals`` that happens by ``until``."""
    from bidirl.frame.device_time import Recorder

    rec = Recorder({d: "rollout" if d % 2 == 0 else "train" for d in range(n_devices)}, keep=False)
    for iv in intervals:
        if iv.start_s <= until:
            rec.set((iv.device,), iv.start_s, iv.activity, iv.role, iv.label, iv.borrowed)
    return rec


@settings(max_examples=60, deadline=None)
@given(_tilings(), st.floats(0.0, 1.0))
def test_the_loop_figures_taken_before_a_final_validation_conserve_device_time(case, frac):
    """A run's figures are taken when its training loop ends, before the final validation:
    the intervals cut there tile ``[0, t]``, and the recorder's tally at ``t`` has the same
    seconds per pool and activity (and leaves the recorder as it was)."""
    n_devices, wall_s, intervals = case
    t = frac * wall_s
    cut = clip_intervals(intervals, t)
    if t > 0:
        assert check_conservation(cut, n_devices, t) == []
    rec = _replay(intervals, n_devices, t)
    at_t = rec.tally_at(t)
    for pool, seconds in at_t.items():
        for k, activity in enumerate((Activity.BUSY, Activity.IDLE, Activity.SWITCHING)):
            want = sum(iv.duration_s for iv in cut if iv.pool == pool and iv.activity == activity)
            assert seconds[k] == pytest.approx(want, abs=1e-6)
    full = _replay(intervals, n_devices, wall_s)
    full.finish(wall_s)
    assert rec.tally_at(t) == at_t
    assert sum(map(sum, full.tally.values())) == pytest.approx(n_devices * wall_s)
