"""What a run measures before its loop (its pre-warm) is what its scheduler starts from:
``Estimates.learn_start_up``, used alike by the real session and the simulator."""

from __future__ import annotations

import pytest

from bidirl.controller import ClusterSpec
from bidirl.controller.estimates import Estimates


def _est() -> Estimates:
    return Estimates(ClusterSpec(hardware="cpu-core", model="tiny-qwen2", devices=2, replica_devices=((0,),),
                                 train_devices=(1,), train_units=((1,),), rollout_tp=1, train_dp=1, train_tp=1,
                                 train_spans_nodes=False, replica_cap=4, groups_per_step=4, group_size=8,
                                 prompt_tokens=12, staleness=1, steps=4, micro_batch_tokens=1200))


def test_the_measured_switch_costs_replace_the_priors():
    est = _est()
    prior = est.switch_s("roll_on_train.c_in", 1)
    est.learn_start_up([("roll_on_train.c_in", 1, 0.041), ("roll_on_train.c_out", 1, 0.0007),
                        ("train_on_roll.c_in", 0, 0.005), ("train_on_roll.c_out", 0, 0.00005)])
    assert prior != pytest.approx(0.041)
    assert est.switch_s("roll_on_train.c_in", 1) == pytest.approx(0.041)
    assert est.switch_s("roll_on_train.c_out") == pytest.approx(0.0007)
    assert est.switch_s("train_on_roll.c_in", 0) == pytest.approx(0.005)
    assert est.switch_s("train_on_roll.c_out") == pytest.approx(0.00005)


def test_the_weight_load_is_learned_but_not_scored():
    """No prediction was used for the start-up load: it moves the model, and no error is
    reported for it (the sync model's reported error is that of the loop's predictions)."""
    est = _est()
    before = est.weight_sync_s()
    est.learn_start_up([], [0.05])
    m = est.models["weight_sync"]
    assert m.observations == 1 and m.median_rel_error() is None
    assert abs(est.weight_sync_s() - 0.05) < abs(before - 0.05)


def test_an_unknown_switch_kind_is_refused():
    with pytest.raises(ValueError, match="unknown switch kind"):
        _est().learn_start_up([("roll_on_train.c_sideways", 1, 0.1)])
