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
  of the packed sequences (the attention term of a training micro-batch);
* ``staggered_max(n)``: ``x -> E[max_i (L_i - U_i x)]`` over ``n`` responses whose starts
  are spread uniformly (``U_i``) over a window of ``x`` decode steps: how far past the
  start of its last group a batch runs when its groups had to queue for slots.  With
  ``G(l) = int_0^l F(u) du``, ``P(L - U x <= y) = (G(y + x) - G(y)) / x``, and
  ``E[max] = y_hi - int F_Y(y)^n dy``; tabulated once per ``n`` on a grid of ``x``.

Multi-turn (``workload.turns``): a trajectory is planned as one response of its model
tokens, ``T`` turns of ``L`` (mean ``E[T] E[L]``, spread ``sqrt(E[T] Var L + Var T E[L]^2)``,
the per-turn grid's shape), decoded in its context, which also holds its ``E[T] - 1``
environment replies of ``E`` tokens (``env_tokens``, in the context and in the trainer's
sequence).  What the single response does not have is kept beside it: the prefills of the
later turns (``turn_prefills`` of ``turn_prefill_tokens`` each, the whole context re-prefilled;
charged to the decoded tokens, as they pause the replica's decode)
and the tool waits, one after each model turn (``tool_s`` per trajectory, ``tool_tail_s``
for a batch's slowest, taken to have the most turns);
``planner/stages.py`` adds them (docs/planner.md, "Multi-turn").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from bidirl.perf.scenario import read_lengths

GRID = 2048  # quantile points; the expected-max weights stay exact for any n
_Y_POINTS = 768  # integration points of the staggered maximum
_X_GRID = np.concatenate(([0.0], np.geomspace(1e-3, 1e3, 61)))  # x / max length


def _lognormal_grid(rl, steps: int) -> list[float]:
    """Quantiles of the run's lengths: the lognormal of each step (``drift``), pooled.

    A drifting distribution is planned for as the mixture of its steps over the horizon,
    since every step trains one batch drawn at that step's parameters.  The mixture's CDF
    is evaluated on a fine log grid and inverted there.
    """
    lo, hi = float(rl.min), float(rl.max)
    ps = (np.arange(GRID) + 0.5) / GRID
    z = NormalDist()
    if not rl.drifts:
        q = rl.median * np.exp(rl.sigma * np.array([z.inv_cdf(p) for p in ps]))
        return np.clip(q, lo, hi).tolist()
    params = sorted({rl.params_at(k, steps) for k in range(steps)})
    counts = [sum(rl.params_at(k, steps) == p for k in range(steps)) for p in params]
    xs = np.geomspace(lo, hi, 8192)
    cdf = np.zeros_like(xs)
    erf = np.vectorize(math.erf)
    for (med, sig), n in zip(params, counts):
        if sig > 0:
            cdf += n * 0.5 * (1 + erf((np.log(xs) - math.log(med)) / (sig * math.sqrt(2))))
        else:
            cdf += n * (xs >= min(hi, max(lo, med)))
    cdf /= steps
    cdf[-1] = 1.0  # everything longer than max is truncated to max
    return np.clip(np.interp(ps, cdf, xs, left=lo), lo, hi).tolist()


def _quantile_grid(rl, steps: int = 1, per_step: int = 0) -> list[float]:
    """Sorted lengths at the probability midpoints ``(i + 0.5) / GRID``."""
    lo, hi = float(rl.min), float(rl.max)
    ps = [(i + 0.5) / GRID for i in range(GRID)]
    if rl.dist == "constant":
        return [hi] * GRID
    if rl.dist == "uniform":
        return [lo + p * (hi - lo) for p in ps]
    if rl.dist == "lognormal":
        return _lognormal_grid(rl, max(1, steps))
    if rl.dist in ("file", "empirical"):
        values = list(read_lengths(rl.file) if rl.dist == "file" else rl.values)
        need = steps * per_step
        if rl.order == "replay" and 0 < need <= len(values):
            values = values[:need]  # the horizon replays these
        values.sort()
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
    env_tokens: float = 0.0  # environment tokens per trajectory (multi-turn; module docstring)
    turn_prefills: float = 0.0  # prefills of later turns per trajectory
    turn_prefill_tokens: float = 0.0  # context one of them prefills (mean)
    tool_s: float = 0.0  # seconds a trajectory waits on its tools (mean)
    tool_tail_s: float = 0.0  # the tool waits of a batch's slowest trajectory

    @classmethod
    def from_workload(cls, workload, steps: int = 1) -> LengthStats:
        """The statistics of the lengths a run of ``steps`` steps trains (``drift``: pooled)."""
        q = _quantile_grid(workload.response_length, steps, workload.prompts_per_step * workload.group_size)
        turns = getattr(workload, "turns", None)
        if turns is not None and turns.multi:
            return _trajectories(q, float(workload.prompt_tokens), float(workload.response_length.max), turns)
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
        """Trained tokens per response: prompt + response (+ environment tokens, multi-turn)."""
        if self.env_tokens:
            return self.prompt_tokens + self.mean + self.env_tokens
        return self.prompt_tokens + self.mean

    @property
    def train_seq_len(self) -> float:
        """``E[(P+L)^2] / E[P+L]``: the per-token attention length of packed micro-batches
        (multi-turn: ``P`` holds the trajectory's environment tokens too)."""
        p = self.prompt_tokens + self.env_tokens if self.env_tokens else self.prompt_tokens
        return (p * p + 2 * p * self.mean + self.second_moment) / (p + self.mean)

    def staggered_max(self, n: int):
        """``x -> E[max_i (L_i - U_i x)]`` for ``n`` responses (module docstring)."""
        q = np.asarray(self.quantiles)
        top = float(q[-1])
        grid_l = np.linspace(0.0, top, 2049)
        cdf = np.searchsorted(q, grid_l, side="right") / len(q)
        g = np.concatenate(([0.0], np.cumsum((cdf[1:] + cdf[:-1]) * 0.5 * np.diff(grid_l))))

        def big_g(v: np.ndarray) -> np.ndarray:
            # Beyond the top, F = 1: G grows linearly.
            return np.where(v <= top, np.interp(np.clip(v, 0, top), grid_l, g),
                            g[-1] + (v - top))

        values = []
        for x in _X_GRID * top:
            if x <= 0:
                values.append(self.expected_max(n))
                continue
            y = np.linspace(-x, top, _Y_POINTS)
            f = np.clip((big_g(y + x) - big_g(y)) / x, 0.0, 1.0)
            integral = float(np.sum((f[1:] ** n + f[:-1] ** n) * 0.5 * np.diff(y)))
            values.append(top - integral)
        xs, ms = _X_GRID * top, np.asarray(values)

        def m_of(x: float) -> float:
            return float(np.interp(x, xs, ms)) if x < xs[-1] else float(ms[-1])

        return m_of

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


def _trajectories(q: list[float], prompt: float, max_tokens: float, turns) -> LengthStats:
    """``LengthStats`` of whole trajectories from the per-turn grid ``q`` (module docstring)."""
    n = len(q)
    mean_l = sum(q) / n
    var_l = max(0.0, sum(x * x for x in q) / n - mean_l * mean_l)
    t = turns.mean()
    if turns.dist == "constant":
        var_t = 0.0
    elif turns.dist == "uniform":
        var_t = ((turns.max - turns.min + 1) ** 2 - 1) / 12
    else:
        var_t = sum(v * v for v in turns.values) / len(turns.values) - t * t
    sd_l = math.sqrt(var_l)
    sd = math.sqrt(t * var_l + max(0.0, var_t) * mean_l * mean_l)
    traj = sorted(max(1.0, t * mean_l + (sd * (x - mean_l) / sd_l if sd_l > 0 else 0.0)) for x in q)
    if sd_l == 0 and sd > 0:  # constant turn lengths, varying counts: the counts' spread alone
        z = [NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
        traj = [max(1.0, t * mean_l + sd * zi) for zi in z]
    mean = sum(traj) / n
    env = (t - 1) * turns.env_tokens
    later = t - 1  # later turns, each prefilling the context so far: prompt + j (L + E), j = 1 .. T - 1
    mean_j = (var_t + t * t - t) / (2 * later) if later > 0 else 0.0  # E[T (T - 1) / 2] / E[T - 1]
    return LengthStats(
        prompt, tuple(traj), mean, sum(x * x for x in traj) / n, max_tokens * turns.longest(),
        env_tokens=env, turn_prefills=later,
        turn_prefill_tokens=prompt + mean_j * (mean_l + turns.env_tokens) if later > 0 else 0.0,
        tool_s=t * turns.tool_latency_s, tool_tail_s=turns.longest() * turns.tool_latency_s)
