"""Graceful stops: SIGINT / SIGTERM ask the run to stop at the next step boundary.

The first signal lets the step in progress finish (the step boundary checkpoints it, then
the session writes the summary, trace and timeline); a second abandons the step in
progress; a third goes to the handler that was there before: under ``bidirl train``, the
driver's own (``exits.DriverSignals``), which unwinds the run at once through the Ray
session (Ray stopped, temporary files removed, one line); elsewhere Python's
(``KeyboardInterrupt``) or the default.  The handlers are installed after Ray starts (which
runs ``ray.init`` off the main thread, so Ray sets none of its own), in the driver only, and
put back afterwards.
"""

from __future__ import annotations

import signal
import sys
import threading

from bidirl.controller.queue import GenerationCapError
from bidirl.engines.trainer_config import NonFiniteStepError


class SignalHandlers:
    """SIGINT / SIGTERM handled by ``handle`` between ``install`` and ``restore``, the previous
    handlers put back after; outside the main thread (where Python allows no handler) nothing
    is installed. The loop's ``StopSignals`` and the driver's ``exits.DriverSignals`` share it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    def handle(self, signum: int, frame=None) -> None:
        raise NotImplementedError

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in self.SIGNALS:
            self._previous[s] = signal.getsignal(s)
            signal.signal(s, self.handle)

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()


class StopSignals(SignalHandlers):
    """SIGINT / SIGTERM while the loop runs: stop at the next step boundary; again: now.

    The handler only records the signal (and prints one line): the loop checks
    ``requested`` at each step boundary and ``abandon`` after each wait; the second signal
    puts the previous handlers back, so a third ends bidirl at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None
        self.count = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def abandon(self) -> bool:
        return self.count >= 2

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum or 0)

    def handle(self, signum: int, frame=None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        name = signal.Signals(signum).name
        if self.count == 1:
            print(f"\n[bidirl] {name}: stopping at the next step boundary (checkpoint, summary, trace); "
                  f"send it again to abandon the step in progress", file=sys.stderr, flush=True)
        elif self.count == 2:
            print(f"\n[bidirl] {name} again: abandoning the step in progress (no new checkpoint); "
                  "a third signal ends bidirl at once", file=sys.stderr, flush=True)
            self.restore()


def nonfinite_step_error(e: BaseException):
    """The ``NonFiniteStepError`` that ``e`` is (or that Ray's ``RayTaskError`` wraps), or None."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, NonFiniteStepError):
        return cause
    return e if isinstance(e, NonFiniteStepError) else None


def clean_stop_error(e: BaseException):
    """An error after which the run stops cleanly at its last step boundary (checkpoint,
    summary, outputs, then the error in one line): a non-finite step under
    ``trainer.on_nonfinite=stop``, or a step that needs more groups than
    ``algorithm.filter_groups.max_num_gen_batches`` allows (``GenerationCapError``, raised by
    the controller).  None for any other error."""
    return e if isinstance(e, GenerationCapError) else nonfinite_step_error(e)

