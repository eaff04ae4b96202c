"""Switch-cost estimator: C_in, C_out and C_grad from priors and measured history.

``roll_on_train``: a trainer device brings up a rollout replica (wake the engine, load the
newest weights: ``C_in``) and later releases it (abort, free the KV cache, sleep:
``C_out``).  ``train_on_roll``: a rollout device brings up an auxiliary trainer (load the
primary's weights, allocate gradients: ``C_in``), ships each gradient chunk to the
primary (``C_grad``) and releases it (``C_out``).

The estimate is the median of the last ``window`` measurements (robust to one slow
switch), or the roofline prior before any measurement exists.  veRL's dynamic scheduling
uses the mean of the last three; the median is as cheap and ignores one outlier.

Across nodes a switch moves the weights (or a gradient) over the network instead of
within a host, so each measurement may name its node pair ``(source, destination)``: the
node holding the newest weights and the node of the lent device (a gradient: the other
way).  ``estimate(kind, pair)`` is the median of the last ``window`` measurements of its
class, same node or across nodes (every cross-node pair of one cluster crosses the same
kind of network, and a class gathers measurements far faster than one pair of many
nodes would); a class without measurements falls back to the kind's median over every
pair, then the prior.  Without a pair everything is as on one node.  ``pair_medians``
reports each pair's own median.
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


Pair = tuple[int, int]  # (source node, destination node)


@dataclass
class SwitchCostEstimator:
    priors: dict[str, float]
    window: int = 8
    history: dict[str, deque] = field(default_factory=dict)
    by_pair: dict[tuple[str, Pair], deque] = field(default_factory=dict)
    by_class: dict[tuple[str, bool], deque] = field(default_factory=dict)  # (kind, crosses nodes)

    def __post_init__(self) -> None:
        unknown = set(self.priors) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown switch kinds {sorted(unknown)}; allowed: {KINDS}")
        for k in KINDS:
            self.history.setdefault(k, deque(maxlen=self.window))

    def observe(self, kind: str, seconds: float, pair: Pair | None = None) -> None:
        if kind not in self.history:
            raise ValueError(f"unknown switch kind {kind!r}; allowed: {KINDS}")
        if seconds < 0:
            raise ValueError(f"{kind}: a switch cannot take negative time ({seconds})")
        self.history[kind].append(seconds)
        if pair is not None:
            self.by_pair.setdefault((kind, (int(pair[0]), int(pair[1]))), deque(maxlen=self.window)).append(seconds)
            self.by_class.setdefault((kind, pair[0] != pair[1]), deque(maxlen=self.window)).append(seconds)

    def estimate(self, kind: str, pair: Pair | None = None) -> float:
        if pair is not None:
            h = self.by_class.get((kind, pair[0] != pair[1]))
            if h:
                return median(h)
        h = self.history[kind]
        return median(h) if h else self.priors.get(kind, 0.0)

    def pair_medians(self) -> dict[str, float]:
        """``{"<kind>/n<src>-n<dst>": median seconds}`` of every pair measured."""
        return {f"{k}/n{p[0]}-n{p[1]}": median(v) for (k, p), v in sorted(self.by_pair.items()) if v}

    def measured(self) -> dict[str, float | None]:
        return {k: (median(h) if h else None) for k, h in self.history.items()}
