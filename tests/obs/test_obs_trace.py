"""The Chrome/Perfetto trace: structure, durations, borrowed flags and byte determinism."""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest

from bidirl.core.timeline import Activity, Interval
from bidirl.obs.trace import (
    counter_event,
    instant_event,
    slice_name,
    tid_of,
    trace_sha256,
    write_chrome_trace,
)

BUSY, IDLE, SWITCHING = Activity.BUSY, Activity.IDLE, Activity.SWITCHING


def _two_pool_run() -> list[Interval]:
    return [
        Interval(0, "rollout", "rollout", BUSY, 0.0, 1.5, "gen batch 1"),
        Interval(0, "rollout", "rollout", IDLE, 1.5, 2.0, "staleness bound"),
        Interval(1, "train", "train", IDLE, 0.0, 0.25, "waiting for data: batch 1"),
        Interval(1, "train", "train", BUSY, 0.25, 1.0, "step 4"),
        Interval(1, "train", "rollout", SWITCHING, 1.0, 1.1, "C_in", borrowed=True),
        Interval(1, "train", "rollout", BUSY, 1.1, 1.9, "", borrowed=True),
        Interval(1, "train", "rollout", SWITCHING, 1.9, 2.0, "C_out", borrowed=True),
    ]


def _load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_trace_structure(tmp_path):
    path = tmp_path / "run" / "trace.json"
    digest = write_chrome_trace(_two_pool_run(), path, process_name="unit")
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    trace = _load(path)
    events = trace["traceEvents"]

    process = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert process[0]["args"]["name"] == "unit"
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads == {tid_of(0): "dev 0 [rollout pool]", tid_of(1): "dev 1 [train pool]"}

    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 7
    assert {e["tid"] for e in slices} == set(threads)  # every slice on a named track
    names = [e["name"] for e in slices if e["tid"] == tid_of(1)]
    assert names == [
        "idle",
        "train step 4",
        "borrowed: C_in",
        "borrowed: rollout",
        "borrowed: C_out",
    ]
    by_name = {e["name"]: e for e in slices}
    assert by_name["train step 4"]["ts"] == 250000.0
    assert by_name["train step 4"]["dur"] == 750000.0
    assert by_name["rollout gen batch 1"]["dur"] == 1500000.0
    assert by_name["idle"]["args"]["cause"] == "waiting for data: batch 1"
    for event in slices:
        assert event["args"]["borrowed"] is event["name"].startswith("borrowed:")
        assert event["args"]["device"] == event["tid"] - 1


def test_durations_sum_to_device_time(tmp_path, schedule):
    intervals = schedule(n_rollout=3, n_train=2, wall_s=7.0)
    write_chrome_trace(intervals, tmp_path / "t.json")
    trace = _load(tmp_path / "t.json")
    per_tid: dict[int, float] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            per_tid[e["tid"]] = per_tid.get(e["tid"], 0.0) + e["dur"]
    assert len(per_tid) == 5
    for total_us in per_tid.values():
        assert math.isclose(total_us, 7.0e6, abs_tol=1.0)


def test_slice_names():
    assert slice_name(Interval(0, "rollout", "rollout", BUSY, 0, 1)) == "rollout"
    assert slice_name(Interval(0, "train", "train", BUSY, 0, 1, "train step 2")) == ("train step 2")
    assert slice_name(Interval(0, "train", "train", IDLE, 0, 1, "no work")) == "idle"
    assert slice_name(Interval(0, "rollout", "aux_train", SWITCHING, 0, 1, "C_in", True)) == (
        "borrowed: C_in"
    )


def test_sha_is_deterministic_and_order_independent(tmp_path, schedule):
    intervals = schedule(n_rollout=2, n_train=2, wall_s=5.0, seed=3)
    shuffled = list(intervals)
    random.Random(1).shuffle(shuffled)
    digest = trace_sha256(intervals)
    assert trace_sha256(shuffled) == digest
    assert write_chrome_trace(shuffled, tmp_path / "a.json") == digest
    write_chrome_trace(intervals, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    # float noise below a nanosecond does not change the bytes; a real change does
    nudged = [
        Interval(
            iv.device,
            iv.pool,
            iv.role,
            iv.activity,
            iv.start_s + 1e-13,
            iv.end_s,
            iv.label,
            iv.borrowed,
        )
        for iv in intervals
    ]
    assert trace_sha256(nudged) == digest
    assert trace_sha256(intervals[1:]) != digest


def test_extra_events_and_device_names(tmp_path):
    extra = [
        instant_event("weights v1 published", 1.0),
        instant_event("reclaim", 1.9, device=1, args={"reason": "train queue"}),
        counter_event("queue", 0.5, {"groups": 3}),
    ]
    path = tmp_path / "trace.json"
    write_chrome_trace(
        _two_pool_run(), path, extra_events=extra, device_names={0: "gpu0 (vllm)", 7: "spare"}
    )
    events = _load(path)["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads[tid_of(0)] == "gpu0 (vllm)"
    assert threads[tid_of(7)] == "spare"  # named devices get a track even when empty
    phases = {e["name"]: e["ph"] for e in events}
    assert phases["weights v1 published"] == "i" and phases["queue"] == "C"
    reclaim = next(e for e in events if e["name"] == "reclaim")
    assert reclaim["tid"] == tid_of(1) and reclaim["ts"] == 1.9e6


def test_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="device 2"):
        trace_sha256([Interval(2, "train", "train", BUSY, 2.0, 1.0)])
    with pytest.raises(ValueError, match="non-finite"):
        trace_sha256([], extra_events=[counter_event("q", 0.0, {"x": float("nan")})])
    with pytest.raises(ValueError, match="'ph'"):
        trace_sha256([], extra_events=[{"name": "no phase"}])
