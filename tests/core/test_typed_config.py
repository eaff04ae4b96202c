"""The one typed-config mechanism: docs, choices, ranges, unknown fields, dotted errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from bidirl.core.typed_config import FieldError, build, check_fields, describe, option, section, set_path


@dataclass(frozen=True)
class Inner:
    n: int = option(1, "how many", ge=1)
    mode: Literal["a", "b"] = option("a", "which")
    pair: tuple[float, float] = option((0.5, 1.0), "two numbers")


@dataclass(frozen=True)
class Outer:
    rate: float = option(0.1, "a rate", gt=0, lt=1)
    name: str | None = option(None, "optional")
    tags: list[str] = option(default_factory=list, doc="tags")
    pick: str = option("x", "from a callable", choices=lambda: ("x", "y"))
    inner: Inner = section(Inner, "nested")

    def __post_init__(self) -> None:
        check_fields(self)


def test_defaults_nesting_and_normalisation():
    o = build(Outer, {"rate": "1e-2", "tags": "p,q", "inner": {"n": 3.0, "pair": [1, 2]}})
    assert o == Outer(rate=0.01, tags=["p", "q"], inner=Inner(n=3, pair=(1.0, 2.0)))
    assert build(Outer, {}) == Outer()


@pytest.mark.parametrize("data, message", [
    ({"inner": {"n": 0}}, "inner.n: must be >= 1, got 0"),
    ({"rate": 1}, "rate: must be in (0, 1), got 1.0"),
    ({"inner": {"mode": "c"}}, "inner.mode: must be one of a, b, got 'c'"),
    ({"pick": "z"}, "pick: must be one of x, y, got 'z'"),
    ({"inner": {"m": 1}}, "inner.m: unknown field; allowed: mode, n, pair"),
    ({"inner": {"nn": 1}}, "inner.nn: unknown field; did you mean n? allowed: mode, n, pair"),
    ({"rat": 0.5}, "rat: unknown field; did you mean rate? allowed: inner, name, pick, rate, tags"),
    ({"inner": 3}, "inner: expected a mapping, got int"),
    ({"inner": {"n": True}}, "inner.n: expected an integer, got True"),
    ({"rate": None}, "rate: must be set (got null)"),
    ({"inner": {"pair": [1]}}, "inner.pair: expected 2 values, got 1"),
])
def test_errors_name_the_dotted_field_and_what_is_allowed(data, message):
    with pytest.raises(FieldError) as e:
        build(Outer, data)
    assert str(e.value) == message


def test_overrides_and_direct_construction():
    data: dict = {}
    set_path(Outer, data, "inner.n", 4)
    assert build(Outer, data).inner.n == 4
    with pytest.raises(FieldError, match="rate.x: rate is a value, not a section"):
        set_path(Outer, {}, "rate.x", 1)
    with pytest.raises(FieldError, match="innr: unknown field; did you mean inner?"):
        set_path(Outer, {}, "innr.n", 1)
    with pytest.raises(FieldError, match=r"Outer.rate: must be in \(0, 1\), got 2"):
        Outer(rate=2)


def test_describe_lists_leaves_with_docs_and_limits():
    rows = {name: (default, doc) for name, _, default, doc in describe(Outer)}
    assert rows["inner.n"] == (1, "how many (>= 1)")
    assert rows["inner.mode"] == ("a", "which (one of a, b)")
    assert rows["pick"][1] == "from a callable (one of x, y)"
