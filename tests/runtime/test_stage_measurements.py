"""What the runtime measures for the stage models: a weight sync timed where the load
happens, a prefill beyond the decode steps next to it, decode in sums of many steps."""

from __future__ import annotations

import pytest
from fake_devices import Costs
from fake_run import run_fake

from bidirl.controller.events import StageMeasured, WeightsSynced
from bidirl.runtime.messages import PrefillBurst
from bidirl.runtime.rollout_driver import DECODE_REMAINDER, DECODE_SAMPLE_S, RolloutDriver


def test_the_weight_sync_model_learns_the_devices_load_not_the_drivers_wait():
    """The driver's wall (issue -> last replica done) holds the trainer's weight fetch and
    the wait behind the replica's other calls; the device's own timing of the load is what
    the weight-sync model learns."""
    costs = Costs(sync_s=0.004, weights_s=0.003)
    run = run_fake("async", steps=4, costs=costs)
    syncs = [ev for _, ev in run.executor.profile if isinstance(ev, WeightsSynced) and ev.seconds > 0]
    assert syncs and all(ev.load_s == pytest.approx(costs.sync_s) for ev in syncs)
    assert all(ev.seconds >= ev.load_s + costs.weights_s - 1e-12 for ev in syncs)  # the wait is outside it
    model = run.executor.controller.state.est.models["weight_sync"]
    assert model.observations == len(syncs)
    assert run.executor.controller.state.est.weight_sync_s() == pytest.approx(costs.sync_s, rel=0.05)


def test_each_prefill_burst_is_one_measurement_the_prefill_model_learns():
    """A burst the replicas report becomes one prefill measurement (features: a constant and
    its prompt tokens); the profile holds what the models learn and the run's decode
    remainders, no record of its own."""
    run = run_fake("async", steps=3)
    prof = [ev for _, ev in run.executor.profile if isinstance(ev, StageMeasured)]
    prefills = [ev for ev in prof if ev.stage == "prefill"]
    assert prefills and all(ev.features[0] == 1.0 and ev.features[1] > 0 and ev.seconds >= 0 for ev in prefills)
    assert {ev.stage for ev in prof} <= set(run.executor.controller.state.est.models) | {DECODE_REMAINDER}


def test_a_prefill_is_taken_beyond_the_recent_decode_steps_when_the_engine_gives_them():
    burst = PrefillBurst(tokens=40, steps=1, batch=3, context=3000, seconds=0.009, beyond_median_s=0.003)
    assert RolloutDriver.prefill_seconds(burst) == 0.003


def test_decode_is_measured_in_sums_of_at_least_the_sample_length():
    """A replica that runs dry or is lent carries its last few steps over to its next sum:
    no decode measurement is a remainder of a few (noisy) steps; what a unit still holds at
    the end is less than one sum."""
    run = run_fake("bidirl", steps=6)
    ex = run.executor
    dec = [ev for _, ev in ex.profile if isinstance(ev, StageMeasured) and ev.stage == "decode"]
    assert dec and all(ev.seconds >= DECODE_SAMPLE_S for ev in dec)
    assert all(acc[3] < DECODE_SAMPLE_S for acc in ex.rollout.decode_sum)
    assert ex.controller.state.est.models["decode"].observations == len(dec)
