"""One result type for both worlds: what a simulated or a real run reports.

``bidirl simulate`` and ``bidirl train`` write the same names (``RunResult.to_json``), so a
real run and its simulated prediction compare field by field.  The figures both runtimes
derive from the device-time recorder, the controller and its ledger are computed here,
once: pool busy fractions and seconds, decision times, admission counts, the audit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bidirl.core.timeline import Interval


@dataclass
class RunResult:
    """Figures of one run of ``policy``, simulated or real (see docs/simulator.md).

    ``throughput_tokens_per_s`` counts trained tokens (prompt + response of every trained
    sample) per second of wall time from t=0 to the end of the last optimizer step.
    ``ideal_tokens_per_s`` packs the same work onto all devices with no bubbles and no
    switch cost (definition in docs/simulator.md); ``efficiency`` is their ratio.
    """

    policy: str
    scenario: str
    steps: int
    wall_s: float
    tokens_trained: int
    throughput_tokens_per_s: float
    mean_step_time_s: float
    pool_busy_fraction: dict[str, float]  # {"rollout": x, "train": y}
    switch_time_s: float
    borrows: dict[str, int]  # {"roll_on_train": n, "train_on_roll": m}
    ideal_tokens_per_s: float
    efficiency: float
    staleness: dict[str, float]  # {"mean": x, "max": y}
    groups_trained: int
    groups_lost: int
    trace_sha256: str
    devices: int = 0
    seed: int = 0
    step_times_s: list[float] = field(default_factory=list)
    stage_model_median_error: dict[str, float | None] = field(default_factory=dict)
    admission: dict[str, int] = field(default_factory=dict)  # admitted / rejected counts
    intervals: list[Interval] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)
    # The simulator's bound that also counts the staleness chain (sim/run.py); None: not
    # computed (a real run: its summary says so rather than report a bound of 0)
    attainable_tokens_per_s: float | None = None
    efficiency_attainable: float | None = None
    # DAPO's dynamic sampling: completed groups filtered (all rewards equal), and the share
    # kept, trained / (trained + filtered); 0 and 1.0 without it
    groups_filtered: int = 0
    keep_rate: float = 1.0

    def to_json(self) -> dict[str, Any]:
        """The keys promised by the CLI's ``--json`` (no intervals)."""
        keys = ("policy", "scenario", "steps", "wall_s", "tokens_trained",
                "throughput_tokens_per_s", "mean_step_time_s", "pool_busy_fraction",
                "switch_time_s", "borrows", "ideal_tokens_per_s", "efficiency", "staleness",
                "groups_trained", "groups_lost", "trace_sha256", "devices", "seed",
                "step_times_s", "stage_model_median_error", "admission", "extra",
                "attainable_tokens_per_s", "efficiency_attainable", "groups_filtered", "keep_rate")
        return {k: getattr(self, k) for k in keys}


def pool_figures(tally: dict[str, list[float]]) -> dict[str, Any]:
    """Busy fraction per pool, device-seconds switching, and busy/idle/switching seconds."""
    totals = {p: sum(v) for p, v in tally.items()}
    return {
        "pool_busy_fraction": {p: (v[0] / totals[p] if totals[p] else 0.0) for p, v in sorted(tally.items())},
        "switch_time_s": sum(v[2] for v in tally.values()),
        "pool_seconds": {p: dict(zip(("busy", "idle", "switching"), v)) for p, v in sorted(tally.items())},
    }


def admission_counts(decisions) -> dict[str, int]:
    """Admitted / rejected borrow decisions per direction (``roll_on_train.admitted``...)."""
    counts = Counter(f"{d.direction}.{'admitted' if d.admit else 'rejected'}" for d in decisions)
    return dict(sorted(counts.items()))


def decision_figures(controller) -> dict[str, float]:
    """The controller's decision time per event (wall and thread CPU, microseconds)."""
    dec = np.frombuffer(controller.decision_s, dtype=np.float64) * 1e6
    dec_cpu = np.frombuffer(controller.decision_cpu_s, dtype=np.float64) * 1e6
    per_action = dec / np.maximum(1, np.frombuffer(controller.decision_actions, dtype=np.int64))
    return {
        **_percentiles("decision_us", dec),
        **_percentiles("decision_cpu_us", dec_cpu),
        # An event that admits a whole new batch issues one action per replica.
        "decision_us_per_action_p99": float(np.percentile(per_action, 99)) if dec.size else 0.0,
        "actions_max": int(max(controller.decision_actions, default=0)),
        "events": int(dec.size),
    }


def _percentiles(name: str, us: np.ndarray) -> dict[str, float]:
    """p50, p99, p99.9 and max of per-event decision times (microseconds)."""
    if not us.size:
        return {f"{name}_{k}": 0.0 for k in ("p50", "p99", "p999", "max")}
    p50, p99, p999 = np.percentile(us, (50, 99, 99.9))
    return {f"{name}_p50": float(p50), f"{name}_p99": float(p99),
            f"{name}_p999": float(p999), f"{name}_max": float(us.max())}
