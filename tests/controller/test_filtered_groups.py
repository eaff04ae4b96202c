"""DAPO's dynamic sampling in the controller: which batch a group joins, a filtered group's
replacement, a short batch taking a later batch's kept completion, the keep rate measured
online and what the predictions make of it, and the cap."""

from __future__ import annotations

import pytest

from bidirl.controller import AssignGroups, ClusterSpec, GroupsCompleted
from bidirl.controller.events import TrainStepFinished
from bidirl.controller.queue import GenerationCapError
from bidirl.controller.state import ClusterState
from bidirl.core.samples import GroupState
from bidirl.policy.assign import fill_replicas
from bidirl.policy.predict import groups_to_generate


def _state(**kw) -> ClusterState:
    base = dict(hardware="H100-80GB", model="Qwen3-8B", devices=4,
                replica_devices=((0,), (1,)), train_devices=(2, 3), train_units=((2,), (3,)),
                rollout_tp=1, train_dp=2, train_tp=1, train_spans_nodes=False, replica_cap=16,
                groups_per_step=4, group_size=2, prompt_tokens=16, staleness=1, steps=3,
                micro_batch_tokens=4096, filter_groups=True)
    base.update(kw)
    return ClusterState(ClusterSpec(**base))


def _fill(s: ClusterState) -> dict[int, tuple[int, ...]]:
    out = {}
    for a in fill_replicas(s, s.spec.steps - 1):
        s.commit(a)
        out[a.replica] = a.group_ids
    return out


def _complete(s: ClusterState, replica: int, gids, filtered=(), t: float = 1.0) -> None:
    """As a runtime with dynamic sampling on reports completions: a verdict for every group."""
    flags = tuple(filtered) or (False,) * len(gids)
    s.observe(GroupsCompleted(replica, tuple(gids), tuple((5, 5) for _ in gids), flags), t)


def test_without_filtering_a_group_joins_the_batch_its_id_names():
    s = _state()
    _fill(s)
    assert {g: s.groups.groups[g].batch for g in range(8)} == {g: g // 4 for g in range(8)}
    assert s.queue.members.peek() == 2  # staleness 1: batches 0 and 1 admitted, batch 2 next


def test_a_filtered_group_is_replaced_by_the_next_fresh_group_in_its_batch():
    s = _state()
    _fill(s)  # groups 0-7: batches 0 and 1
    _complete(s, 0, [0], filtered=[True])
    assert s.groups.groups[0].state is GroupState.FILTERED
    assert s.queue.members.peek() == 0 and s.queued_groups(0) == 1  # batch 0 owes one group
    more = _fill(s)
    new = [g for ids in more.values() for g in ids]
    assert new[0] == 8 and s.groups.groups[8].batch == 0  # the data stream's next prompt, for batch 0
    assert s.queue.members.bound[:2] == [5, 4] and s.queue.members.filtered[:2] == [1, 0]


def test_a_kept_completion_of_a_later_batch_takes_over_a_queued_replacement():
    s = _state()
    _fill(s)
    _complete(s, 0, [0, 4], filtered=[True, False])  # batch 0 owes a group; 4 of batch 1 is kept
    assert s.groups.groups[4].batch == 0 and s.queue.members.peek() == 1  # batch 1 owes it now
    assert s.queue.members.bound[:2] == [5, 3]


def test_a_short_batch_takes_a_later_kept_completion_and_every_step_trains_its_batch():
    s = _state()
    _fill(s)  # replica 0: 0, 2, 4, 6; replica 1: 1, 3, 5, 7
    _complete(s, 0, [0, 2], filtered=[True, False])  # batch 0 loses group 0
    _fill(s)  # group 8 replaces it in batch 0 (replica 0, least loaded)
    assert s.groups.groups[8].batch == 0
    _complete(s, 1, [1, 3, 5])  # batch 0: 1, 2, 3 kept; 5 (batch 1) completes first
    assert s.groups.groups[5].batch == 0 and s.groups.groups[8].batch == 1  # swapped, 8 still generating
    assert s.queue.batch_ready(0) and s.batch_groups(0) == (1, 2, 3, 5)
    _complete(s, 0, [4, 6, 8])
    _complete(s, 1, [7])
    assert s.queue.batch_ready(1) and s.batch_groups(1) == (4, 6, 7, 8)
    s.observe(TrainStepFinished(0, 1, 1.0), 2.0)  # the trained groups are the batch's kept ones
    assert s.groups.trained_count == {1: 1, 2: 1, 3: 1, 5: 1}
    report = s.groups.audit(bound=1, through_batch=0)
    assert report.ok and report.groups_filtered == 1 and report.groups_trained == 4


def test_a_running_group_moves_up_only_within_the_staleness_bound():
    s = _state(staleness=0, replica_cap=4)  # one version: only batch 0 admitted at first
    _fill(s)
    _complete(s, 0, [0], filtered=[True])
    _fill(s)  # 4 replaces 0 in batch 0
    assert s.groups.groups[4].batch == 0
    assert s._may_move_up(4, 1) is None  # at version 0 it may not join batch 1 (gap 1 > 0)


def test_the_keep_rate_starts_at_one_and_scales_the_groups_to_generate():
    s = _state()
    placed = _fill(s)
    assert s.est.keep_rate.value == 1.0 and groups_to_generate(s, 1) == s.queued_groups(1) == 0
    _complete(s, 0, placed[0], filtered=[True, True, False, False])
    assert s.est.keep_rate.value == pytest.approx(3 / 5)  # (kept + 1) / (seen + 1)
    # 2 holes queued, 4 groups in flight: (2 + 4 x (1 - k)) / k groups expected to start
    k = s.est.keep_rate.value
    assert groups_to_generate(s, 1) == pytest.approx((2 + 4 * (1 - k)) / k)


def test_a_batch_that_cannot_fill_within_the_cap_stops_the_run():
    s = _state(max_gen_batches=1, staleness=0)  # no group beyond the batch's own four
    placed = _fill(s)
    with pytest.raises(GenerationCapError, match="max_num_gen_batches=1: step 0 generated 4 groups") as e:
        _complete(s, 0, placed[0][:1], filtered=[True])
    assert e.value.most_kept == 3 and e.value.needed == 4
    named = e.value.named("algorithm.filter_groups.max_num_gen_batches", 7, "; resume with ...")
    assert str(named).startswith("algorithm.filter_groups.max_num_gen_batches=1: step 7 ")
    assert str(named).endswith("; resume with ...")


def test_a_fresh_group_out_of_the_queue_cannot_start():
    s = _state()
    with pytest.raises(ValueError, match="group 40 cannot start"):
        s.commit(AssignGroups(0, (40,)))  # 3 steps x 4 groups: nothing needs a 41st
