"""Online calibration of linear stage-time models.

A stage time is modelled as ``t = theta . x`` where ``x`` are physically meaningful
features (bytes moved, FLOPs, a constant) and ``theta`` starts at a roofline *prior*.
Each measurement is scored against the prediction made *before* it was seen (so the
reported error is an honest out-of-sample error), then joins a sliding window; ``theta``
is refitted by ridge-regularised least squares on relative error, pulled toward the prior
so that a few samples cannot send it anywhere unphysical.

Pure Python: a 3-4 parameter normal-equation solve is microseconds, and the inner ring
must not import numpy-heavy stacks (let alone torch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for a small dense system."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ZeroDivisionError("singular system")
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


@dataclass
class LinearTimeModel:
    """``t = theta . features``, calibrated online toward measurements.

    ``ridge`` is the weight (in units of one measurement) of the pull toward the prior on
    each coefficient; ``refit_every`` trades freshness for speed in long simulations.
    """

    name: str
    prior: tuple[float, ...]
    window: int = 256
    ridge: float = 0.5
    refit_every: int = 1
    theta: list[float] = field(init=False)
    _xs: deque = field(init=False, repr=False)
    _ys: deque = field(init=False, repr=False)
    errors: deque = field(init=False, repr=False)
    observations: int = field(init=False, default=0)
    # Normal-equation sums over the window, kept incrementally (a row joins on observe and
    # leaves when the window evicts it), so a refit is a small solve, not a window pass.
    _ata: list = field(init=False, repr=False)
    _atb: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if any(p < 0 for p in self.prior):
            raise ValueError(f"{self.name}: prior coefficients must be >= 0: {self.prior}")
        self.theta = list(self.prior)
        self._xs = deque(maxlen=self.window)
        self._ys = deque(maxlen=self.window)
        self.errors = deque(maxlen=4096)
        self._reset_sums()

    def predict(self, x: tuple[float, ...] | list[float]) -> float:
        return sum(t * f for t, f in zip(self.theta, x))

    def observe(self, x: tuple[float, ...] | list[float], measured_s: float) -> float:
        """Score the current prediction against ``measured_s``, then learn from it.

        Returns the relative error of the prediction made before this measurement.
        """
        if measured_s <= 0:
            return 0.0
        pred = self.predict(x)
        err = abs(pred - measured_s) / measured_s
        self.errors.append(err)
        if len(self._xs) == self.window:  # the deque is about to evict its oldest sample
            self._accumulate(self._xs[0], self._ys[0], -1.0)
        self._xs.append(tuple(x))
        self._ys.append(measured_s)
        self._accumulate(x, measured_s, 1.0)
        self.observations += 1
        if self.observations % 4096 == 0:  # wash out floating-point drift of the sums
            self._reset_sums()
            for xs, ys in zip(self._xs, self._ys):
                self._accumulate(xs, ys, 1.0)
        if self.observations % self.refit_every == 0:
            self.refit()
        return err

    def _reset_sums(self) -> None:
        n = len(self.prior)
        self._ata = [[0.0] * n for _ in range(n)]
        self._atb = [0.0] * n

    def _accumulate(self, x, y: float, sign: float) -> None:
        """Add (sign=1) or remove (sign=-1) one sample's row: x_j * s_j / y."""
        n = len(self.prior)
        row = [x[j] * (self.prior[j] if self.prior[j] > 0 else 1.0) / y for j in range(n)]
        ata, atb = self._ata, self._atb
        for i in range(n):
            ri = row[i]
            if ri == 0.0:
                continue
            atb[i] += sign * ri
            for j in range(n):
                ata[i][j] += sign * ri * row[j]

    def refit(self) -> None:
        """Ridge least squares on relative residuals, in prior-scaled coordinates."""
        n = len(self.prior)
        # u_j = theta_j / s_j with s_j the prior (or 1 where the prior is 0).
        scale = [p if p > 0 else 1.0 for p in self.prior]
        ata = [row[:] for row in self._ata]
        atb = self._atb[:]
        for i in range(n):
            ata[i][i] += self.ridge
            atb[i] += self.ridge * (self.prior[i] / scale[i])
        try:
            u = _solve(ata, atb)
        except ZeroDivisionError:
            return
        # Negative coefficients are unphysical (time cannot shrink with more work).
        self.theta = [max(0.0, u[j]) * scale[j] for j in range(n)]

    def median_rel_error(self) -> float | None:
        return median(self.errors) if self.errors else None
