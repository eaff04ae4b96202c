"""The controller against a fake runtime: events in, actions out, no simulator involved."""

from __future__ import annotations

import pytest

from bidirl.controller import (
    AssignGroups,
    ClusterSpec,
    Controller,
    GroupsCompleted,
    GroupsInterrupted,
    Lend,
    Reclaim,
    Runtime,
    Started,
    StartTrainStep,
    SyncWeights,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.controller.events import DeviceLent, DeviceReclaimed
from bidirl.core.ledger import Role
from bidirl.policy import make_policy


class FakeRuntime:
    """Records actions; the test plays the cluster and reports events by hand."""

    def __init__(self) -> None:
        self.t = 0.0
        self.actions: list = []

    def now(self) -> float:
        return self.t

    def execute(self, action) -> None:
        self.actions.append(action)

    def take(self, kind=None) -> list:
        out = [a for a in self.actions if kind is None or isinstance(a, kind)]
        self.actions = [a for a in self.actions if not (kind is None or isinstance(a, kind))]
        return out


def _spec(**kw) -> ClusterSpec:
    base = dict(hardware="H100-80GB", model="Qwen3-8B", devices=4,
                replica_devices=((0,), (1,)), train_devices=(2, 3), train_units=((2,), (3,)),
                rollout_tp=1, train_dp=2, train_tp=1, train_spans_nodes=False, replica_cap=8,
                groups_per_step=3, group_size=4, prompt_tokens=16, staleness=1, steps=3,
                micro_batch_tokens=4096)
    base.update(kw)
    return ClusterSpec(**base)


def _controller(policy: str = "async", **kw) -> tuple[Controller, FakeRuntime]:
    rt = FakeRuntime()
    assert isinstance(rt, Runtime)
    c = Controller(_spec(**kw), make_policy(policy), rt)
    c.on_event(Started())
    return c, rt


def _complete(c: Controller, rt: FakeRuntime, replica: int, gid: int, t: float) -> None:
    rt.t = t
    c.on_event(GroupsCompleted(replica, (gid,), ((10, 20, 30, 40),)))


def test_async_fills_least_loaded_replicas_in_group_order_up_to_staleness():
    c, rt = _controller()
    assigned = rt.take(AssignGroups)
    # cap 8 = two groups of 4 per replica; staleness 1 allows batches 0 and 1 at version 0.
    # Least-loaded placement deals the groups round-robin; one action per replica.
    assert [(a.replica, a.group_ids) for a in assigned] == [(0, (0, 2)), (1, (1, 3))]
    for gid, replica in ((0, 0), (1, 1)):
        _complete(c, rt, replica, gid, 1.0)
    assert [a.group_ids for a in rt.take(AssignGroups)] == [(4,), (5,)]
    _complete(c, rt, 0, 2, 2.0)
    (step,) = rt.take(StartTrainStep)
    assert step.step == 0 and step.group_ids == (0, 1, 2)
    assert sum(len(ch.micro_batches) for ch in step.chunks) == len(step.micro_batches)
    assert not rt.take(AssignGroups)  # batch 2 must wait for version 1
    rt.t = 3.0
    c.on_event(TrainStepFinished(0, 1, 1.0))
    assert rt.take(SyncWeights) == [SyncWeights(1)]
    c.on_event(WeightsSynced(1, 0.5))
    assert [a.group_ids for a in rt.take(AssignGroups)] == [(6,)]


def test_interrupted_groups_resume_first():
    c, rt = _controller(steps=2, staleness=1)
    rt.take()
    s = c.state
    c.on_event(GroupsInterrupted(1, (1,), (33,), (2,)))  # pretend replica 1 was borrowed
    # The partial group goes back to the queue front and is resumed at once, ahead of
    # fresh groups, with only its two unfinished responses counted as load.
    (resume,) = rt.take(AssignGroups)
    assert resume.group_ids == (1,)
    g = s.groups.groups[1]
    assert g.interruptions == 1 and g.tokens_generated == 33
    assert [st.value for _, st in g.history] == ["generating", "partial", "generating"]
    assert s.units.load[resume.replica] == 2 + (8 if resume.replica == 0 else 4)
    _complete(c, rt, resume.replica, 1, 2.0)
    assert s.groups.groups[1].state.value == "complete"


def test_roll_borrow_lends_trainer_units_and_reclaims_them_for_the_step():
    c, rt = _controller("bidirl-opportunistic", replica_cap=4, groups_per_step=6)
    lends = rt.take(Lend)
    assert {(a.unit, a.role) for a in lends} == {(2, Role.ROLLOUT), (3, Role.ROLLOUT)}
    rt.take()
    rt.t = 5.0
    for a in lends:
        c.on_event(DeviceLent(a.unit, Role.ROLLOUT, 5.0))
    borrowed = {a.replica for a in rt.take(AssignGroups)}
    assert borrowed == {2, 3}  # the borrowed replicas take queued groups
    for gid in range(6):
        _complete(c, rt, [0, 1, 0, 1, 2, 3][gid], gid, 10.0 + gid)
    reclaims = rt.take(Reclaim)
    assert {a.unit for a in reclaims} == {2, 3} and not rt.take(StartTrainStep)
    for a in reclaims:
        c.on_event(DeviceReclaimed(a.unit, Role.ROLLOUT, 1.0))
    assert len(rt.take(StartTrainStep)) == 1
    assert c.state.devices.counts() == {"roll_on_train": 2, "train_on_roll": 0}


def test_lending_a_busy_replica_is_refused():
    c, rt = _controller()
    with pytest.raises(ValueError, match="drain it first"):
        c.state.commit(Lend(0, Role.AUX_TRAIN))


def test_every_event_is_timed_and_its_actions_counted():
    c, rt = _controller()  # handled one event, Started
    assert len(c.decision_s) == len(c.decision_cpu_s) == 1
    assert list(c.decision_actions) == [len(rt.actions)] and rt.actions
    rt.take()
    _complete(c, rt, 0, 0, 1.0)  # a replica freed: the next group is assigned to it
    assert len(c.decision_s) == len(c.decision_cpu_s) == 2
    assert list(c.decision_actions)[1:] == [len(rt.actions)] and rt.actions
