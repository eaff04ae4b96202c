"""Response lengths drawn per group id from the scenario's distribution, seeded; and which
groups the simulated reward filters (DAPO's dynamic sampling, ``KeepModel``).

Lengths depend only on ``(seed, group id)``, never on the policy or on timing, so every
policy sees the same groups with the same lengths for the same seed.  They are drawn a
batch at a time (``groups_per_step x group_size`` values from a generator seeded by
``(seed, batch)``), which is as reproducible as a per-group draw and far cheaper.
A drifting lognormal draws batch ``b`` at step ``b``'s parameters.  ``file`` and
``empirical`` lengths follow ``order`` (``perf.scenario.ResponseLength``): ``replay`` in
order (a run needing more lengths than listed is refused when the lengths are built),
``cycle``, or ``sample`` (seeded draws from the values).
"""

from __future__ import annotations

import numpy as np

from bidirl.perf.scenario import KeepRate, ScenarioError, read_lengths
from bidirl.sim.scenario import ResponseLength


class ResponseLengths:
    """``lengths(gid)``: the response lengths of prompt group ``gid``."""

    def __init__(self, dist: ResponseLength, groups_per_step: int, group_size: int,
                 seed: int, steps: int | None = None) -> None:
        self.dist, self.g, self.n, self.seed = dist, groups_per_step, group_size, seed
        self.steps = steps or 1  # the run's steps: the span of a drift without its own
        self._cache: dict[int, list[tuple[int, ...]]] = {}
        self._file: np.ndarray | None = (
            _read_lengths(dist) if dist.dist == "file"
            else np.asarray(dist.values, dtype=np.int64) if dist.dist == "empirical" else None)
        need = (steps or 0) * groups_per_step * group_size
        if self._file is not None and dist.order == "replay" and need > len(self._file):
            where = "file" if dist.dist == "file" else "values"
            raise ScenarioError(
                f"workload.response_length.{where}: holds {len(self._file)} lengths but {steps} steps of "
                f"{groups_per_step} x {group_size} responses need {need} in replay order; list more, run fewer "
                "steps, or set workload.response_length.order to cycle (start over) or sample (draw with the seed)")

    def lengths(self, gid: int) -> tuple[int, ...]:
        b, i = divmod(gid, self.g)
        rows = self._cache.get(b)
        if rows is None:
            rows = [tuple(row) for row in self.draw_batch(b).tolist()]
            self._cache[b] = rows
            self._cache.pop(b - 64, None)  # batches that old are long trained
        return rows[i]

    def draw_batch(self, batch: int, stream: int = 0) -> np.ndarray:
        """Lengths of every response of ``batch``, shape (groups_per_step, group_size).

        ``stream`` > 0: another independent draw of the same batch (a later model turn of a
        multi-turn trajectory, ``sim/turns.py``); ``file`` and ``empirical`` lengths in
        ``replay`` or ``cycle`` order give every turn of a response its one listed length (a
        calibrated run lists each trajectory's mean turn)."""
        d, shape = self.dist, (self.g, self.n)
        if d.dist == "constant":
            return np.full(shape, d.max, dtype=np.int64)
        rng = np.random.default_rng([self.seed, batch] if stream == 0 else [self.seed, batch, stream])
        if d.dist in ("file", "empirical"):
            if d.order == "sample":
                return self._file[rng.integers(0, len(self._file), size=shape)]
            idx = batch * self.g * self.n + np.arange(self.g * self.n)
            if d.order == "replay" and idx[-1] >= len(self._file):
                raise ScenarioError(f"workload.response_length.order: replay has no lengths for batch {batch} "
                                    f"({len(self._file)} listed); allowed: cycle or sample to go past them")
            return self._file[idx % len(self._file)].reshape(shape)
        if d.dist == "uniform":
            return rng.integers(d.min, d.max + 1, size=shape)
        median, sigma = d.params_at(batch, self.steps)
        x = np.exp(np.log(median) + sigma * rng.standard_normal(shape))
        return np.clip(np.rint(x), d.min, d.max).astype(np.int64)

    def mean(self) -> float:
        """Expected response length (used to size KV-cache concurrency)."""
        d = self.dist
        if d.dist == "constant":
            return float(d.max)
        if d.dist == "uniform":
            return (d.min + d.max) / 2
        if d.dist in ("file", "empirical"):
            return float(self._file.mean())
        x = np.exp(np.log(d.median) + d.sigma * np.random.default_rng(7).standard_normal(20000))
        return float(np.clip(np.rint(x), d.min, d.max).mean())


def _read_lengths(d: ResponseLength) -> np.ndarray:
    return np.asarray(read_lengths(d.file), dtype=np.int64)


class KeepModel:
    """Which completed groups the simulated world filters (all rewards equal).

    Group ``gid`` completed by a replica holding version ``v`` is kept when its number
    ``u(seed, gid)`` in [0, 1) falls below ``keep_rate.at(v, steps)``: the same group is
    kept or filtered the same way whatever the policy, as long as it completes at the same
    version.  ``u`` is a golden-ratio (Weyl) sequence over the ids from a start the seed
    picks, not an independent draw per group: over any run of consecutive ids the share
    kept is within a few groups of the rate.  A calibrated scenario's rate is the share
    the real run kept, so the simulator must keep that share, not a draw that scatters
    around it (independent draws kept 0.43-0.46 of the first ~110 ids at a rate of 0.51:
    ~15 % more rollout than the run it replays, and every prediction ~9 % low).
    """

    def __init__(self, rate: KeepRate, steps: int, seed: int) -> None:
        self.rate, self.steps, self.seed = rate, steps, seed

    @property
    def filters(self) -> bool:
        return self.rate.filters

    def filtered(self, gid: int, version: int) -> bool:
        return _uniform(self.seed, gid) >= self.rate.at(version, self.steps)


_MASK = (1 << 64) - 1
_GOLDEN = 0.6180339887498949


def _uniform(seed: int, gid: int) -> float:
    """``gid``'s number in [0, 1): a Weyl sequence of step 1/phi, started where a splitmix64
    hash of ``seed`` says (so seeds differ, and no generator is kept per group: a large
    simulation completes hundreds of thousands of groups)."""
    z = (seed * 0x9E3779B97F4A7C15 + 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    start = ((z ^ (z >> 31)) >> 11) / float(1 << 53)
    return (start + (gid + 1) * _GOLDEN) % 1.0
