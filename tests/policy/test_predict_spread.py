"""``predict.ready_in`` when the queued work fits on the home replicas: a borrowed replica
still shortens the batch by spreading the work (the fill at t = 0), and the groups beyond
the home replicas' share wait for it to come up (C_in)."""

from __future__ import annotations

import pytest

from bidirl.controller import AssignGroups, ClusterSpec
from bidirl.controller.state import ClusterState
from bidirl.policy import predict


def _state(**kw) -> ClusterState:
    base = dict(hardware="cpu-core", model="tiny-qwen2", devices=2, replica_devices=((0,),),
                train_devices=(1,), train_units=((1,),), rollout_tp=1, train_dp=1, train_tp=1,
                train_spans_nodes=False, replica_cap=128, groups_per_step=8, group_size=8,
                prompt_tokens=16, staleness=1, steps=6, micro_batch_tokens=4096)
    base.update(kw)
    return ClusterState(ClusterSpec(**base))


def test_a_borrowed_replica_shortens_a_batch_that_fits_by_the_decode_models_step_ratio():
    s = _state()
    tail = s.est.tail_s(128)  # batches 0 and 1 (128 responses) would crowd the one replica
    faster = s.est.step_slowdown(64, 128)
    assert faster > 1.0  # a step at 128 running sequences costs more than at 64
    assert predict.ready_in(s, 0) == pytest.approx(tail)
    # batch 0 fits in the home replica's share (64 of 128): it does not wait for C_in
    assert predict.ready_in(s, 0, add=1, add_delay_s=0.5) == pytest.approx(tail / faster)
    # batch 1's groups are the arriving replica's share: they start after C_in
    assert predict.ready_in(s, 1, add=1, add_delay_s=0.5) == pytest.approx(0.5 + tail / faster)


def test_running_groups_stay_where_they_are():
    """Once everything admissible runs, a borrowed replica has nothing to take."""
    s = _state()
    s.commit(AssignGroups(0, tuple(range(16))))
    assert s.queued_groups(1) == 0
    assert predict.ready_in(s, 0, add=1) == predict.ready_in(s, 0)


def test_no_gain_when_the_share_would_not_decode_faster():
    """A replica whose decode step does not grow with the batch gains nothing by spreading."""
    s = _state()
    s.est.rollout.decode.theta = [5e-3, 0.0, 0.0]  # a flat step time
    assert predict.ready_in(s, 0, add=1, add_delay_s=0.5) == predict.ready_in(s, 0)
