"""The auxiliary trainer's micro-batch model: the primary's until it has its own, and the
error it reports is the error of the prediction that was used."""

from __future__ import annotations

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
    for _ in range(AUX_WARM_MEASUREMENTS):
        primary.observe(x, 0.1)
    assert aux.borrowing() and aux.predict(x) == pytest.approx(0.5 * primary.predict(x))
    for _ in range(AUX_WARM_MEASUREMENTS):
        aux.observe(x, 0.06)
    assert not aux.borrowing() and aux.predict(x) == pytest.approx(own.predict(x))
    assert aux.observations == own.observations == AUX_WARM_MEASUREMENTS


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
