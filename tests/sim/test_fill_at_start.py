"""The fill at t = 0: the first two batches fit on the one home replica, which would decode
them all at a crowded batch while the trainer waits.  ``bidirl`` lends the idle trainer
device as a second replica before the groups are placed, the home replica keeps batch 0
(its share), the borrowed one takes batch 1, and step 0 starts earlier; nothing is lost
or trained twice, and staleness stays within its bound."""

import dataclasses

from bidirl.sim.run import simulate
from bidirl.sim.scenario import load


def _fill_bound():
    sc = load("tiny-cpu")  # 1 rollout + 1 train device
    lengths = dataclasses.replace(sc.workload.response_length, min=64, max=128)
    return dataclasses.replace(
        sc, steps=8, workload=dataclasses.replace(sc.workload, prompts_per_step=8, group_size=8,
                                                  response_length=lengths),
        calibration=dataclasses.replace(sc.calibration, replica_cap=128))  # 2 batches fit at once


def test_bidirl_lends_the_idle_trainer_for_the_fill_and_starts_step_0_earlier():
    sc = _fill_bound()
    base, bidirl = simulate(sc, "async"), simulate(sc, "bidirl")
    assert bidirl.admission.get("roll_on_train.admitted", 0) >= 1, bidirl.admission
    assert bidirl.borrows["roll_on_train"] >= 1
    assert bidirl.step_times_s[0] < base.step_times_s[0]
    assert bidirl.groups_lost == 0 and bidirl.staleness["max"] <= sc.staleness
    assert bidirl.groups_trained == base.groups_trained == sc.steps * sc.workload.prompts_per_step
