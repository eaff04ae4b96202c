"""How a rollout replica times its engine steps for the stage models.

A step that prefills nothing is a *decode step*: it is reported with the features of the
decode-step model (running batch, context tokens) and its seconds.  Steps that prefill (new
requests, or every live one re-submitted after a weight update, which vLLM may cut into
several chunked-prefill steps) are not decode steps: consecutive ones form a *burst*,
reported as one :class:`~bidirl.runtime.messages.PrefillBurst`: its prompt tokens, its steps
with the decode work they carried (steps, running batch, context tokens), their whole time,
and the measurement: the time beyond the decode steps the engine would have run anyway,
taken as the median of the last ``DECODE_REF_STEPS`` pure decode steps (one step's time
scatters as much as the prefill taken from it).

Not thread-safe: ``RolloutRole`` calls it under its condition's lock.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from bidirl.runtime.messages import PrefillBurst

DECODE_REF_STEPS = 3  # pure decode steps whose median a prefill step's time is taken beyond


class StepTiming:
    """Decode steps and prefill bursts measured since they were last taken (``take``)."""

    def __init__(self) -> None:
        self._burst = [0, 0, 0, 0, 0.0, 0.0]  # the burst in progress: PrefillBurst's fields
        self._recent_decode_s: deque[float] = deque(maxlen=DECODE_REF_STEPS)
        self._decode: list[tuple[int, int, float]] = []  # (batch, context tokens, seconds)
        self._prefills: list[PrefillBurst] = []

    def decode_step(self, batch: int, context: int, seconds: float) -> None:
        self._decode.append((batch, context, seconds))
        self._recent_decode_s.append(seconds)

    def prefill_step(self, tokens: int, seconds: float, decoding: int, context: int, burst_over: bool) -> None:
        """One step that prefilled ``tokens`` and decoded ``decoding`` requests (past their
        prefill, ``context`` tokens); ``burst_over``: nothing is left to prefill (or no slot
        is free for it)."""
        ref = median(self._recent_decode_s) if decoding and self._recent_decode_s else 0.0
        for i, x in enumerate((tokens, 1, decoding, context, seconds, max(0.0, seconds - ref))):
            self._burst[i] += x
        if burst_over:
            self._prefills.append(PrefillBurst(*self._burst))
            self.cut_burst()

    def cut_burst(self) -> None:
        """Drop the burst in progress (its requests were aborted: it measures nothing)."""
        self._burst = [0, 0, 0, 0, 0.0, 0.0]

    def take(self) -> tuple[list[tuple[int, int, float]], list[PrefillBurst]]:
        """The decode steps and the finished bursts since the last call."""
        out = self._decode, self._prefills
        self._decode, self._prefills = [], []
        return out
