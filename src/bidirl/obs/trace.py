"""Chrome / Perfetto trace of device time: one track per device, one slice per interval.

Engineers debug bubbles by looking at them, so every run writes ``trace.json`` that opens
in ``ui.perfetto.dev`` or ``chrome://tracing``.  The file uses the Chrome JSON trace
format (which Perfetto imports natively)::

    {"displayTimeUnit": "ms", "traceEvents": [
      {"ph": "M", "name": "process_name", ...},          # metadata first
      {"ph": "M", "name": "thread_name", "tid": 4, "args": {"name": "dev 3 [train pool]"}},
      {"ph": "X", "name": "train step 4", "ts": 1500000.0, "dur": 250000.0, "tid": 4, ...},
      {"ph": "X", "name": "borrowed: rollout", "args": {"borrowed": true, ...}, ...},
      ...]}

Design choices, and why:

* ``tid = device + 1``: Perfetto's importer treats thread id 0 as the kernel's swapper
  thread in some code paths; the real device number is in the track name and in
  ``args.device`` of every slice.
* Tracks are ordered rollout pool first, then train pool, then by device number
  (``thread_sort_index``), matching the timeline PNG.
* The bytes are deterministic (sorted keys, intervals sorted, times rounded to the
  nanosecond) so a trace's sha256 can be asserted in tests and compared between the
  simulated and the real runtime on the same schedule.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bidirl.core.timeline import Activity, Interval

__all__ = ["chrome_trace_bytes", "counter_event", "instant_event", "slice_name", "tid_of", "trace_sha256",
           "write_chrome_trace"]

PID = 1
POOL_ORDER = ("rollout", "train")
BORROWED_PREFIX = "borrowed: "
# Chrome's reserved colour names; Perfetto ignores them, chrome://tracing uses them.
_CNAME = {Activity.IDLE: "grey", Activity.SWITCHING: "terrible"}
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond so float noise never shows."""
    value = round(float(seconds) * 1e6, 3)
    return value + 0.0  # normalise -0.0 so equal traces hash equally


def tid_of(device: int) -> int:
    """Thread id used for a device's track (see the module docstring for the +1)."""
    return int(device) + 1


def slice_name(interval: Interval) -> str:
    """Human name of one interval's slice: ``rollout``, ``train step 4``, ``C_in``, ``idle``.

    Busy slices are named by role plus label (the label is not repeated when it already
    starts with the role); switching slices by their label (``C_in`` / ``C_out``); idle
    slices are all ``idle`` so bubbles look alike and their cause lives in ``args.cause``.
    """
    activity = Activity(interval.activity)
    label = interval.label.strip()
    if activity is Activity.IDLE:
        name = "idle"
    elif activity is Activity.SWITCHING:
        name = label or f"switch {interval.role}"
    elif not label or label.startswith(interval.role):
        name = label or interval.role
    else:
        name = f"{interval.role} {label}"
    return BORROWED_PREFIX + name if interval.borrowed else name


def _slice_event(interval: Interval) -> dict[str, Any]:
    if interval.end_s < interval.start_s:
        raise ValueError(
            f"interval on device {interval.device} ends before it starts "
            f"({interval.start_s} > {interval.end_s})"
        )
    activity = Activity(interval.activity)
    args: dict[str, Any] = {
        "activity": activity.value,
        "borrowed": bool(interval.borrowed),
        "device": interval.device,
        "pool": interval.pool,
        "role": interval.role,
    }
    if interval.label:
        args["cause" if activity is Activity.IDLE else "label"] = interval.label
    event: dict[str, Any] = {
        "args": args,
        "cat": activity.value,
        "dur": _us(interval.end_s - interval.start_s),
        "name": slice_name(interval),
        "ph": "X",
        "pid": PID,
        "tid": tid_of(interval.device),
        "ts": _us(interval.start_s),
    }
    if activity in _CNAME:
        event["cname"] = _CNAME[activity]
    return event


def _track_names(
    intervals: Sequence[Interval], device_names: Mapping[int, str] | None
) -> dict[int, tuple[int, str]]:
    """Device -> (sort rank, track name); a device's pool comes from its intervals."""
    pools: dict[int, set[str]] = {}
    for iv in intervals:
        pools.setdefault(iv.device, set()).add(iv.pool)
    for device in device_names or {}:
        pools.setdefault(int(device), set())
    tracks: dict[int, tuple[int, str]] = {}
    for device, pool_set in pools.items():
        pool = "/".join(sorted(pool_set)) or "unknown"
        rank = POOL_ORDER.index(pool) if pool in POOL_ORDER else len(POOL_ORDER)
        tracks[device] = (rank, str((device_names or {}).get(device, f"dev {device} [{pool} pool]")))
    return tracks


def _metadata_events(
    process_name: str, tracks: Mapping[int, tuple[int, str]]
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"args": {"name": process_name}, "name": "process_name", "ph": "M", "pid": PID, "tid": 0}
    ]
    order = sorted(tracks, key=lambda d: (tracks[d][0], d))
    for index, device in enumerate(order):
        for name, args in (("thread_name", {"name": tracks[device][1]}), ("thread_sort_index", {"sort_index": index})):
            events.append({"args": args, "name": name, "ph": "M", "pid": PID, "tid": tid_of(device)})
    return events


def _check_finite(value: Any, where: str) -> None:
    """Reject NaN/inf anywhere in an event: Chrome's JSON parser refuses them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"non-finite number in trace event {where}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")


def _extra_event(event: Mapping[str, Any]) -> dict[str, Any]:
    if "ph" not in event or "name" not in event:
        raise ValueError(f"extra trace event needs 'ph' and 'name': {event!r}")
    out = dict(event)
    out.setdefault("pid", PID)
    _check_finite(out, repr(out.get("name")))
    return out


def instant_event(
    name: str, t_s: float, *, device: int | None = None, args: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An instant marker (e.g. ``weights v5 published``) for ``extra_events``.

    With ``device`` it sits on that device's track, otherwise it spans the whole process.
    """
    event: dict[str, Any] = {"name": name, "ph": "i", "pid": PID, "ts": _us(t_s)}
    if device is None:
        event.update(s="p", tid=0)
    else:
        event.update(s="t", tid=tid_of(device))
    if args:
        event["args"] = dict(args)
    return event


def counter_event(name: str, t_s: float, values: Mapping[str, float]) -> dict[str, Any]:
    """A counter sample (e.g. ``queue`` -> ``{"groups": 12}``) drawn as its own track."""
    return {"args": {k: float(v) for k, v in values.items()}, "name": name, "ph": "C", "pid": PID, "tid": 0,
            "ts": _us(t_s)}


def _sort_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    return (event.get("pid", PID), event.get("tid", 0), float(event.get("ts", 0.0)),
            -float(event.get("dur", 0.0)),  # enclosing slices before nested ones
            str(event.get("ph", "")), str(event.get("name", "")))


def chrome_trace_bytes(
    intervals: Iterable[Interval],
    *,
    process_name: str = "bidirl",
    extra_events: Iterable[Mapping[str, Any]] = (),
    device_names: Mapping[int, str] | None = None,
) -> bytes:
    """The exact bytes ``write_chrome_trace`` writes: metadata, then events in time order.

    One event per line keeps large traces diffable and greppable while staying valid JSON.
    """
    # Sort on every field so equal inputs in any order give equal bytes; the event sort
    # below is stable, so extra events keep the caller's order among equal keys.
    ivs = sorted(intervals, key=lambda iv: (iv.device, iv.start_s, iv.end_s, iv.label, iv.role,
                                            getattr(iv.activity, "value", iv.activity), iv.pool, iv.borrowed))
    metadata = _metadata_events(process_name, _track_names(ivs, device_names))
    events = [_slice_event(iv) for iv in ivs]
    events.extend(_extra_event(e) for e in extra_events)
    events.sort(key=_sort_key)
    lines = [_ENCODER.encode(e) for e in metadata + events]
    text = '{"displayTimeUnit":"ms","traceEvents":[\n' + ",\n".join(lines) + "\n]}\n"
    return text.encode("utf-8")


def trace_sha256(intervals: Iterable[Interval], **options: Any) -> str:
    """sha256 hex digest of the trace bytes, without writing a file.

    ``options``: the keyword arguments of ``chrome_trace_bytes``.
    """
    return hashlib.sha256(chrome_trace_bytes(intervals, **options)).hexdigest()


def write_chrome_trace(intervals: Iterable[Interval], path: str | os.PathLike[str], **options: Any) -> str:
    """Write a Chrome/Perfetto trace JSON to ``path``; return the sha256 of its bytes.

    ``options``: the keyword arguments of ``chrome_trace_bytes``.  The file is written to
    a sibling temp file and renamed, so a crash mid-write never leaves a truncated trace
    that the UI would refuse to open.
    """
    data = chrome_trace_bytes(intervals, **options)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return hashlib.sha256(data).hexdigest()
