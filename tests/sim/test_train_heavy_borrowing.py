"""Trainer-on-RollPool where training is the bottleneck: the replica lent as an auxiliary
trainer goes home as soon as its chunk is in, and rolls out the next batch in the step's
remaining time, so borrowing pays even with a single replica that always has work."""

import dataclasses

from bidirl.controller.events import ChunkComputed
from bidirl.sim.run import simulate
from bidirl.sim.scenario import load


def _train_heavy():
    sc = load("tiny-cpu")  # 1 rollout + 1 train device; long prompts make training dominate
    return dataclasses.replace(sc, steps=12, workload=dataclasses.replace(
        sc.workload, prompts_per_step=8, group_size=8, prompt_tokens=200))


def test_train_heavy_borrowing_beats_async_and_loses_nothing():
    sc = _train_heavy()
    base = simulate(sc, "async")
    bidirl = simulate(sc, "bidirl")
    assert bidirl.groups_lost == 0 and bidirl.staleness["max"] <= sc.staleness
    assert bidirl.borrows["train_on_roll"] >= sc.steps // 2, bidirl.borrows
    assert bidirl.throughput_tokens_per_s > 1.1 * base.throughput_tokens_per_s


def test_an_auxiliary_goes_home_before_the_merge(monkeypatch):
    """Every chunk computed is reported, and the unit is reclaimed on that report."""
    from bidirl.policy import train_borrow

    seen, reclaimed = [], []
    real = train_borrow.AuxLending.actions

    def spy(self, s, event):
        for a in real(self, s, event):
            if isinstance(event, ChunkComputed):
                reclaimed.append(a.unit)
            yield a
        if isinstance(event, ChunkComputed):
            seen.append(event.unit)

    monkeypatch.setattr(train_borrow.AuxLending, "actions", spy)
    r = simulate(_train_heavy(), "train-borrow")
    assert seen and reclaimed and set(reclaimed) <= set(seen)
    assert len(reclaimed) == r.borrows["train_on_roll"]
