"""The auxiliary trainer's micro-batch model: the primary's until it has its own, and the
error it reports is the error of the prediction that was used."""

from __future__ import annotations

import statistics

import pytest

from bidirl.controller.estimates import AUX_WARM_MEASUREMENTS, AuxMicroModel
from bidirl.perf.calibration import LinearTimeModel


def _models(scale: float = 1.0):
    primary = LinearTimeModel("train_micro", (0.01, 1e-4, 0.0))
    own = LinearTimeModel("train_micro", (1.0, 1e-2, 0.0))  # a roofline prior 100x off
    return primary, own, AuxMicroModel(own, primary, scale)


def test_it_predicts_from_the_primary_until_it_has_measured_its_own():
    primary, own, aux = _models(scale=0.5)
    x = (1.0, 400.0, 0.0)
    assert aux.predict(x) == pytest.approx(own.predict(x))  # a cold primary: nothing better
    primary.observe(x, 0.1)  # one measurement calibrates the primary's scale: already better than a prior
    assert aux.borrowing() and aux.predict(x) == pytest.approx(0.5 * primary.predict(x))
    for _ in range(AUX_WARM_MEASUREMENTS - 1):
        aux.observe(x, 0.05)
        assert aux.borrowing()
    assert aux.observations == own.observations == AUX_WARM_MEASUREMENTS - 1


def test_after_warm_up_the_candidate_that_predicted_better_predicts():
    """The auxiliary's time is not the primary's shape (its fixed cost is 10x): the ratio on
    the primary's fit cannot follow that across sizes, the auxiliary's own fit can, and it
    takes over once it has shown it on the recent measurements."""
    primary, own, aux = _models()
    small, big = (1.0, 100.0, 0.0), (1.0, 2000.0, 0.0)
    for x in (small, big) * 8:
        primary.observe(x, 0.01 + 1e-4 * x[1])
    truth = lambda x: 0.1 + 1e-4 * x[1]  # noqa: E731
    errs = [aux.observe(x, truth(x)) for x in (small, big) * 12]
    assert not aux.borrowing() and aux.predict(big) == pytest.approx(own.predict(big))
    assert statistics.median(errs[-8:]) < 0.05  # the own fit's, not the ratio's (~0.5 on one size)


def test_the_ratio_learns_how_much_slower_the_auxiliary_device_runs():
    """Same shape, 1.5x slower (another device kind, or a contended core): after a few
    measurements the primary's model times the learned ratio predicts within a few %,
    however far off the auxiliary's own prior is, and one wild measurement moves it little."""
    primary, own, aux = _models()
    xs = [(1.0, 200.0 + 100.0 * i, 0.0) for i in range(6)]
    for x in xs * 3:
        primary.observe(x, 0.01 + 1e-4 * x[1])
    for i, x in enumerate(xs):
        aux.observe(x, 1.5 * (0.01 + 1e-4 * x[1]) * (1.02 if i % 2 else 0.98))
    x = (1.0, 700.0, 0.0)
    assert aux.ratio() == pytest.approx(1.5, rel=0.1)
    assert aux.predict(x) == pytest.approx(1.5 * (0.01 + 1e-4 * x[1]), rel=0.1)
    ratio = aux.ratio()
    aux.observe(x, 10 * 1.5 * (0.01 + 1e-4 * x[1]))  # a 10x outlier (the core was taken)
    assert aux.ratio() == pytest.approx(ratio, rel=0.1)  # a median: one outlier moves it little


def test_its_reported_error_is_that_of_the_prediction_used():
    primary, own, aux = _models()
    x = (1.0, 400.0, 0.0)
    for _ in range(AUX_WARM_MEASUREMENTS):
        primary.observe(x, 0.1)
    used = aux.predict(x)
    err = aux.observe(x, 0.11)
    assert err == pytest.approx(abs(used - 0.11) / 0.11) and err < 0.2
    assert aux.median_rel_error() == pytest.approx(err)  # not the 100x-off prior's error
    bare = LinearTimeModel("train_micro", (1.0, 1e-2, 0.0))
    assert bare.observe(x, 0.11) > 10  # what scoring against the prior would have said
