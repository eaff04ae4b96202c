"""Response-length statistics the planner's prediction needs, from the workload's distribution.

The planner never samples: it works on a fixed grid of quantiles of the clipped length
distribution, so the same scenario always gives the same plan.  Everything the stage-time
formulas ask for follows from that grid:

* ``mean``: decoded tokens per response (the throughput term);
* ``running_context``: the mean context of a *running* sequence under continuous batching.
  A response of length ``L`` occupies a slot for ``L`` decode steps with contexts
  ``P..P+L``, so slots are held in proportion to ``L``: the time-weighted mean context is
  ``P + E[L^2] / (2 E[L])``, larger than ``P + E[L]/2`` when lengths are long-tailed;
* ``expected_max(n)``: the longest of ``n`` responses (the long-tail term), from order
  statistics on the grid: ``E[max] = sum_i q_i ((i+1)^n - i^n) / K^n``;
* ``train_seq_len``: the length that makes ``tokens * seq_len`` equal the sum of squares
  of the packed sequences (the attention term of a training micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

GRID = 2048  # quantile points; the expected-max weights stay exact for any n


def _quantile_grid(rl) -> list[float]:
    """Sorted lengths at the probability midpoints ``(i + 0.5) / GRID``."""
    lo, hi = float(rl.min), float(rl.max)
    ps = [(i + 0.5) / GRID for i in range(GRID)]
    if rl.dist == "constant":
        return [hi] * GRID
    if rl.dist == "uniform":
        return [lo + p * (hi - lo) for p in ps]
    if rl.dist == "lognormal":
        import math

        z = NormalDist()
        return [min(hi, max(lo, rl.median * math.exp(rl.sigma * z.inv_cdf(p)))) for p in ps]
    if rl.dist == "file":
        values = sorted(int(x) for x in Path(rl.file).read_text().split())
        if not values:
            raise ValueError(f"workload.response_length.file {rl.file!r} holds no lengths")
        return [float(values[min(len(values) - 1, int(p * len(values)))]) for p in ps]
    raise ValueError(f"workload.response_length.dist {rl.dist!r} is not known to the planner")


@dataclass(frozen=True)
class LengthStats:
    """Moments and quantiles of the response length (tokens) plus the prompt length."""

    prompt_tokens: float
    quantiles: tuple[float, ...]
    mean: float
    second_moment: float
    max_tokens: float

    @classmethod
    def from_workload(cls, workload) -> LengthStats:
        q = _quantile_grid(workload.response_length)
        mean = sum(q) / len(q)
        m2 = sum(x * x for x in q) / len(q)
        return cls(float(workload.prompt_tokens), tuple(q), mean, m2,
                   float(workload.response_length.max))

    @property
    def running_context(self) -> float:
        """Time-weighted mean context of a running sequence (continuous batching)."""
        return self.prompt_tokens + self.second_moment / (2 * self.mean)

    @property
    def sample_tokens(self) -> float:
        """Trained tokens per response: prompt + response."""
        return self.prompt_tokens + self.mean

    @property
    def train_seq_len(self) -> float:
        """``E[(P+L)^2] / E[P+L]``: the per-token attention length of packed micro-batches."""
        p = self.prompt_tokens
        return (p * p + 2 * p * self.mean + self.second_moment) / (p + self.mean)

    def quantile(self, prob: float) -> float:
        i = min(len(self.quantiles) - 1, max(0, int(prob * len(self.quantiles))))
        return self.quantiles[i]

    def expected_max(self, n: int) -> float:
        """Expected longest response among ``n`` independent draws."""
        if n <= 1:
            return self.mean
        k = len(self.quantiles)
        total, prev = 0.0, 0.0
        for i, q in enumerate(self.quantiles):
            cur = ((i + 1) / k) ** n
            total += q * (cur - prev)
            prev = cur
        return total
