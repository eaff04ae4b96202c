"""Response lengths: drawn per group id from the scenario's distribution, seeded.

Lengths depend only on ``(seed, group id)``, never on the policy or on timing, so every
policy sees the same groups with the same lengths for the same seed.  They are drawn a
batch at a time (``groups_per_step x group_size`` values from a generator seeded by
``(seed, batch)``), which is as reproducible as a per-group draw and far cheaper.
"""

from __future__ import annotations

import numpy as np

from bidirl.perf.scenario import read_lengths
from bidirl.sim.scenario import ResponseLength


class ResponseLengths:
    """``lengths(gid)``: the response lengths of prompt group ``gid``."""

    def __init__(self, dist: ResponseLength, groups_per_step: int, group_size: int,
                 seed: int) -> None:
        self.dist, self.g, self.n, self.seed = dist, groups_per_step, group_size, seed
        self._cache: dict[int, list[tuple[int, ...]]] = {}
        self._file: np.ndarray | None = (
            _read_lengths(dist) if dist.dist == "file"
            else np.asarray(dist.values, dtype=np.int64) if dist.dist == "empirical" else None)

    def lengths(self, gid: int) -> tuple[int, ...]:
        b, i = divmod(gid, self.g)
        rows = self._cache.get(b)
        if rows is None:
            rows = [tuple(row) for row in self.draw_batch(b).tolist()]
            self._cache[b] = rows
            self._cache.pop(b - 64, None)  # batches that old are long trained
        return rows[i]

    def draw_batch(self, batch: int) -> np.ndarray:
        """Lengths of every response of ``batch``, shape (groups_per_step, group_size)."""
        d, shape = self.dist, (self.g, self.n)
        if d.dist == "constant":
            return np.full(shape, d.max, dtype=np.int64)
        if d.dist in ("file", "empirical"):
            idx = (batch * self.g * self.n + np.arange(self.g * self.n)) % len(self._file)
            return self._file[idx].reshape(shape)
        rng = np.random.default_rng([self.seed, batch])
        if d.dist == "uniform":
            return rng.integers(d.min, d.max + 1, size=shape)
        x = np.exp(np.log(d.median) + d.sigma * rng.standard_normal(shape))
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
