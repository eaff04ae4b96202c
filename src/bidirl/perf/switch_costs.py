"""Switch-cost estimator: C_in, C_out and C_grad from priors and measured history.

``roll_on_train``: a trainer device brings up a rollout replica (wake the engine, load the
newest weights: ``C_in``) and later releases it (abort, free the KV cache, sleep:
``C_out``).  ``train_on_roll``: a rollout device brings up an auxiliary trainer (load the
primary's weights, allocate gradients: ``C_in``), ships each gradient chunk to the
primary (``C_grad``) and releases it (``C_out``).

The estimate is the median of the last ``window`` measurements (robust to one slow
switch), or the roofline prior before any measurement exists.  veRL's dynamic scheduling
uses the mean of the last three; the median is as cheap and ignores one outlier.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from bidirl.perf.profiles import HardwareProfile, ModelProfile

KINDS = ("roll_on_train.c_in", "roll_on_train.c_out", "train_on_roll.c_in",
         "train_on_roll.c_out", "train_on_roll.c_grad")


def switch_priors(hw: HardwareProfile, m: ModelProfile, rollout_tp: int = 1,
                  train_shards: int = 1) -> dict[str, float]:
    host = hw.host_gbps * 1e9
    wire = hw.intra_node_gbps * 1e9
    return {
        "roll_on_train.c_in": hw.engine_wake_s + m.weights_bytes / rollout_tp / host,
        "roll_on_train.c_out": 0.3 * hw.engine_wake_s + m.weights_bytes / rollout_tp / host / 4,
        "train_on_roll.c_in": hw.trainer_wake_s + m.weights_bytes / train_shards / host,
        "train_on_roll.c_out": 0.3 * hw.trainer_wake_s,
        "train_on_roll.c_grad": 0.05 + m.params * 4 / train_shards / wire,
    }


@dataclass
class SwitchCostEstimator:
    priors: dict[str, float]
    window: int = 8
    history: dict[str, deque] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.priors) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown switch kinds {sorted(unknown)}; allowed: {KINDS}")
        for k in KINDS:
            self.history.setdefault(k, deque(maxlen=self.window))

    def observe(self, kind: str, seconds: float) -> None:
        if kind not in self.history:
            raise ValueError(f"unknown switch kind {kind!r}; allowed: {KINDS}")
        if seconds < 0:
            raise ValueError(f"{kind}: a switch cannot take negative time ({seconds})")
        self.history[kind].append(seconds)

    def estimate(self, kind: str) -> float:
        h = self.history[kind]
        return median(h) if h else self.priors.get(kind, 0.0)

    def measured(self) -> dict[str, float | None]:
        return {k: (median(h) if h else None) for k, h in self.history.items()}
