"""Tokens responses decode inside a window: what sets a replica's load while a batch drains.

The planner's tails (``stages._tail``) need, for every batch in flight beside the one
that drains, how many tokens its responses still decode before that batch's longest
response ends.  ``Residual`` answers it in expectation over the length distribution, on
the planner's quantile grid (``lengths.LengthStats.quantiles``), in O(log K) a window.
"""

from __future__ import annotations

import numpy as np


class Residual:
    """Tokens a response decodes inside a window, in expectation over the lengths.

    A response that started ``-o`` decode steps before a window of ``X`` steps opens (``o``
    its start offset, negative before the window) decodes ``R(max(0, -o)) - R(max(0, X - o))``
    tokens in it, with ``R(u) = E[(L - u)+]`` the tokens left after ``u`` steps.  For
    starts spread uniformly over ``[o1, o2]`` the mean is a difference of
    ``H(v) = int_0^v R(max(0, w)) dw`` (``J(u) = E[min(L, u) L - min(L, u)^2 / 2]`` for
    ``v >= 0``, ``E[L] v`` below), so every window is O(log K) on the quantile grid.
    """

    def __init__(self, quantiles) -> None:
        q = np.sort(np.asarray(quantiles, dtype=float))
        self.q, self.k = q, len(q)
        self.top = float(q[-1])
        self.mean = float(q.mean())
        self.cv = float(q.std() / self.mean) if self.mean > 0 else 0.0  # of one length
        self._suffix = np.concatenate((np.cumsum(q[::-1])[::-1], [0.0]))  # sum of q[i:]
        self._prefix_sq = np.concatenate(([0.0], np.cumsum(q * q)))  # sum of q[:i]^2

    def left(self, u: float) -> float:
        """``R(u)``: tokens a response has left after ``u`` decode steps, in expectation."""
        if u <= 0:
            return self.mean
        i = int(np.searchsorted(self.q, u, side="right"))
        return (self._suffix[i] - u * (self.k - i)) / self.k

    def _h(self, v: float) -> float:
        if v <= 0:
            return self.mean * v
        i = int(np.searchsorted(self.q, v, side="right"))
        return (0.5 * self._prefix_sq[i] + v * self._suffix[i] - 0.5 * v * v * (self.k - i)) / self.k

    def _mean_left(self, c: float, o1: float, o2: float) -> float:
        """Mean of ``R(max(0, c - o))`` over ``o`` uniform on ``[o1, o2]``."""
        if o2 - o1 <= 1e-9 * max(1.0, abs(o2)):
            return self.left(c - o1)
        return (self._h(c - o1) - self._h(c - o2)) / (o2 - o1)

    def in_window(self, x: float, o1: float, o2: float) -> float:
        """Tokens one response decodes in a window of ``x`` steps when it starts at an offset
        uniform on ``[o1, o2]`` (steps from the window's opening; negative: before it)."""
        return self._mean_left(0.0, o1, o2) - self._mean_left(x, o1, o2)
