"""The multi-turn environment interface users write in one file, and its loading.

An environment is a class (``env.path`` + ``env.name``, loaded like ``data.reward_fn``'s
``compute_score``) with two methods, plain or ``async def``::

    class Environment:
        def reset(self, row: dict) -> list[dict]: ...
            # the first chat messages, from a data row (veRL's layout: prompt, data_source,
            # reward_model, extra_info)
        def step(self, text: str) -> tuple[list[dict], float, bool]: ...
            # the model's turn in; (observation messages, reward, done) out

and optionally ``close(self)``, called once when the trajectory ends.  The class is built
with no arguments, once per trajectory (so one instance holds one episode's state).

Why checks at load time: a user's environment is found wrong seconds into ``bidirl train``
(a missing method, a method taking the wrong arguments), not after the whole start-up.  Every
load error is one :class:`EnvError` line naming the file and what is wrong, as
``algo/data.py:load_reward_fn``'s are.  What ``step`` returns can only be checked when it is
called: :func:`check_step_result` turns a wrong shape into a message the episode runner
(``algo/episode.py``) records as the trajectory's ``env_error`` outcome.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
import zlib
from pathlib import Path
from typing import Any, Protocol

from bidirl.algo.data import DataError

OBSERVATION_ROLES = ("user", "tool", "system")
"""Roles an observation message may have (the model's own turns are ``assistant``)."""


class EnvError(DataError):
    """An environment file or class that cannot serve as an environment (one line)."""


class StepShapeError(ValueError):
    """What ``step`` (or ``reset``) returned is not what the interface says."""


class Environment(Protocol):
    """What the episode runner calls; ``async def`` versions of both are accepted."""

    def reset(self, row: dict) -> list[dict]: ...

    def step(self, text: str) -> tuple[list[dict], float, bool]: ...


_METHODS = {"reset": "row", "step": "text"}


def _arity_problem(fn: Any, arg: str) -> str | None:
    """Why ``fn`` (a function on the class, ``self`` first) cannot be called as ``fn(self, arg)``;
    None when it can."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "has no signature inspect can read"
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    kw_required = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if kw_required:
        return f"requires keyword-only argument(s) {kw_required}"
    if len(required) > 2:
        return f"takes {len(required) - 1} required arguments besides self ({', '.join(p.name for p in required[1:])})"
    if len(positional) < 2 and not varargs:
        return f"takes no argument besides self (it must take the {arg})"
    return None


def check_environment_class(cls: Any, where: str, name: str) -> type:
    """``cls`` itself when it can serve as an environment, else an :class:`EnvError` naming ``where``."""
    if not inspect.isclass(cls):
        raise EnvError(f"{where}: {name!r} is a {type(cls).__name__}, not a class (an environment is a class "
                       "with reset(self, row) and step(self, text))")
    for method, arg in _METHODS.items():
        fn = inspect.getattr_static(cls, method, None)
        if fn is None:
            raise EnvError(f"{where}: class {name} has no {method}(self, {arg}) method")
        if isinstance(fn, staticmethod | classmethod) or not callable(fn):
            raise EnvError(f"{where}: {name}.{method} is a {type(fn).__name__}, not a method {method}(self, {arg})")
        problem = _arity_problem(fn, arg)
        if problem:
            raise EnvError(f"{where}: {name}.{method} {problem}; expected {method}(self, {arg})")
    init = _arity_problem_init(cls)
    if init:
        raise EnvError(f"{where}: {name}() {init}; an environment is built with no arguments, once per trajectory")
    return cls


def _arity_problem_init(cls: type) -> str | None:
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return None  # a builtin constructor: tried when the run builds one
    required = [p.name for p in sig.parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return f"requires argument(s) {required}" if required else None


def load_environment(path: str | Path, name: str) -> type:
    """Import a user's python file and return its environment class, checked
    (:func:`check_environment_class`); every failure is one :class:`EnvError` line."""
    path = Path(path)
    if not path.is_file():
        raise EnvError(f"{path}: environment file not found (env.path)")
    module_name = f"bidirl_user_env_{zlib.crc32(str(path.resolve()).encode())}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EnvError(f"{path}: cannot import as a python module (env.path)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise EnvError(f"{path}: importing the environment file failed: {type(e).__name__}: {e}") from e
    cls = getattr(module, name, None)
    if cls is None:
        classes = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and not k.startswith("_"))
        raise EnvError(f"{path}: no class named {name!r} (env.name); classes defined: {classes}")
    return check_environment_class(cls, str(path), name)


def check_messages(value: Any, what: str) -> list[dict]:
    """``value`` as a list of ``{"role", "content"}`` messages, else a :class:`StepShapeError`."""
    if isinstance(value, dict):
        raise StepShapeError(f"{what} is a dict, not a list of messages (wrap it: [message])")
    if not isinstance(value, list | tuple):
        raise StepShapeError(f"{what} is a {type(value).__name__}, not a list of {{'role', 'content'}} messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise StepShapeError(f"{what}[{i}] is a {type(m).__name__}, not a {{'role', 'content'}} dict")
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise StepShapeError(f"{what}[{i}] needs a str 'role' and a str 'content', got {_short(m)}")
        out.append(dict(m))
    return out


def check_step_result(value: Any) -> tuple[list[dict], float, bool]:
    """What ``step`` returned as ``(messages, reward, done)``, or a :class:`StepShapeError`
    saying what is wrong (the runner records it as the ``env_error`` outcome)."""
    if not isinstance(value, tuple | list) or len(value) != 3:
        size = f" of {len(value)}" if isinstance(value, tuple | list) else ""
        raise StepShapeError(f"step returned a {type(value).__name__}{size} {_short(value)}; expected a tuple "
                             "(observation messages, reward, done)")
    messages, reward, done = value
    obs = check_messages(messages, "step's observation")
    for i, m in enumerate(obs):
        if m["role"] not in OBSERVATION_ROLES:
            raise StepShapeError(f"step's observation[{i}] has role {m['role']!r}; allowed: "
                                 f"{', '.join(OBSERVATION_ROLES)} (the model's own turns are the runner's)")
    if getattr(reward, "shape", None) == () and callable(getattr(reward, "item", None)):
        reward = reward.item()  # a numpy or torch scalar
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise StepShapeError(f"step's reward is {_short(reward)}; expected a finite number")
    if getattr(done, "shape", None) == () and callable(getattr(done, "item", None)):
        done = done.item()
    if not isinstance(done, bool):
        raise StepShapeError(f"step's done is {_short(done)}; expected True or False")
    return obs, float(reward), done


def _short(value: Any, limit: int = 80) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
