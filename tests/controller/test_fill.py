"""Filling replicas: one ``AssignGroups`` per replica, committed in any order, and the
share left for replicas on their way home."""

from __future__ import annotations

import pytest

from bidirl.controller import AssignGroups, ClusterSpec, GroupsInterrupted, Lend, Reclaim
from bidirl.controller.events import DeviceLent
from bidirl.controller.state import ClusterState
from bidirl.core.ledger import Role
from bidirl.policy.assign import fill_replicas


def _state(**kw) -> ClusterState:
    base = dict(hardware="H100-80GB", model="Qwen3-8B", devices=6,
                replica_devices=((0,), (1,), (2,), (3,)), train_devices=(4, 5),
                train_units=((4,), (5,)), rollout_tp=1, train_dp=2, train_tp=1,
                train_spans_nodes=False, replica_cap=12, groups_per_step=8, group_size=4,
                prompt_tokens=16, staleness=1, steps=4, micro_batch_tokens=4096)
    base.update(kw)
    return ClusterState(ClusterSpec(**base))


def _fill(s: ClusterState, order=None) -> list[AssignGroups]:
    actions = list(fill_replicas(s, s.spec.steps - 1))
    for a in (actions if order is None else [actions[i] for i in order]):
        s.commit(a)
    return actions


def test_one_action_per_replica_round_robin_and_commit_order_free():
    s = _state()
    actions = _fill(s, order=[3, 1, 0, 2])
    # cap 12 = 3 groups of 4; staleness 1 admits batches 0 and 1 (16 groups), 12 fit.
    assert [(a.replica, a.group_ids) for a in actions] == [
        (0, (0, 4, 8)), (1, (1, 5, 9)), (2, (2, 6, 10)), (3, (3, 7, 11))]
    assert s.queue.next_fresh == 12 and not s.queue.ahead
    assert s.units.load == [12, 12, 12, 12, 0, 0] and s.running == 12
    assert s.queue.started[:2] == [8, 4]
    assert not list(fill_replicas(s, s.spec.steps - 1))  # full: nothing more


def test_a_group_cannot_start_twice_or_out_of_the_queue():
    s = _state()
    s.commit(AssignGroups(0, (0, 2)))  # 1 is skipped for now: allowed within a decision
    with pytest.raises(ValueError, match="group 2 cannot start"):
        s.commit(AssignGroups(1, (2,)))
    with pytest.raises(ValueError, match="group 0 cannot start"):
        s.commit(AssignGroups(1, (0,)))
    with pytest.raises(ValueError, match="group 99 cannot start"):
        s.commit(AssignGroups(1, (99,)))
    s.commit(AssignGroups(1, (1,)))
    assert s.queue.next_fresh == 3 and not s.queue.ahead


def test_partial_groups_resume_in_any_order_and_leave_no_stale_work():
    s = _state()
    _fill(s)
    s.observe(GroupsInterrupted(1, (1, 5), (10, 20), (2, 3)), 1.0)
    assert s.queue.has_work()
    s.commit(AssignGroups(2, (5,)))  # not the lowest partial group first
    assert s.queue.partial_head() == 1
    s.commit(AssignGroups(3, (1,)))
    assert s.queue.partial_head() is None
    assert s.queue.partial_in_batch[0] == 0 and s.queue.partial_in_batch[1] == 0
    assert s.groups.groups[5].history[-1][1].value == "generating"
    # Interrupted again after a resume: it is queued once (first), not twice; replica 1,
    # the least loaded since the first interruption, resumes it and takes a fresh group.
    s.observe(GroupsInterrupted(2, (5,), (25,), (1,)), 2.0)
    assert [(a.replica, a.group_ids) for a in _fill(s)] == [(1, (5, 12))]
    assert s.queue.partial_head() is None


def test_returning_replicas_keep_their_share():
    """The first replica home must not take the whole queue from peers a second away."""
    s = _state(replica_cap=40)
    for u in (0, 1, 2):
        s.commit(Lend(u, Role.AUX_TRAIN))
        s.observe(DeviceLent(u, Role.AUX_TRAIN, 1.0), 1.0)
        s.commit(Reclaim(u))
    assert s.units.returning == {0, 1, 2}
    actions = _fill(s)
    # 16 admissible groups x 4 responses over 4 replicas: 16 responses (4 groups) each.
    assert [(a.replica, len(a.group_ids)) for a in actions] == [(3, 4)]
    assert s.queued_groups(1) == 12


def test_trainer_units_arriving_as_rollout_replicas_keep_their_share():
    """A trainer unit lent as a rollout replica (C_in on its way) takes its share of work
    that would otherwise all crowd the home replicas, once it is up."""
    s = _state(replica_cap=40)  # 16 admissible groups x 4 = 64 responses fit on 4 replicas
    s.commit(Lend(4, Role.ROLLOUT))
    assert s.units.arriving == {4}
    actions = _fill(s)
    # 64 responses over 4 home + 1 arriving: ceil(64 / 5) = 13, so 3 groups (12) each.
    assert [(a.replica, len(a.group_ids)) for a in actions] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert s.queued_groups(1) == 4
    s.observe(DeviceLent(4, Role.ROLLOUT, 0.5), 0.5)
    assert not s.units.arriving
    # up: the least loaded again, it takes its share; the last group goes by the usual order
    assert [(a.replica, a.group_ids) for a in _fill(s)] == [(0, (15,)), (4, (12, 13, 14))]


def test_an_arriving_unit_reclaimed_before_it_is_up_leaves_no_share_behind():
    s = _state(replica_cap=40)
    s.commit(Lend(4, Role.ROLLOUT))
    s.commit(Reclaim(4))
    assert not s.units.arriving
    assert sum(len(a.group_ids) for a in _fill(s)) == 16  # all on the home replicas


@pytest.mark.parametrize("lend", [Lend(4, Role.ROLLOUT, colocated=True), Lend(0, Role.AUX_TRAIN)])
def test_only_a_borrowed_rollout_replica_is_awaited(lend):
    """A colocated phase switch (the sync baseline) or a replica lent as an auxiliary
    trainer is not a replica on its way in: filling does not hold work back for it."""
    s = _state(replica_cap=40)
    s.commit(lend)
    assert not s.units.arriving
    placed = {a.replica: len(a.group_ids) for a in _fill(s)}
    assert sum(placed.values()) == 16 and lend.unit not in placed
