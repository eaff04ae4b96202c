"""Device-time accounting: where every device-second went, and whether any went missing.

The whole point of lending devices between pools is to turn idle seconds into busy ones,
so these numbers are the system's scoreboard: per-pool busy / idle / switching seconds,
idle ratios, seconds lent in each direction, bubble seconds by cause and switch costs.

``check_conservation`` is the invariant behind all of them: every device's intervals
must tile ``[0, wall_s]`` exactly (busy + idle + switching = devices x wall time).  If a
runtime forgets to record a stretch, or records one twice, every ratio above is quietly
wrong; the check names the device and time of each gap or overlap instead.

Pure Python on purpose (no numpy, no matplotlib) so the simulator and property tests can
call it in tight loops.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from bidirl.core.timeline import Activity, Interval

__all__ = ["PoolTime", "Violation", "accounting_metrics", "borrow_counts", "borrowed_seconds", "bubble_cause",
           "borrow_direction", "bubble_seconds", "check_borrow_flags", "check_conservation", "clip_intervals",
           "idle_ratios", "pool_times", "switch_seconds"]

ROLL_ON_TRAIN = "roll_on_train"
TRAIN_ON_ROLL = "train_on_roll"
# Metric-name prefix per pool, veRL-style (``trainer/idle_ratio``).
POOL_METRIC_PREFIX = {"rollout": "rollout", "train": "trainer"}


@dataclass(frozen=True, slots=True)
class PoolTime:
    """Device-seconds of one pool by activity."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    switching_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.busy_s + self.idle_s + self.switching_s

    @property
    def idle_ratio(self) -> float:
        # An empty pool has no bubbles; 0.0 keeps dashboards finite.
        return self.idle_s / self.total_s if self.total_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Violation:
    """One break of device-time conservation, located so it can be found in the trace."""

    device: int
    time_s: float
    kind: str  # gap | overlap | inverted | before_zero | beyond_wall | unknown_device | ...
    detail: str

    def __str__(self) -> str:
        return f"device {self.device} at {self.time_s:.6f}s: {self.kind} ({self.detail})"


def pool_times(intervals: Iterable[Interval]) -> dict[str, PoolTime]:
    """Busy / idle / switching device-seconds per owning pool."""
    sums: dict[str, dict[Activity, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        sums[iv.pool][Activity(iv.activity)] += iv.duration_s
    return {
        pool: PoolTime(acts[Activity.BUSY], acts[Activity.IDLE], acts[Activity.SWITCHING])
        for pool, acts in sorted(sums.items())
    }


def clip_intervals(intervals: Iterable[Interval], end: float) -> list[Interval]:
    """The intervals as far as ``end``: those after it dropped, those across it cut (the
    training loop's share of a run that validated once more after its last step)."""
    return [iv if iv.end_s <= end else replace(iv, end_s=end) for iv in intervals if iv.start_s < end]


def idle_ratios(intervals: Iterable[Interval]) -> dict[str, float]:
    """``idle / total`` device-seconds per owning pool."""
    return {pool: t.idle_ratio for pool, t in pool_times(intervals).items()}


def borrow_direction(interval: Interval) -> str | None:
    """Which way a device was lent while this interval ran, judged by role and owner pool.

    Role and pool decide rather than the ``borrowed`` flag so a runtime that forgets the
    flag is still accounted correctly; ``check_borrow_flags`` reports the disagreement.
    """
    if interval.pool == "train" and interval.role == "rollout":
        return ROLL_ON_TRAIN
    if interval.pool == "rollout" and interval.role in ("aux_train", "train"):
        return TRAIN_ON_ROLL
    return None


def borrowed_seconds(intervals: Iterable[Interval]) -> dict[str, float]:
    """Device-seconds spent hosting the other pool's role, per direction.

    ``roll_on_train`` / ``train_on_roll`` count all the time the borrowed role was hosted
    (including its switch-in/out and its bubbles); the ``*_busy`` keys count only the
    useful part, so ``busy / total`` says how well lending paid off.
    """
    out = dict.fromkeys((ROLL_ON_TRAIN, TRAIN_ON_ROLL, f"{ROLL_ON_TRAIN}_busy", f"{TRAIN_ON_ROLL}_busy"), 0.0)
    for iv in intervals:
        direction = borrow_direction(iv)
        if direction is None:
            continue
        out[direction] += iv.duration_s
        if Activity(iv.activity) is Activity.BUSY:
            out[f"{direction}_busy"] += iv.duration_s
    return out


def borrow_counts(intervals: Iterable[Interval]) -> dict[str, int]:
    """Number of lending episodes per direction: maximal runs of a borrowed role per device.

    Consecutive intervals of the same borrowed direction on one device (switch in, busy,
    idle, switch out) are one episode; a gap between them does not split it.
    """
    counts = {ROLL_ON_TRAIN: 0, TRAIN_ON_ROLL: 0}
    for device_ivs in _by_device(intervals).values():
        previous: str | None = None
        for iv in device_ivs:
            direction = borrow_direction(iv)
            if direction is not None and direction != previous:
                counts[direction] += 1
            previous = direction
    return counts


def bubble_cause(label: str) -> str:
    """Cause of an idle interval from its label: the text before the first ``:``.

    Convention: idle labels are ``<cause>`` or ``<cause>: <detail>`` (``waiting for data:
    batch 4``), so causes aggregate without being split by step numbers.
    """
    cause = label.split(":", 1)[0].strip()
    return cause or "unlabelled"


def bubble_seconds(intervals: Iterable[Interval]) -> dict[str, dict[str, float]]:
    """Idle device-seconds per owning pool, per cause (see ``bubble_cause``)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        if Activity(iv.activity) is Activity.IDLE:
            out[iv.pool][bubble_cause(iv.label)] += iv.duration_s
    return {pool: dict(sorted(c.items())) for pool, c in sorted(out.items())}


def switch_seconds(intervals: Iterable[Interval]) -> dict[str, tuple[int, float]]:
    """Switching intervals by label (``C_in``, ``C_out``): (count, total seconds)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for iv in intervals:
        if Activity(iv.activity) is Activity.SWITCHING:
            entry = out[iv.label or "switch"]
            entry[0] += 1
            entry[1] += iv.duration_s
    return {label: (int(n), s) for label, (n, s) in sorted(out.items())}


def _by_device(intervals: Iterable[Interval]) -> dict[int, list[Interval]]:
    per: dict[int, list[Interval]] = defaultdict(list)
    for iv in intervals:
        per[iv.device].append(iv)
    for ivs in per.values():
        ivs.sort(key=lambda iv: (iv.start_s, iv.end_s))
    return per


def _device_violations(
    device: int, ivs: Sequence[Interval], wall_s: float, tol: float
) -> list[Violation]:
    found: list[Violation] = []

    def add(time_s: float, kind: str, detail: str) -> None:
        found.append(Violation(device, time_s, kind, detail))

    cursor = 0.0  # end of the tiled prefix of [0, wall_s]
    for iv in ivs:
        if iv.end_s < iv.start_s - tol:
            add(iv.start_s, "inverted", f"ends at {iv.end_s} before it starts")
            continue
        if iv.start_s < -tol:
            add(iv.start_s, "before_zero", f"interval starts at {iv.start_s} before time 0")
        elif iv.start_s > cursor + tol:
            add(cursor, "gap", f"no interval covers [{cursor}, {iv.start_s})")
        elif iv.start_s < cursor - tol:
            add(iv.start_s, "overlap", f"[{iv.start_s}, {min(cursor, iv.end_s)}) covered twice")
        if iv.end_s > wall_s + tol:
            add(wall_s, "beyond_wall", f"interval runs to {iv.end_s} past wall {wall_s}")
        cursor = max(cursor, iv.end_s)
    if cursor < wall_s - tol:
        add(cursor, "gap", f"no interval covers [{cursor}, {wall_s})")
    return found


def check_conservation(
    intervals: Iterable[Interval], n_devices: int, wall_s: float, tol: float = 1e-6
) -> list[Violation]:
    """Violations of "each device's intervals tile ``[0, wall_s]`` exactly"; empty if none.

    Reports gaps (including a missing start or end, or a device with no intervals at
    all), overlaps, intervals that end before they start, intervals past ``wall_s`` and
    devices outside ``range(n_devices)``.  ``tol`` absorbs float rounding at boundaries.
    """
    per = _by_device(intervals)
    found: list[Violation] = []
    for device in sorted(set(per) | set(range(n_devices))):
        ivs = per.get(device, [])
        if not 0 <= device < n_devices:
            found.append(Violation(device, ivs[0].start_s, "unknown_device", f"device not in range({n_devices})"))
        else:
            found.extend(_device_violations(device, ivs, wall_s, tol))
    return found


def check_borrow_flags(intervals: Iterable[Interval]) -> list[Violation]:
    """Intervals whose ``borrowed`` flag disagrees with their role and owner pool."""
    return [
        Violation(iv.device, iv.start_s, "borrow_flag",
                  f"role {iv.role} on {iv.pool} pool has borrowed={iv.borrowed}, expected {expected}")
        for iv in intervals
        if bool(iv.borrowed) != (expected := borrow_direction(iv) is not None)
    ]


def accounting_metrics(intervals: Iterable[Interval]) -> dict[str, float]:
    """Flat, veRL-style metrics for ``MetricsLogger``: one dict per step or per run.

    Keys: ``{rollout,trainer}/{busy,idle,switching}_s``, ``.../idle_ratio``,
    ``borrow/{roll_on_train,train_on_roll}_s`` (+ ``_busy_s``, ``_count``),
    ``bubble_s/{pool}/{cause}`` and ``switch/{label}_s`` (+ ``_count``).
    """
    ivs = list(intervals)
    out: dict[str, float] = {}
    for pool, t in pool_times(ivs).items():
        prefix = POOL_METRIC_PREFIX.get(pool, pool)
        for key in ("busy_s", "idle_s", "switching_s", "idle_ratio"):
            out[f"{prefix}/{key}"] = getattr(t, key)
    for key, seconds in borrowed_seconds(ivs).items():
        out[f"borrow/{key}_s"] = seconds
    for key, count in borrow_counts(ivs).items():
        out[f"borrow/{key}_count"] = float(count)
    for pool, causes in bubble_seconds(ivs).items():
        for cause, seconds in causes.items():
            out[f"bubble_s/{pool}/{cause}"] = seconds
    for label, (count, seconds) in switch_seconds(ivs).items():
        out[f"switch/{label}_s"] = seconds
        out[f"switch/{label}_count"] = float(count)
    return out
