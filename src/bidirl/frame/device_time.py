"""The one device-time recorder: every device's activity as intervals tiling ``[0, wall]``.

The simulator and the real runtime both call ``set`` whenever a device changes what it
does; the same conservation check therefore applies to both worlds.

Each device is always in exactly one state ``(activity, role, label, borrowed)``; a
change closes the running interval.  Per-pool busy / idle / switching seconds are
tallied as intervals close (so they exist even when intervals are not kept), and a
sha256 over a canonical line per interval is kept as a stream (the run's ``trace_sha256``,
the same whether intervals are kept or not).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from bidirl.core.timeline import Activity, Interval

BUSY, IDLE, SWITCHING = Activity.BUSY, Activity.IDLE, Activity.SWITCHING
_INDEX = {BUSY: 0, IDLE: 1, SWITCHING: 2}
_PACK = struct.Struct("<qdd?").pack


class Recorder:
    def __init__(self, pools: dict[int, str], keep: bool) -> None:
        self.pool = pools
        self.keep = keep
        self.intervals: list[Interval] = []
        self.state: dict[int, tuple[Activity, str, str, bool]] = {}
        self.since: dict[int, float] = {}
        self.tally = {p: [0.0, 0.0, 0.0] for p in set(pools.values())}
        self._sha = hashlib.sha256()
        for d, pool in pools.items():
            native = "rollout" if pool == "rollout" else "train"
            self.state[d] = (IDLE, native, "waiting for data", False)
            self.since[d] = 0.0

    def set(self, devices: Iterable[int], t: float, activity: Activity, role: str,
            label: str, borrowed: bool = False) -> None:
        new = (activity, role, label, borrowed)
        for d in devices:
            if self.state[d] != new:
                self._close(d, t)
                self.state[d] = new
                self.since[d] = t

    def _close(self, d: int, t: float) -> None:
        start = self.since[d]
        if t <= start:
            return
        activity, role, label, borrowed = self.state[d]
        pool = self.pool[d]
        self.tally[pool][_INDEX[activity]] += t - start
        if self.keep:
            self.intervals.append(Interval(d, pool, role, activity, start, t, label, borrowed))
        # The canonical line of every interval, hashed as a stream whether or not the
        # intervals are kept: one ``trace_sha256`` with or without a trace.
        self._sha.update(_PACK(d, start, t, borrowed))
        self._sha.update(f"{pool}|{role}|{activity.value}|{label}\n".encode())

    def tally_at(self, t: float) -> dict[str, list[float]]:
        """The per-pool tally as it would be if every device's running interval closed at
        ``t`` (nothing changes): the training loop's figures taken before a final step
        that is not training (the last validation)."""
        out = {p: list(v) for p, v in self.tally.items()}
        for d, (activity, *_rest) in self.state.items():
            if t > self.since[d]:
                out[self.pool[d]][_INDEX[activity]] += t - self.since[d]
        return out

    def finish(self, wall: float) -> None:
        for d in sorted(self.state):
            self._close(d, wall)
            self.since[d] = wall

    def sorted_intervals(self) -> list[Interval]:
        return sorted(self.intervals, key=lambda i: (i.device, i.start_s))

    def stream_sha256(self) -> str:
        return self._sha.hexdigest()
