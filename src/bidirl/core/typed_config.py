"""Typed, documented, validated configuration: nested dataclasses built from plain data.

One mechanism for every config the project reads (scenario YAML, the train config), so
they fail the same way.  A config is a tree of dataclasses whose fields are declared
with ``option(default, doc, ...)`` (a leaf) or ``section(cls, doc)`` (a nested
dataclass); the documentation and the allowed range live in the field's metadata
(``metadata["doc"]``, ``["ge"]``, ``["gt"]``, ``["le"]``, ``["lt"]``, ``["choices"]``), so
the loader, the error messages and ``--help`` read the same source.  So does whether a
resumed run may change the field (``option(..., resume_safe=True)``, or
``section(..., resume_safe=True)`` for a whole section), which ``flagged(cls, "a.b.c",
"resume_safe")`` reads.

``build(cls, data)`` turns a mapping (from YAML) into an instance, rejecting unknown
fields, wrong types, values outside ``Literal[...]`` or ``choices``, and out-of-range
numbers, with errors that name the dotted field and what is allowed (and, for an unknown
name, the nearest known one)::

    rollout.max_num_seqs: must be >= 1, got 0
    trainer.lrr: unknown field; did you mean lr? allowed: adam_eps, betas, ...

``set_path`` applies ``a.b.c=value`` overrides to such a mapping before building, and
``describe`` lists every leaf (dotted name, type, default, doc) for help texts.
Pure Python (dataclasses, typing); cross-field rules stay with each config.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterator
from dataclasses import MISSING, field
from typing import Any, Literal, Union

__all__ = ["FieldError", "option", "section", "build", "check_fields", "set_path", "describe",
           "as_dict", "format_fields", "flagged", "flagged_names", "yaml_error"]


class FieldError(ValueError):
    """A value that a typed config does not allow; the message starts with the field path."""


def option(default: Any = MISSING, doc: str = "", *, default_factory: Any = MISSING,
           ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, choices: Any = None, resume_safe: bool = False) -> Any:
    """A documented leaf field.  ``choices``: a collection or a zero-argument callable;
    ``resume_safe``: a resumed run may change it (see :func:`flagged`)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "resume_safe": resume_safe}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, doc: str = "", resume_safe: bool = False) -> Any:
    """A documented nested dataclass field, defaulting to ``cls()``; ``resume_safe``: every
    field of the section is (see :func:`flagged`)."""
    return field(default_factory=cls, metadata={"doc": doc, "resume_safe": resume_safe})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _split_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007
    return tp, False


def _choices(f: dataclasses.Field, tp: Any) -> tuple | None:
    c = f.metadata.get("choices")
    if c is not None:
        return tuple(c() if callable(c) else c)
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return None


def _num(v: float) -> str:
    """A bound as written: ``4294967295``, ``0.5``, ``1e-08``."""
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else f"{v:g}"


def _unknown(path: str, name: str, allowed: Any) -> str:
    """``path: unknown field; did you mean X? allowed: ...`` (the suggestion when one is close)."""
    names = sorted(allowed)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{path}: unknown field; {hint}allowed: {', '.join(names)}"


def _range_text(m: dict) -> str | None:
    lo = ("[", m["ge"]) if m.get("ge") is not None else ("(", m["gt"]) if m.get("gt") is not None else None
    hi = ("]", m["le"]) if m.get("le") is not None else (")", m["lt"]) if m.get("lt") is not None else None
    if lo and hi:
        return f"in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}"
    if hi:
        return f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}"
    return None


def _in_range(v: float, m: dict) -> bool:
    return ((m.get("ge") is None or v >= m["ge"]) and (m.get("gt") is None or v > m["gt"])
            and (m.get("le") is None or v <= m["le"]) and (m.get("lt") is None or v < m["lt"]))


def _type_name(tp: Any) -> str:
    base, opt = _split_optional(tp)
    if typing.get_origin(base) is Literal:
        name = " | ".join(repr(a) for a in typing.get_args(base))
    else:
        name = getattr(base, "__name__", None) or str(base).replace("typing.", "")
        if typing.get_origin(base) is not None:
            name = str(base).replace("typing.", "")
    return f"{name} | None" if opt else name


def _leaf(value: Any, tp: Any, path: str, err: type[Exception]) -> Any:
    """Check ``value`` against the (non-optional) type ``tp``; return it normalised."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value  # checked against the choices by the caller
    if tp is bool:
        if not isinstance(value, bool):
            raise err(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise err(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads ``1e-4`` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise err(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise err(f"{path}: expected a string, got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):  # ``key=a,b`` on a command line
            value = [x for x in value.split(",") if x]
        if not isinstance(value, (list, tuple)):
            raise err(f"{path}: expected a list, got {value!r}")
        return [_leaf(x, item, f"{path}[{i}]", err) for i, x in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise err(f"{path}: expected a list of {len(args)}, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_leaf(x, args[0], f"{path}[{i}]", err) for i, x in enumerate(value))
        if len(value) != len(args):
            raise err(f"{path}: expected {len(args)} values, got {len(value)}")
        return tuple(_leaf(x, a, f"{path}[{i}]", err) for i, (x, a) in enumerate(zip(value, args)))
    return value


def _value(f: dataclasses.Field, tp: Any, value: Any, path: str, err: type[Exception]) -> Any:
    base, optional = _split_optional(tp)
    if dataclasses.is_dataclass(base):
        return build(base, value, path, err)
    if value is None:
        if optional:
            return None
        if typing.get_origin(base) is list:
            return []
        raise err(f"{path}: must be set (got null)")
    value = _leaf(value, base, path, err)
    _check_allowed(f, base, value, path, err)
    return value


def _check_allowed(f: dataclasses.Field, base: Any, value: Any, path: str, err: type[Exception]) -> None:
    """Raise ``err`` if ``value`` is outside the field's choices or range."""
    allowed = _choices(f, base)
    if allowed is not None and value not in allowed:
        raise err(f"{path}: must be one of {', '.join(map(str, allowed))}, got {value!r}")
    rng = _range_text(f.metadata)
    if rng and isinstance(value, (int, float)) and not _in_range(value, f.metadata):
        raise err(f"{path}: must be {rng}, got {value!r}")


def build(cls: type, data: Any, path: str = "", err: type[Exception] = FieldError) -> Any:
    """An instance of dataclass ``cls`` from the mapping ``data`` (missing fields: defaults)."""
    if not isinstance(data, dict):
        raise err(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise err(_unknown(prefix + unknown[0], unknown[0], fields))
    hints = _hints(cls)
    kwargs = {name: _value(fields[name], hints[name], v, prefix + name, err) for name, v in data.items()}
    for name, f in fields.items():
        if name not in kwargs and f.default is MISSING and f.default_factory is MISSING:
            raise err(f"{prefix}{name}: required")
    try:
        return cls(**kwargs)
    except err:
        raise
    except ValueError as e:  # a rule across fields (``__post_init__``): its message names them
        raise err(str(e)) from None


def check_fields(obj: Any, path: str | None = None, err: type[Exception] = FieldError) -> None:
    """Check the choices and ranges of an instance built in code (call from ``__post_init__``).

    ``build`` already checks what it builds; this catches ``Config(lr=0)`` written
    directly.  Errors name ``ClassName.field`` unless ``path`` is given.
    """
    prefix = f"{type(obj).__name__ if path is None else path}."
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        base, _ = _split_optional(hints[f.name])
        value = getattr(obj, f.name)
        if value is not None and not dataclasses.is_dataclass(base):
            _check_allowed(f, base, value, prefix + f.name, err)


def set_path(cls: type, data: dict, dotted: str, value: Any, err: type[Exception] = FieldError) -> None:
    """Put ``value`` at ``dotted`` (``a.b.c``) in the mapping ``data`` for config ``cls``.

    Checks only the path (every step but the last must be a section); ``build`` checks
    the value.  Used for ``key=value`` overrides on top of a file.
    """
    parts = dotted.split(".")
    for i, name in enumerate(parts[:-1]):
        here = ".".join(parts[: i + 1])
        fields = {f.name for f in dataclasses.fields(cls)}
        if name not in fields:
            raise err(_unknown(here, name, fields))
        sub, _ = _split_optional(_hints(cls)[name])
        if not dataclasses.is_dataclass(sub):
            raise err(f"{dotted}: {here} is a value, not a section")
        nxt = data.setdefault(name, {})
        if not isinstance(nxt, dict):
            raise err(f"{here}: expected a mapping, got {type(nxt).__name__}")
        cls, data = sub, nxt
    data[parts[-1]] = value


def as_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` with tuples as lists (what safe YAML and JSON can write)."""

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(obj))


def describe(cls: type, path: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """Every leaf of ``cls``: (dotted name, type, default, doc with its allowed values)."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{path}.{f.name}" if path else f.name
        tp = hints[f.name]
        base, _ = _split_optional(tp)
        if dataclasses.is_dataclass(base):
            yield from describe(base, name)
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)
        doc = f.metadata.get("doc", "")
        rng = _range_text(f.metadata)
        if rng:
            doc = f"{doc} ({rng})" if doc else rng
        allowed = _choices(f, base)
        if allowed is not None:
            doc = f"{doc} (one of {', '.join(map(str, allowed))})"
        yield name, _type_name(tp), default, doc


def flagged(cls: type, dotted: str, flag: str) -> bool:
    """Whether the field at ``dotted`` (``a.b.c``), or a section on its path, sets ``flag``
    in its metadata; False for a path that names no field.  A path below a leaf (a
    mapping-valued field flattened) takes the leaf's flag."""
    for name in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            return False
        if fields[name].metadata.get(flag):
            return True
        sub, _ = _split_optional(_hints(cls)[name])
        if not dataclasses.is_dataclass(sub):
            return False
        cls = sub
    return False


def flagged_names(cls: type, flag: str, path: str = "") -> Iterator[str]:
    """The fields that set ``flag``, in declaration order: a flagged section as ``name.``
    (all of it), a flagged leaf by its dotted name."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{path}.{f.name}" if path else f.name
        base, _ = _split_optional(hints[f.name])
        if f.metadata.get(flag):
            yield name + "." if dataclasses.is_dataclass(base) else name
        elif dataclasses.is_dataclass(base):
            yield from flagged_names(base, flag, name)


def format_fields(cls: type, width: int = 34) -> str:
    """A help text: one line per leaf, ``name = default  doc``."""
    return "\n".join(f"  {name + ' = ' + ('(required)' if default is MISSING else repr(default)):<{width}} {doc}"
                     for name, _tp, default, doc in describe(cls))



def yaml_error(e: Exception) -> str:
    """A YAML parser's error in one line: what is wrong and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or " ".join(str(e).split())
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what
