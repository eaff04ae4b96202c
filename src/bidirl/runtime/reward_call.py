"""The guarded call of the user's reward function: a time limit, and no way out of the driver.

Why: the reward function is user code the driver calls while the devices wait for the next
step.  Unguarded, one that sleeps 30 s stalled the whole run with no message (both pools
99 % idle), and one that called ``sys.exit(3)`` ended the driver with no bidirl line.  So
:class:`RewardGuard` runs each call on a daemon thread and waits for it at most
``data.reward_timeout_s``:

- a call that overruns is abandoned, not joined (its thread finishes or hangs on its own and,
  a daemon, never holds up the process's exit) and its outcome is a :class:`RewardTimeout`
  naming the function and the setting: a bad reward, handled by ``data.on_bad_reward``;
- whatever the call raises, ``SystemExit``, ``KeyboardInterrupt`` and other
  ``BaseException``s included, is its outcome (a bad reward), never re-raised in the driver;
- a call over :data:`SLOW_REWARD_S` is counted (:class:`RewardCallStats`, shown on the
  progress line as ``slow rewards N``) and the first one is reported once.

Calls run one at a time on one reused thread (a fresh one after an abandoned call), so a
reward function that keeps per-thread state sees one thread, as it did on the driver's.
A function that installs a signal handler (``signal.alarm`` time limits are common in math
checkers) can do so only on the main thread: the first time that fails there, the guard calls
it on the driver's thread from then on, without this time limit (the function's alarm
still applies; a ``KeyboardInterrupt`` there is not caught, as it may be the user's Ctrl-C),
and says so once.

Also here, what a call returned, read (:func:`reward_value`, :func:`reward_extras`,
:func:`describe_bad_reward`; ``runtime/group_store.py`` explains what counts as a bad reward) and
:class:`RewardFn`, a user's reward function with its guard.
"""

from __future__ import annotations

import math
import numbers
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bidirl.algo.data import DataError

DEFAULT_REWARD_TIMEOUT_S = 30.0
SLOW_REWARD_S = 1.0
"""A reward call taking longer than this is counted as slow (it holds up the training step)."""


class RewardTimeout(Exception):
    """A reward call that did not return within ``data.reward_timeout_s`` (and was abandoned)."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        super().__init__(f"did not return within {timeout_s:g} s (data.reward_timeout_s={timeout_s:g}; "
                         "the call was abandoned)")


@dataclass
class RewardCallStats:
    """How the reward calls went: all of them, the slow ones (timed-out ones included), the
    timed-out ones, and the longest one that returned."""

    calls: int = 0
    slow: int = 0
    timed_out: int = 0
    longest_s: float = 0.0


class _Worker:
    """One daemon thread running the calls it is given, one at a time, until told to stop."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="bidirl-reward", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, args, outcome, done = job
            try:
                outcome.append((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from user code too
                outcome.append((False, e))
            done.set()

    def run(self, fn: Callable, args: tuple, timeout_s: float) -> tuple[bool, Any] | None:
        """(returned?, value or exception), or None when the call did not end in ``timeout_s``."""
        outcome: list[tuple[bool, Any]] = []
        done = threading.Event()
        self.jobs.put((fn, args, outcome, done))
        if not done.wait(timeout_s):
            self.jobs.put(None)  # abandoned: the thread ends once (if ever) the call returns
            return None
        return outcome[0]


def _needs_main_thread(e: BaseException) -> bool:
    return isinstance(e, ValueError) and "main thread" in str(e) and "signal" in str(e)


class RewardGuard:
    """Calls a reward function under the guard described in the module doc.

    ``name`` (``file.py:function``) is what the messages call the function.
    """

    def __init__(self, timeout_s: float = DEFAULT_REWARD_TIMEOUT_S, name: str = "the reward function",
                 slow_s: float = SLOW_REWARD_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s, self.name, self.slow_s = float(timeout_s), name, slow_s
        self.stats = RewardCallStats()
        self.on_main_thread = False  # the function needs signals: called on the driver's thread
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # picklable (a thread and a lock are not): a copy starts its own
        return {k: v for k, v in self.__dict__.items() if k not in ("_worker", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _worker=None, _lock=threading.Lock())

    def call(self, fn: Callable, *args: Any) -> tuple[bool, Any]:
        """``(True, what fn returned)`` or ``(False, what it raised or a RewardTimeout)``."""
        with self._lock:
            t0 = time.perf_counter()
            outcome = self._call_inline(fn, args) if self.on_main_thread else self._call_on_worker(fn, args)
            if (not outcome[0] and _needs_main_thread(outcome[1]) and not self.on_main_thread
                    and threading.current_thread() is threading.main_thread()):
                self.on_main_thread = True
                print(f"[bidirl] warning: {self.name} installs a signal handler, which works on the main thread "
                      f"only: it is called there from now on, without data.reward_timeout_s "
                      f"({self.timeout_s:g} s); its own time limit applies", file=sys.stderr)
                t0 = time.perf_counter()
                outcome = self._call_inline(fn, args)
            self._count(outcome, time.perf_counter() - t0)
            return outcome

    def _call_on_worker(self, fn: Callable, args: tuple) -> tuple[bool, Any]:
        if self._worker is None:
            self._worker = _Worker()
        outcome = self._worker.run(fn, args, self.timeout_s)
        if outcome is None:
            self._worker = None
            return False, RewardTimeout(self.name, self.timeout_s)
        return outcome

    @staticmethod
    def _call_inline(fn: Callable, args: tuple) -> tuple[bool, Any]:
        """On the driver's thread: ``KeyboardInterrupt`` is not caught there (it may be the
        user's third Ctrl-C, which ends bidirl at once)."""
        try:
            return True, fn(*args)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's function: any failure is a bad reward
            return False, e

    def _count(self, outcome: tuple[bool, Any], seconds: float) -> None:
        s = self.stats
        s.calls += 1
        timed_out = isinstance(outcome[1], RewardTimeout) and not outcome[0]
        s.timed_out += timed_out
        if not timed_out:
            s.longest_s = max(s.longest_s, seconds)
        if timed_out or seconds > self.slow_s:
            s.slow += 1
            if s.slow == 1 and not timed_out:
                print(f"[bidirl] warning: {self.name} took {seconds:.1f} s for one response (over "
                      f"{self.slow_s:g} s): reward calls hold up the training step; slow ones are counted on "
                      "the progress line (slow rewards N)", file=sys.stderr)


def slow_calls(reward_fn: Any) -> int:
    """How many of ``reward_fn``'s calls were slow (``0`` for a function without a guard)."""
    guard = getattr(reward_fn, "guard", None)
    return guard.stats.slow if isinstance(guard, RewardGuard) else 0


# -- what a reward function returned -------------------------------------------------------
OnBadReward = Literal["error", "zero"]


class BadRewardError(DataError):
    """The reward function raised, or returned something that is not a finite number."""


def reward_value(value: Any) -> float | None:
    """The reward as a finite float, or None when ``value`` is not one.

    Numbers (bool and int included; numpy scalars and 0-d arrays or tensors too) and
    ``{"score": number, ...}`` dicts (veRL's richer return) are rewards; NaN, inf, numbers
    beyond float32's range (advantages are float32) and everything else are not.
    """
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # np.float32(1), np.bool_(True), torch.tensor(1.0)
    if isinstance(value, numbers.Real):
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
        return x if math.isfinite(x) and abs(x) <= _FLOAT32_MAX else None
    return None


_FLOAT32_MAX = 3.4028234663852886e38


def one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_bad_reward(raw: Any) -> str:
    """What was wrong, in a few words: ``returned nan`` / ``raised KeyError: 'x'`` /
    ``did not return within 30 s (data.reward_timeout_s=30; ...)``."""
    if isinstance(raw, RewardTimeout):
        return str(raw)
    if isinstance(raw, BaseException):
        return f"raised {type(raw).__name__}: {one_line(str(raw), 160)}"
    if isinstance(raw, dict):
        kind = "a dict whose 'score' is not a finite number" if "score" in raw else "a dict without a 'score'"
    elif isinstance(raw, numbers.Real):
        try:
            finite = math.isfinite(float(raw))
        except OverflowError:  # an int beyond any float, e.g. 10**400
            finite = False
        kind = "not a finite float32 number" if finite else "not a finite number"
    else:
        kind = f"a {type(raw).__name__}, not a number"
    return f"returned {one_line(repr(raw), 80)} ({kind})"


def reward_extras(raw: Any) -> dict[str, float]:
    """The finite numbers of a dict reward besides ``"score"`` (veRL's extra keys, e.g. ``acc``);
    logged as ``reward/extra/<key>`` means.  Anything else in the dict is ignored."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for k, v in raw.items():
        if k == "score":
            continue
        x = reward_value(v)
        if x is not None:
            out[str(k)] = x
    return out


_PLAIN_GUARD = RewardGuard()  # for a bare function (tests): the default time limit


def call_reward(reward_fn: Callable, data_source: str, solution_str: str, ground_truth: Any,
                extra_info: dict) -> tuple[float | None, Any]:
    """(reward or None, what the function returned, or raised, or a ``RewardTimeout``), called
    under the function's guard (a :class:`RewardFn`'s, else a default one)."""
    guard = getattr(reward_fn, "guard", None) or _PLAIN_GUARD
    returned, raw = guard.call(reward_fn, data_source, solution_str, ground_truth, extra_info)
    return (reward_value(raw) if returned else None), raw


@dataclass
class RewardFn:
    """The run's reward function with the choice for bad rewards (``data.on_bad_reward``) and
    its guard (``data.reward_timeout_s``; ``guard.stats`` counts slow and timed-out calls).

    ``GroupStore.score`` reads ``on_bad_reward`` from it, so the choice travels with the
    function wherever the runtime passes it.
    """

    fn: Callable[..., Any]
    on_bad_reward: OnBadReward = "error"
    name: str = "compute_score"
    timeout_s: float = DEFAULT_REWARD_TIMEOUT_S
    guard: RewardGuard = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.guard = RewardGuard(self.timeout_s, self.name)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None):
        return self.fn(data_source, solution_str, ground_truth, extra_info)
