"""Synthetic device schedules, for the timeline benchmark and the observability tests.

A seeded generator rather than fixtures on disk: a caller asks for the size it needs (two
devices for structure checks, 1024 devices for a large run) and the schedules tile
``[0, wall_s]`` exactly, like a correct runtime's records. ``bench/timeline_plot.py`` times
the plot on 100k of its intervals; ``tests/obs/conftest.py`` hands it to the tests.
"""

from __future__ import annotations

import random

from bidirl.core.timeline import Activity, Interval

IDLE_CAUSES = {"rollout": ("staleness bound", "no work"), "train": ("waiting for data",)}


def _device_schedule(
    rng: random.Random, device: int, pool: str, wall_s: float, mean_s: float
) -> list[Interval]:
    own, lent = ("rollout", "aux_train") if pool == "rollout" else ("train", "rollout")
    out: list[Interval] = []
    t, step = 0.0, 0

    def add(role: str, activity: Activity, dur: float, label: str, borrowed: bool) -> None:
        nonlocal t
        end = min(wall_s, t + dur)
        if end > t:
            out.append(Interval(device, pool, role, activity, t, end, label, borrowed))
        t = end

    while t < wall_s:
        kind = rng.random()
        dur = rng.expovariate(1.0 / mean_s)
        if kind < 0.6:
            step += 1
            label = f"step {step}" if own == "train" else f"gen batch {step}"
            add(own, Activity.BUSY, dur, label, False)
        elif kind < 0.85:
            cause = rng.choice(IDLE_CAUSES[pool])
            add(own, Activity.IDLE, dur, f"{cause}: {step}", False)
        else:
            add(lent, Activity.SWITCHING, mean_s * 0.1, "C_in", True)
            add(lent, Activity.BUSY, dur, "lent", True)
            add(lent, Activity.SWITCHING, mean_s * 0.05, "C_out", True)
    return out


def make_schedule(
    n_rollout: int = 2, n_train: int = 2, wall_s: float = 10.0, mean_s: float = 0.5, seed: int = 0
) -> list[Interval]:
    """Intervals for ``n_rollout`` + ``n_train`` devices tiling ``[0, wall_s]``."""
    rng = random.Random(seed)
    intervals: list[Interval] = []
    for device in range(n_rollout + n_train):
        pool = "rollout" if device < n_rollout else "train"
        intervals.extend(_device_schedule(rng, device, pool, wall_s, mean_s))
    return intervals
