"""One multi-turn episode: model turns and environment turns, under a time, turn and length limit.

:func:`run_episode_async` (and :func:`run_episode`, its blocking form) alternates a model turn
(``generate(messages) -> text``, given by the caller: the runtime's engine, a test's script)
with an environment turn (``env.step(text)``) until the environment says done or a limit is
reached, and returns a :class:`Trajectory`: every turn with its role, text, token count and
whether it trains (model tokens train; the prompt's and the environment's are masked out of
the loss).  It never raises for what the environment does: an environment that raises,
overruns ``turn_timeout_s`` or returns a wrong shape ends the trajectory with a recorded
outcome, and the caller goes on.  The outcomes (:data:`OUTCOMES`):

- ``done``: the environment said so;
- ``max_turns``: ``max_turns`` model turns and not done;
- ``max_length``: the conversation's tokens (prompt, model and environment) passed
  ``max_total_tokens`` (checked after ``reset`` and after every environment turn, so the
  model turn that crosses the line is still stepped, and scored);
- ``env_error``: ``reset``/``step`` raised or returned a wrong shape (``Trajectory.error`` says what);
- ``env_timeout``: ``reset``/``step`` did not return within ``turn_timeout_s``.

Why the environment runs on a thread of its own (:class:`EnvThread`, a daemon with its own
asyncio loop, one per episode): a tool may block (a sync ``time.sleep``, a subprocess) or
hang, and it must never hold up the caller's event loop, where the runtime will schedule
other trajectories meanwhile.  The caller awaits the call with a time limit; a call that
overruns is abandoned (its loop is told to stop; a daemon thread never holds up the
process's exit), as ``runtime/reward_call.py``'s ``RewardGuard`` abandons a reward call.
That guard is not reused: the runtime is a higher layer than ``algo/``, and an environment
needs more than it gives (``async def`` methods and one loop for a whole episode, so an
environment may keep an open connection between turns).  The time limit covers the
environment's calls only; the model's turns are the caller's to bound.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bidirl.algo.environment import StepShapeError, check_messages, check_step_result

Outcome = Literal["done", "max_turns", "max_length", "env_error", "env_timeout"]
OUTCOMES: tuple[str, ...] = ("done", "max_turns", "max_length", "env_error", "env_timeout")


@dataclass(frozen=True)
class Turn:
    """One message of the conversation: who said it, its text, its tokens and whether it trains."""

    role: str
    text: str
    tokens: int
    trains: bool
    """True for the model's turns only: the loss mask of this turn's tokens."""


@dataclass
class Trajectory:
    """A whole episode: the turns (``reset``'s messages first), per-step rewards, how it ended."""

    turns: list[Turn] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    outcome: Outcome = "done"
    error: str = ""
    """What went wrong, for ``env_error`` and ``env_timeout``; empty otherwise."""
    env_seconds: float = 0.0
    """Wall time in the environment's calls (``reset`` and ``step``)."""

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its step rewards (0 before any step)."""
        return sum(self.step_rewards)

    @property
    def model_turns(self) -> int:
        return sum(t.trains for t in self.turns)

    @property
    def total_tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    def messages(self) -> list[dict]:
        """The conversation as chat messages (what the next model turn would be given)."""
        return [{"role": t.role, "content": t.text} for t in self.turns]


class EnvTimeout(Exception):
    """An environment call that did not return within ``turn_timeout_s`` (and was abandoned)."""


class EnvThread:
    """A daemon thread running an asyncio loop of its own: an environment's calls, one episode.

    ``call(fn, *args)`` is awaited from the caller's loop; ``fn`` runs on this thread (awaited
    there when it returns an awaitable, so ``async def`` methods work), and the caller stops
    waiting after ``timeout_s``.  After a timeout the thread is abandoned (:meth:`abandon`)
    and ``timed_out`` is set: its loop may still be blocked, so nothing more is sent to it.
    """

    def __init__(self) -> None:
        self.timed_out = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="bidirl-env", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def call(self, fn: Callable, *args: Any, timeout_s: float) -> Any:
        async def on_thread() -> Any:
            value = fn(*args)
            return await value if inspect.isawaitable(value) else value

        future = asyncio.run_coroutine_threadsafe(on_thread(), self.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            self.timed_out = True
            future.cancel()  # an awaiting coroutine stops; blocking code runs on, abandoned
            raise EnvTimeout(f"did not return within {timeout_s:g} s (env.turn_timeout_s; the call was "
                             "abandoned)") from None

    def abandon(self) -> None:
        """Stop the loop once the running call (if any) returns; never waits for it."""
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed meanwhile
            pass


@dataclass(frozen=True)
class EpisodeLimits:
    """The limits of one episode (``env.max_turns``, ``env.max_total_tokens``, ``env.turn_timeout_s``)."""

    max_turns: int = 4
    max_total_tokens: int = 1024
    turn_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_total_tokens < 1 or not self.turn_timeout_s > 0:
            raise ValueError(f"episode limits must be positive, got {self}")


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


async def run_episode_async(env: Any, row: dict, generate: Callable[[list[dict]], Any],
                            count_tokens: Callable[[str], int], limits: EpisodeLimits = EpisodeLimits()
                            ) -> Trajectory:
    """The episode of ``env`` on ``row`` (the module doc says how it runs and ends).

    ``generate(messages)`` returns the model's text, or an awaitable of it; ``count_tokens(text)``
    is the tokenizer's length of one turn's text.  ``env`` is an instance (a fresh one per
    episode); its optional ``close()`` is called at the end, guarded alike (not after a
    timeout: the environment's thread may still be busy with the abandoned call).
    """
    traj = Trajectory()
    worker = EnvThread()

    async def env_call(method: str, arg: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await worker.call(getattr(env, method), arg, timeout_s=limits.turn_timeout_s)
        finally:
            traj.env_seconds += time.perf_counter() - t0

    def add(role: str, text: str, trains: bool) -> None:
        traj.turns.append(Turn(role, text, int(count_tokens(text)), trains))

    def end(outcome: Outcome, error: str = "") -> Trajectory:
        traj.outcome, traj.error = outcome, error
        return traj

    try:
        try:
            first = check_messages(await env_call("reset", row), "reset's messages")
        except EnvTimeout as e:
            return end("env_timeout", f"reset {e}")
        except StepShapeError as e:
            return end("env_error", str(e))
        except Exception as e:  # noqa: BLE001 - user code: any failure ends this trajectory only
            return end("env_error", f"reset raised {_describe(e)}")
        for m in first:
            add(m["role"], m["content"], False)
        if traj.total_tokens > limits.max_total_tokens:
            return end("max_length")
        while True:
            reply = generate(traj.messages())
            text = await reply if inspect.isawaitable(reply) else reply
            add("assistant", str(text), True)
            try:
                obs, reward, done = check_step_result(await env_call("step", str(text)))
            except EnvTimeout as e:
                return end("env_timeout", f"step {e}")
            except StepShapeError as e:
                return end("env_error", str(e))
            except Exception as e:  # noqa: BLE001 - as above
                return end("env_error", f"step raised {_describe(e)}")
            traj.step_rewards.append(reward)
            for m in obs:
                add(m["role"], m["content"], False)
            if done:
                return end("done")
            if traj.model_turns >= limits.max_turns:
                return end("max_turns")
            if traj.total_tokens > limits.max_total_tokens:
                return end("max_length")
    finally:
        await _close(env, worker, limits.turn_timeout_s)


async def _close(env: Any, worker: EnvThread, timeout_s: float) -> None:
    close = getattr(env, "close", None)
    if callable(close) and not worker.timed_out:  # after a timeout its thread may still be blocked
        try:
            await worker.call(close, timeout_s=timeout_s)
        except Exception:  # noqa: BLE001, S110 - the trajectory has its outcome; a failing close changes nothing
            pass
    worker.abandon()


def run_episode(env: Any, row: dict, generate: Callable[[list[dict]], Any], count_tokens: Callable[[str], int],
                limits: EpisodeLimits = EpisodeLimits()) -> Trajectory:
    """:func:`run_episode_async` for a caller without an event loop (tests, scripts)."""
    return asyncio.run(run_episode_async(env, row, generate, count_tokens, limits))
