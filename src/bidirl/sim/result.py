"""What one simulated run reports: the contract between the simulator, CLI, grid and planner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bidirl.core.timeline import Interval
from bidirl.policy import policy_names

POLICIES = tuple(policy_names())  # derived from the policy registry, the only list of names


@dataclass
class SimResult:
    """Figures of one run of ``policy`` on ``scenario`` (see docs/simulator.md).

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

    def to_json(self) -> dict[str, Any]:
        """The keys promised by the CLI's ``--json`` (no intervals)."""
        keys = ("policy", "scenario", "steps", "wall_s", "tokens_trained",
                "throughput_tokens_per_s", "mean_step_time_s", "pool_busy_fraction",
                "switch_time_s", "borrows", "ideal_tokens_per_s", "efficiency", "staleness",
                "groups_trained", "groups_lost", "trace_sha256", "devices", "seed",
                "step_times_s", "stage_model_median_error", "admission", "extra")
        return {k: getattr(self, k) for k in keys}
