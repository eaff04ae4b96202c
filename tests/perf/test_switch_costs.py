import pytest

from bidirl.perf.profiles import HARDWARE, MODELS
from bidirl.perf.switch_costs import KINDS, SwitchCostEstimator, switch_priors


def test_estimator_uses_prior_then_median_of_measurements():
    priors = switch_priors(HARDWARE["H100-80GB"], MODELS["Qwen3-8B"])
    assert set(priors) == set(KINDS) and all(v > 0 for v in priors.values())
    est = SwitchCostEstimator(priors, window=3)
    assert est.estimate("roll_on_train.c_in") == priors["roll_on_train.c_in"]
    for s in (5.0, 50.0, 6.0, 7.0):  # the window forgets 5.0; the median ignores 50.0
        est.observe("roll_on_train.c_in", s)
    assert est.estimate("roll_on_train.c_in") == 7.0
    assert est.measured()["roll_on_train.c_out"] is None


def test_estimator_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown switch kinds"):
        SwitchCostEstimator({"nope": 1.0})
    est = SwitchCostEstimator({})
    with pytest.raises(ValueError, match="unknown switch kind"):
        est.observe("c_in", 1.0)
    with pytest.raises(ValueError, match="negative"):
        est.observe("train_on_roll.c_grad", -1.0)
