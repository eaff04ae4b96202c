"""The scenario's multi-turn section (``workload.turns``): model turns per trajectory, the
tool's latency between them and the tokens each environment turn adds.

A response is a *trajectory* of model turns; after each of them the environment (a tool)
answers: the trajectory waits ``tool_latency_s`` holding no slot on its replica, then its
next turn prefills the whole context (prompt, every earlier turn, every environment reply;
no prefix cache) and decodes; the environment's answer to the last turn ends it.  Each
model turn's length is drawn from ``workload.response_length`` (a per-turn distribution);
each environment reply before a next turn adds ``env_tokens`` to the context (masked out of
the loss, but trained over as context).  The
defaults (one turn) are the single-turn workload, simulated exactly as without this section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bidirl.core.typed_config import option

TurnDist = Literal["constant", "uniform", "empirical"]


@dataclass(frozen=True)
class Turns:
    """Model turns per trajectory, drawn per response with the run's seed.

    ``constant``: every trajectory has ``count`` turns (1, the default: single-turn).
    ``uniform``: in ``[min, max]``.  ``empirical``: drawn from ``values`` (a real run's
    measured turns per trajectory).  After each model turn the trajectory waits
    ``tool_latency_s`` on its environment (the last wait ends it); before each next turn it
    gets ``env_tokens`` more context: a trajectory of ``t`` turns has ``t`` environment
    turns, ``t - 1`` of which reply.
    """

    dist: TurnDist = option("constant", "distribution of model turns per trajectory")
    count: int = option(1, "model turns per trajectory when dist is constant (1: single-turn)", ge=1, le=4096)
    min: int = option(1, "fewest model turns when dist is uniform", ge=1, le=4096)
    max: int = option(1, "most model turns when dist is uniform", ge=1, le=4096)
    values: tuple[int, ...] | None = option(None, "model turns per trajectory when dist is empirical (drawn with "
                                            "the seed)")
    tool_latency_s: float = option(0.0, "seconds a trajectory waits on its environment after each model turn "
                                   "(holding no slot on its replica)", ge=0)
    env_tokens: int = option(0, "tokens each environment reply before a next turn adds to the context (masked "
                             "out of the loss)", ge=0)

    @property
    def multi(self) -> bool:
        """Whether any trajectory may have more than one model turn."""
        if self.dist == "constant":
            return self.count > 1
        if self.dist == "uniform":
            return self.max > 1
        return any(v > 1 for v in self.values or ())

    def mean(self) -> float:
        """Expected model turns per trajectory."""
        if self.dist == "constant":
            return float(self.count)
        if self.dist == "uniform":
            return (self.min + self.max) / 2
        return sum(self.values) / len(self.values) if self.values else 1.0

    def longest(self) -> int:
        """The most model turns a trajectory may have."""
        if self.dist == "constant":
            return self.count
        if self.dist == "uniform":
            return self.max
        return max(self.values) if self.values else 1


def check_turns(t: Turns, need: Any) -> None:
    """The rules of ``workload.turns`` that span its fields (``need`` as in ``check``)."""
    if t.dist == "uniform":
        need(t.min <= t.max, "workload.turns.min", "must be <= max", t.min)
    if t.dist == "empirical":
        need(bool(t.values), "workload.turns.values", "must list turns per trajectory when dist is empirical",
             t.values)
        need(all(1 <= v <= 4096 for v in t.values), "workload.turns.values", "must be turn counts in [1, 4096]",
             [v for v in t.values if not 1 <= v <= 4096][:3])
