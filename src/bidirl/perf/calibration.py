"""Online calibration of linear stage-time models, robust to a noisy machine.

A stage time is modelled as ``t = theta . x`` where ``x`` are physically meaningful
features (bytes moved, FLOPs, a constant) and ``theta`` starts at a roofline *prior*.
Each measurement is scored against the prediction made *before* it was seen (so the
reported error is an honest out-of-sample error), then joins a sliding window; ``theta``
is refitted by weighted least squares on relative error with a ridge pull toward the
prior, so that a few samples cannot send it anywhere unphysical.

The pull is toward the prior *rescaled* to the data (``g * prior``, ``g`` the one factor
that fits the window best: a prior that is right in shape but wrong in scale, the usual
case, costs nothing), and it is measured in the data's own units: moving a coefficient
so far that it changes a typical prediction by 100 % costs ``ridge`` measurements' worth
of squared error.  A prior that is wrong in *shape* (a roofline that has no per-step
overhead on a CPU, where a decode step is mostly overhead) is therefore overruled by a
handful of measurements, where a pull measured in the prior's own units (relative to each
prior coefficient) would keep a 60x-too-small coefficient near its prior forever.
Coefficients stay non-negative (time cannot shrink with more work): the solve is an
active-set non-negative least squares, not a clamp.

The fit is a Huber M-estimate, because a shared machine produces measurements no model
can predict (another process takes the core for a while, a page fault, a GC pause): each
measurement gets a weight ``min(1, k * s / e)`` where ``e`` is its relative error against
the current fit and ``s`` the *robust scale* of recent errors (their median / 0.6745, a
median absolute deviation about zero, so a model that is merely biased is not mistaken
for one that sees outliers).  A measurement ``k`` scales or more off the fit moves
``theta`` like one at ``k`` scales, however far off it is; a lasting change (the machine
got slower) raises the recent errors, hence the scale, and is learned within a few
measurements.  Every ``window`` measurements the weights of the whole window are
recomputed against the current fit (iteratively reweighted least squares, one pass at a
time) and the sums rebuilt, which also washes out their floating-point drift.

Pure Python: a 3-4 parameter normal-equation solve is microseconds, and the inner ring
must not import numpy-heavy stacks (let alone torch).
"""

from __future__ import annotations

import math
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


HUBER_K = 3.0  # errors beyond this many robust scales are down-weighted
SCALE_WINDOW = 32  # recent out-of-sample errors that set the robust scale
MIN_SCALE = 0.01  # a relative scale floor: a near-perfect model does not flag 2 % as an outlier
WARMUP = 8  # measurements before any is down-weighted (no scale to judge by yet)
_MAD = 0.6745  # median |N(0, 1)|: median absolute error / _MAD estimates the noise's sigma
DRIFT_ALPHA = 0.5  # EMA gain of the recent log residuals (the machine's speed right now)
DRIFT_FORGET = 0.99  # memory of the regression that says how far the recent residuals carry
DRIFT_AFTER = WARMUP  # measurements in the fit before its residuals teach the drift


@dataclass
class LinearTimeModel:
    """``t = theta . features``, calibrated online toward measurements (Huber-robust).

    ``ridge`` is the weight (in units of one measurement) of the pull toward the prior on
    each coefficient; ``refit_every`` trades freshness for speed in long simulations;
    ``huber_k`` is where down-weighting starts, in robust scales (``inf``: plain least
    squares).
    """

    name: str
    prior: tuple[float, ...]
    window: int = 256
    ridge: float = 0.5
    refit_every: int = 1
    huber_k: float = HUBER_K
    theta: list[float] = field(init=False)
    _xs: deque = field(init=False, repr=False)
    _ys: deque = field(init=False, repr=False)
    _ws: deque = field(init=False, repr=False)  # each sample's Huber weight
    errors: deque = field(init=False, repr=False)
    _recent: deque = field(init=False, repr=False)
    observations: int = field(init=False, default=0)
    drift: float = field(init=False, default=1.0)  # multiplier for the machine's current speed
    downweighted: int = field(init=False, default=0)  # measurements that joined with weight < 1
    # Weighted normal-equation sums over the window, kept incrementally (a row joins on
    # observe and leaves when the window evicts it), so a refit is a small solve.
    _ata: list = field(init=False, repr=False)
    _atb: list = field(init=False, repr=False)
    _w: float = field(init=False, repr=False, default=0.0)  # the window's total weight

    def __post_init__(self) -> None:
        if any(p < 0 for p in self.prior):
            raise ValueError(f"{self.name}: prior coefficients must be >= 0: {self.prior}")
        self.theta = list(self.prior)
        self._xs = deque(maxlen=self.window)
        self._ys = deque(maxlen=self.window)
        self._ws = deque(maxlen=self.window)
        self.errors = deque(maxlen=4096)
        self._recent = deque(maxlen=SCALE_WINDOW)
        self._level = 0.0  # EMA of log(measured / fit)
        self._smm = self._smr = 0.0  # forgetting sums of level * level, level * next residual
        self._reset_sums()

    def predict(self, x: tuple[float, ...] | list[float]) -> float:
        """The fit, times how much slower (or faster) than the fit the stage ran lately."""
        return self.drift * sum(t * f for t, f in zip(self.theta, x))

    def fit_s(self, x: tuple[float, ...] | list[float]) -> float:
        """The fit alone: the stage's typical time over the window, without the drift."""
        return sum(t * f for t, f in zip(self.theta, x))

    def observe(self, x: tuple[float, ...] | list[float], measured_s: float, scored: bool = True) -> float:
        """Score the current prediction against ``measured_s``, then learn from it.

        Returns the relative error of the prediction made before this measurement.
        ``scored=False``: a measurement taken before any prediction was used (a start-up
        calibration): learned, but its error joins neither the reported errors nor the
        robust scale.
        """
        if measured_s <= 0:
            return 0.0
        base = self.fit_s(x)
        pred = self.drift * base
        err = abs(pred - measured_s) / measured_s
        if scored:
            self.errors.append(err)
        scale = self.scale()
        # One wild measurement moves the drift by at most a factor e ** DRIFT_ALPHA.  The
        # residuals of a cold start (against the prior, then against a fit of two or three
        # measurements) say how far off the prior was, not how fast the machine runs now:
        # the drift learns from residuals against a fit of WARMUP measurements or more.
        if base > 0 and self.observations >= DRIFT_AFTER:
            self._track(max(-1.0, min(1.0, math.log(measured_s / base))))
        w = self._huber(err, scale)
        self.downweighted += w < 1.0
        if scored:
            self._recent.append(err)
        if len(self._xs) == self.window:  # the deque is about to evict its oldest sample
            self._accumulate(self._xs[0], self._ys[0], -self._ws[0])
        self._xs.append(tuple(x))
        self._ys.append(measured_s)
        self._ws.append(w)
        self._accumulate(x, measured_s, w)
        self.observations += 1
        if self.observations % self.window == 0:
            self.reweight()
        elif self.observations % self.refit_every == 0:
            self.refit()
        return err

    def _track(self, r: float) -> None:
        """Learn how much the recent residuals predict the next one; set ``drift``.

        On a shared machine a slow spell lasts several measurements, so the last few
        residuals predict the next; in the simulator the noise is independent and they do
        not.  ``rho`` is the regression coefficient of a residual on the EMA of the ones
        before it (clipped to [0, 1]), so the correction is as strong as the data shows it
        to be, and vanishes where residuals are independent.
        """
        f = DRIFT_FORGET
        self._smm = f * self._smm + self._level * self._level
        self._smr = f * self._smr + self._level * r
        self._level += DRIFT_ALPHA * (r - self._level)
        rho = min(1.0, max(0.0, self._smr / self._smm)) if self._smm > 0 else 0.0
        self.drift = math.exp(max(-3.0, min(3.0, rho * self._level)))

    def scale(self) -> float | None:
        """Robust scale of the recent relative errors (None while there are too few)."""
        if len(self._recent) < WARMUP:
            return None
        return max(MIN_SCALE, median(self._recent) / _MAD)

    def _huber(self, err: float, scale: float | None) -> float:
        if scale is None:
            return 1.0
        limit = self.huber_k * scale
        return 1.0 if err <= limit else limit / err

    def _reset_sums(self) -> None:
        n = len(self.prior)
        self._ata = [[0.0] * n for _ in range(n)]
        self._atb = [0.0] * n
        self._w = 0.0

    def _accumulate(self, x, y: float, w: float) -> None:
        """Add (w > 0) or remove (w < 0) one sample's weighted row ``x / y`` (target 1)."""
        n = len(self.prior)
        row = [x[j] / y for j in range(n)]
        ata, atb = self._ata, self._atb
        self._w += w
        for i in range(n):
            ri = row[i]
            if ri == 0.0:
                continue
            wri = w * ri
            atb[i] += wri
            for j in range(n):
                ata[i][j] += wri * row[j]

    def refit(self) -> None:
        """Weighted ridge least squares on relative residuals (see the module docstring).

        Minimises ``sum w (theta.x / y - 1)^2 + ridge * sum_j m_j (theta_j - g p_j)^2``
        over ``theta >= 0``, where ``m_j`` is the mean square of ``x_j / y`` over the
        window (so each term is in units of one measurement's squared relative error) and
        ``g`` rescales the prior ``p`` to fit the window.
        """
        n, p, ata, atb, ridge = len(self.prior), self.prior, self._ata, self._atb, self.ridge
        if self._w <= 0:
            return
        pap = pb = 0.0
        for i in range(n):
            row, acc = ata[i], 0.0
            for j in range(n):
                acc += row[j] * p[j]
            pap += p[i] * acc
            pb += p[i] * atb[i]
        g = pb / pap if pap > 0 else 1.0  # the one factor that fits the window best
        d = [max(0.0, ata[j][j] / self._w) ** 0.5 for j in range(n)]  # a feature's RMS share
        theta = [g * p[j] for j in range(n)]  # a feature never seen keeps the rescaled prior
        # (an evicted feature leaves rounding dust, not a feature)
        free = [j for j in range(n) if d[j] > 1e-150]
        while free:  # active set: drop the most negative coefficient and solve again
            # (a dropped coefficient is 0 and an unseen feature has no sums: neither enters b)
            a = [[ata[i][j] / (d[i] * d[j]) for j in free] for i in free]
            for k in range(len(free)):
                a[k][k] += ridge
            b = [atb[i] / d[i] + ridge * g * p[i] * d[i] for i in free]
            try:
                u = _solve(a, b)
            except ZeroDivisionError:
                return
            worst = min(range(len(free)), key=u.__getitem__)
            if u[worst] >= 0:
                for k, j in enumerate(free):
                    theta[j] = u[k] / d[j]
                break
            theta[free.pop(worst)] = 0.0
        self.theta = theta

    def reweight(self) -> None:
        """One IRLS pass over the window: weights from the current fit, sums rebuilt, refit.

        The scale is that of the window's in-sample errors (what the fit leaves), so a
        sample that only looked far off against an older fit gets its full weight back.
        """
        self.refit()
        errs = [abs(self.fit_s(x) - y) / y for x, y in zip(self._xs, self._ys)]
        scale = max(MIN_SCALE, median(errs) / _MAD) if len(errs) >= WARMUP else None
        self._ws = deque((self._huber(e, scale) for e in errs), maxlen=self.window)
        self._reset_sums()
        for x, y, w in zip(self._xs, self._ys, self._ws):
            self._accumulate(x, y, w)
        self.refit()

    def median_rel_error(self) -> float | None:
        """Median out-of-sample relative error over the run (the last 4096 measurements)."""
        return median(self.errors) if self.errors else None

    def recent_rel_error(self) -> float | None:
        """Median out-of-sample relative error of the last few measurements (None: none yet)."""
        return median(self._recent) if self._recent else None
