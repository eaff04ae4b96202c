"""Tokens responses decode inside a window: what sets a replica's load while a batch drains.

The planner's tails (``stages._tail``) need, for every batch in flight beside the one
that drains, how many tokens its responses still decode before that batch's longest
response ends.  ``Residual`` answers it in expectation over the length distribution, on
the planner's quantile grid (``lengths.LengthStats.quantiles``), in O(log K) a window.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

SCALAR_WINDOWS = 32  # up to this many windows, ``in_window`` computes them one by one in
# Python floats: a drain asks for 1-5 windows ~90,000 times at 256 devices, where numpy's
# per-call overhead was most of the planner's time; same operations, same results, bit for bit


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
        self._q_list = q.tolist()  # the same grid as Python floats (``_window``)
        self._suffix_list = self._suffix.tolist()
        self._prefix_sq_list = self._prefix_sq.tolist()

    def left(self, u):
        """``R(u)``: tokens a response has left after ``u`` decode steps, in expectation
        (``u`` a number or an array)."""
        u = np.asarray(u, dtype=float)
        i = np.searchsorted(self.q, u, side="right")
        out = (self._suffix[i] - u * (self.k - i)) / self.k
        return np.where(u <= 0, self.mean, out)

    def _h(self, v: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.q, v, side="right")
        out = (0.5 * self._prefix_sq[i] + v * self._suffix[i] - 0.5 * v * v * (self.k - i)) / self.k
        return np.where(v <= 0, self.mean * v, out)

    def _left_one(self, u: float) -> float:
        """``left`` of one number, in the same float operations."""
        if u <= 0:
            return self.mean
        i = bisect_right(self._q_list, u)
        return (self._suffix_list[i] - u * (self.k - i)) / self.k

    def _h_one(self, v: float) -> float:
        """``_h`` of one number, in the same float operations."""
        if v <= 0:
            return self.mean * v
        i = bisect_right(self._q_list, v)
        return (0.5 * self._prefix_sq_list[i] + v * self._suffix_list[i]
                - 0.5 * v * v * (self.k - i)) / self.k

    def _window(self, x: float, o1: float, o2: float) -> float:
        """``in_window`` of one window (``o1``, ``o2`` numbers)."""
        width = o2 - o1
        if width <= 1e-9 * max(1.0, abs(o2)):
            return self._left_one(-o1) - self._left_one(x - o1)
        h = self._h_one
        return (h(-o1) - h(-o2) - h(x - o1) + h(x - o2)) / width

    def in_window(self, x: float, o1, o2):
        """Tokens one response decodes in a window of ``x`` steps when it starts at an offset
        uniform on ``[o1, o2]`` (steps from the window's opening; negative: before it);
        ``o1``, ``o2`` numbers or arrays of windows.  It is ``M(0) - M(x)``, ``M(c)`` the
        mean of ``R(max(0, c - o))``: ``(H(c - o1) - H(c - o2)) / (o2 - o1)``, or
        ``R(max(0, c - o1))`` for a window of one start."""
        o1, o2 = np.asarray(o1, dtype=float), np.asarray(o2, dtype=float)
        if o1.ndim == 1 and o2.shape == o1.shape and len(o1) <= SCALAR_WINDOWS:
            x = float(x)
            return np.array([self._window(x, a, b) for a, b in zip(o1.tolist(), o2.tolist())],
                            dtype=float)
        shape = o1.shape
        if o1.ndim != 1 or o2.shape != shape:  # numbers, or arrays to broadcast
            shape = np.broadcast_shapes(o1.shape, o2.shape)
            o1, o2 = np.broadcast_to(o1, shape).ravel(), np.broadcast_to(o2, shape).ravel()
        n = len(o1)
        width = o2 - o1
        point = width <= 1e-9 * np.maximum(1.0, np.abs(o2))
        v = np.empty(4 * n)  # the four H arguments in one array: one search on the grid
        np.negative(o1, out=v[:n])
        np.negative(o2, out=v[n:2 * n])
        np.subtract(x, o1, out=v[2 * n:3 * n])
        np.subtract(x, o2, out=v[3 * n:])
        h = self._h(v)
        out = (h[:n] - h[n:2 * n] - h[2 * n:3 * n] + h[3 * n:]) / np.where(point, 1.0, width)
        if point.any():  # windows of one start: R at its two ends
            r = self.left(np.concatenate((v[:n], v[2 * n:3 * n])))
            out = np.where(point, r[:n] - r[n:], out)
        return out.reshape(shape)
