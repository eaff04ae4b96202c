"""A live one-line progress display for long runs.

    step 12/100 (12%) | reward 0.532 | val 0.610 | 1.23k tok/s | idle rollout 3% train 12% |
    stale 0.8/2 | 0:41 | ETA 5:02          (one line on screen)

``val`` is the latest validation score (absent until the first validation); when one
response is more than ``COLLAPSE_SHARE`` of that validation's responses, the line says so
(``val 0.500 COLLAPSE? 52% one response``): a policy that answers everything alike
may still score (a letter-counting run rose to 0.50 answering "0" to every prompt).

On a terminal the line is redrawn in place with ``\\r`` (at most every
``min_refresh_s``, truncated to the terminal width so it never wraps, which would break
the redraw).  In CI logs and files carriage returns pile up into one enormous line, so
there a plain line is printed every ``every_s`` seconds, plus the first and last step.

The clock and the stream are injectable so the display is testable without sleeping.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

__all__ = ["COLLAPSE_SHARE", "ProgressLine", "format_duration", "format_progress"]

COLLAPSE_SHARE = 0.5
"""A validation whose most common response is more than this share of all is flagged."""


def format_duration(seconds: float) -> str:
    """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``."""
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}"


def format_progress(
    step: int,
    total_steps: int,
    *,
    elapsed_s: float | None = None,
    eta_s: float | None = None,
    reward: float | None = None,
    val_score: float | None = None,
    val_mode_share: float | None = None,
    tokens_per_s: float | None = None,
    idle_ratios: Mapping[str, float] | None = None,
    staleness_mean: float | None = None,
    staleness_max: float | None = None,
    slow_rewards: int | None = None,
) -> str:
    """The progress line; fields that are None are left out."""
    pct = 100.0 * step / total_steps if total_steps > 0 else 0.0
    parts = [f"step {step}/{total_steps} ({pct:.0f}%)"]
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    if val_score is not None:
        collapse = val_mode_share is not None and val_mode_share > COLLAPSE_SHARE
        parts.append(f"val {val_score:.3f}" + (f" COLLAPSE? {100 * val_mode_share:.0f}% one response"
                                                if collapse else ""))
    if tokens_per_s is not None:
        parts.append(f"{_si(tokens_per_s)} tok/s")
    if idle_ratios:
        parts.append("idle " + " ".join(f"{pool} {100 * r:.0f}%" for pool, r in idle_ratios.items()))
    if staleness_mean is not None or staleness_max is not None:
        mean = "-" if staleness_mean is None else f"{staleness_mean:.1f}"
        peak = "-" if staleness_max is None else f"{staleness_max:g}"
        parts.append(f"stale {mean}/{peak}")
    if slow_rewards:  # reward calls over 1 s (runtime.reward_call): they hold up every step
        parts.append(f"slow rewards {slow_rewards}")
    if elapsed_s is not None:
        parts.append(format_duration(elapsed_s))
    if eta_s is not None:
        parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


class ProgressLine:
    """Shows training progress on one line (TTY) or as periodic plain lines (logs).

    ``start_step`` is the step a resumed run starts from, so the ETA uses only the steps
    done by this process.  ``tty=None`` asks the stream.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every_s: float = 30.0,
        min_refresh_s: float = 0.1,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_steps = int(total_steps)
        self.stream = stream if stream is not None else sys.stdout
        is_tty = getattr(self.stream, "isatty", lambda: False)
        self.tty = bool(is_tty()) if tty is None else tty
        self.every_s = every_s
        self.min_refresh_s = min_refresh_s
        self.start_step = start_step
        self._clock = clock
        self._t0 = clock()
        self._last_emit: float | None = None
        self._pending: str | None = None  # newest line not yet shown
        self._drawn_len = 0
        self._closed = False

    def eta_s(self, step: int, now: float | None = None) -> float | None:
        """Seconds left at the average pace of this process's steps so far."""
        done = step - self.start_step
        if done <= 0:
            return None
        elapsed = (self._clock() if now is None else now) - self._t0
        return elapsed / done * max(self.total_steps - step, 0)

    def update(self, step: int, **fields: Any) -> str:
        """Record progress after ``step`` finished steps; returns the formatted line.

        ``fields``: ``format_progress``'s ``reward``, ``val_score``, ``val_mode_share``, ``tokens_per_s``,
        ``idle_ratios``,
        ``staleness_mean``, ``staleness_max`` and ``slow_rewards``; elapsed time and ETA come from the clock.
        """
        now = self._clock()
        line = format_progress(step, self.total_steps, elapsed_s=now - self._t0, eta_s=self.eta_s(step, now), **fields)
        self._pending = line
        interval = self.min_refresh_s if self.tty else self.every_s
        due = self._last_emit is None or now - self._last_emit >= interval
        if due or step >= self.total_steps:
            self._emit(now)
        return line

    def _emit(self, now: float) -> None:
        if self._pending is None:
            return
        line = self._pending
        if self.tty:
            width = shutil.get_terminal_size(fallback=(120, 24)).columns - 1
            line = line[: max(width, 10)]
            pad = " " * max(self._drawn_len - len(line), 0)  # erase a longer previous line
            self.stream.write("\r" + line + pad)
            self._drawn_len = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._pending = None
        self._last_emit = now

    def close(self) -> None:
        """Show the newest line and end it, so later output starts on a fresh line."""
        if self._closed:
            return
        self._closed = True
        self._emit(self._clock())
        if self.tty and self._drawn_len:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
