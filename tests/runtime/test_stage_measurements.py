"""What the runtime measures for the stage models: a weight sync timed where the load
happens, a prefill beyond the decode steps next to it, decode in sums of many steps."""

from __future__ import annotations

import pytest
from fake_devices import Costs
from fake_run import run_fake

from bidirl.controller.events import StageMeasured, WeightsSynced
from bidirl.runtime.rollout_driver import DECODE_SAMPLE_S, PREFILL_BURST, RolloutDriver
from bidirl.runtime.rollout_role import PrefillBurst


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
    assert model.predict((1.0,)) == pytest.approx(costs.sync_s, rel=0.05)


def test_each_prefill_measurement_comes_with_its_raw_burst_in_the_profile():
    """The profile keeps the burst as the engine measured it (no model learns that record);
    the prefill the models learn is its time beyond the recent decode steps, at most the
    burst's whole time, never below zero."""
    run = run_fake("async", steps=3)
    prof = [ev for _, ev in run.executor.profile if isinstance(ev, StageMeasured)]
    pairs = [(a, b) for a, b in zip(prof, prof[1:]) if a.stage == PREFILL_BURST]
    assert pairs and all(b.stage == "prefill" and b.features == (1.0, a.features[0]) for a, b in pairs)
    assert all(b.seconds == a.features[5] and 0.0 <= b.seconds <= a.seconds for a, b in pairs)
    assert PREFILL_BURST not in run.executor.controller.state.est.models


def test_a_prefill_is_taken_beyond_the_recent_decode_steps_when_the_engine_gives_them():
    burst = PrefillBurst(tokens=40, beyond_last_s=0.004, steps=1, batch=3, context=3000, seconds=0.009,
                         beyond_median_s=0.003)
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
