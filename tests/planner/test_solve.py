"""The closed form's period equation: the bracketed bisection returns what the plain one
does, bit for bit, whatever the guess it starts from (``closed_form.solve``)."""

from __future__ import annotations

import numpy as np
import pytest

from bidirl.planner.closed_form import solve
from bidirl.planner.context import OPTIONS, PlanContext
from bidirl.planner.plan import plan
from bidirl.planner.residual import Residual
from bidirl.planner.stages import _model


@pytest.mark.parametrize("staleness", [1, 3])
def test_a_guess_changes_the_evaluations_not_the_period(make_scenario, staleness):
    sc = make_scenario(devices=16, staleness=staleness)
    ctx = PlanContext.from_scenario(sc, steps=8)
    for cand in plan(sc, steps=8).candidates[:4]:
        env = cand.envelope
        m = _model(ctx, env)
        for option in OPTIONS:
            plain = solve(m, env, staleness, option)
            held = solve(m, env, staleness, option, screen=True)
            for guess in (held.period, plain.period, plain.period * 1.3, plain.period * 0.6, 1e-3, 1e12):
                assert solve(m, env, staleness, option, guess=guess) == plain


def test_the_plan_is_the_same_with_the_solves_cached(make_scenario):
    """Planning twice in one process (the second in a fresh context) gives the same
    candidates and predictions: nothing cached leaks across plans."""
    sc = make_scenario(devices=24, staleness=2)
    a, b = plan(sc, steps=8), plan(sc, steps=8)
    assert [c.envelope for c in a.candidates] == [c.envelope for c in b.candidates]
    assert [c.prediction for c in a.candidates] == [c.prediction for c in b.candidates]


def test_in_window_takes_numbers_and_arrays_alike():
    r = Residual(np.linspace(10.0, 400.0, 40))
    o1, o2 = np.array([-50.0, -5.0, 3.0]), np.array([-20.0, -5.0, 30.0])
    together = r.in_window(100.0, o1, o2)
    one_by_one = [float(r.in_window(100.0, a, b)) for a, b in zip(o1, o2)]
    assert together.shape == (3,) and np.shape(r.in_window(100.0, -5.0, 2.0)) == ()
    assert together.tolist() == pytest.approx(one_by_one, rel=1e-12)
    assert r.in_window(100.0, o1[:, None], o2[None, :]).shape == (3, 3)  # broadcast


def test_the_one_by_one_windows_are_numpys_bit_for_bit(monkeypatch):
    """``in_window`` computes few windows in Python floats (fast) and many in numpy: the
    same operations, so the same floats, including one-start windows, windows reaching
    past the window's end and offsets beyond the longest length."""
    import bidirl.planner.residual as residual

    rng = np.random.default_rng(7)
    r = Residual(np.sort(rng.lognormal(5.0, 0.9, 64)))
    o1 = np.concatenate((rng.uniform(-3000.0, 500.0, 24), [0.0, -40.0, 12.5, -1e4]))
    o2 = np.concatenate((o1[:24] + rng.uniform(0.0, 800.0, 24), [0.0, -40.0, 12.5, 3e4]))
    for x in (0.0, 1.0, 37.25, 250.0, 5e3):
        fast = r.in_window(x, o1, o2)
        monkeypatch.setattr(residual, "SCALAR_WINDOWS", -1)  # numpy for any length
        slow = r.in_window(x, o1, o2)
        monkeypatch.setattr(residual, "SCALAR_WINDOWS", 32)
        assert fast.dtype == slow.dtype and fast.shape == slow.shape
        assert fast.tobytes() == slow.tobytes()
