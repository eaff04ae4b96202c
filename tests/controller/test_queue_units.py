"""The state's two parts on their own: the group queue's order and lazy deletion, and the
unit table keeping load, idle set, heap and status consistent."""

from __future__ import annotations

import pytest

from bidirl.controller import ClusterSpec
from bidirl.controller.queue import GroupQueue
from bidirl.controller.units import Units, UnitStatus
from bidirl.core.ledger import Pool


def _spec() -> ClusterSpec:
    return ClusterSpec(hardware="H100-80GB", model="Qwen3-8B", devices=6,
                       replica_devices=((0,), (1,), (2,), (3,)), train_devices=(4, 5),
                       train_units=((4,), (5,)), rollout_tp=1, train_dp=2, train_tp=1,
                       train_spans_nodes=False, replica_cap=12, groups_per_step=8, group_size=4,
                       prompt_tokens=16, staleness=1, steps=4, micro_batch_tokens=4096)


def test_queue_partial_groups_first_lowest_id_and_requeue_leaves_no_stale_head():
    q = GroupQueue(_spec())
    for _ in range(10):  # ten fresh groups started: bound in id order to batches 0 (8) and 1 (2)
        q.members.take(q.members.bind()[0], 0)
    q.next_fresh = 10
    assert q.members.bound[:2] == [8, 2] and q.members.frontier == 1
    assert q.head() == 10 and q.has_work()
    q.requeue(5, 0, 3)
    q.requeue(2, 0, 1)
    assert q.head() == 2 and q.queued(0, 1) == 6 + 2
    del q.partial_seq[2]  # resumed: its heap entry is stale
    q.requeue(2, 0, 1)  # interrupted again: a fresh entry, the old one still stale
    del q.partial_seq[2]
    assert q.partial_head() == 5
    del q.partial_seq[5]
    assert q.partial_head() is None and q.head() == 10


def test_queue_batch_ready_counts_done_groups():
    q = GroupQueue(_spec())
    q.done[1] = 8
    assert q.batch_ready(1) and not q.batch_ready(0) and not q.batch_ready(4)


def test_units_load_idle_and_heap_move_together():
    un = Units(_spec())
    assert un.idle_replicas == {0, 1, 2, 3} and un.home_replicas() == 4 and un.trainer_home()
    un.groups[1].update({7, 8})
    un.set_load(1, 8)
    assert un.total_load == 8 and 1 not in un.idle_replicas and (8, 1) in un.heap
    un.unload(1, 7, 4)
    un.unload(1, 8, 4)
    assert un.total_load == 0 and 1 in un.idle_replicas and not un.groups[1]


def test_units_status_transitions_and_their_guards():
    un = Units(_spec())
    un.set_load(0, 4)
    with pytest.raises(ValueError, match="drain it first"):
        un.begin_lend(0, colocated=False)
    un.set_load(0, 0)
    un.begin_lend(0, colocated=False)
    assert un.status[0] is UnitStatus.LENDING and un.away[Pool.ROLLOUT] == 1
    assert not un.accepting[0] and 0 not in un.idle_replicas
    with pytest.raises(ValueError, match="only a home unit"):
        un.begin_lend(0, colocated=False)
    un.begin_reclaim(0)
    assert un.status[0] is UnitStatus.RECLAIMING and un.returning == {0}
    un.back_home(0, version=3)
    assert un.status[0] is UnitStatus.HOME and un.version[0] == 3 and un.accepting[0]
    assert un.away[Pool.ROLLOUT] == 0 and not un.returning and 0 in un.idle_replicas
    with pytest.raises(ValueError, match="cannot reclaim"):
        un.begin_reclaim(0)
