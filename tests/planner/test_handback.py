"""Prefixes handed back at a reclaim, in the recurrence (``pipeline``): once resumed on
the primaries they load them like any group started there."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from bidirl.planner.pipeline import PRIMARY, Pipeline, _Batch, _Plan
from bidirl.planner.residual import Residual
from bidirl.planner.stages import _Model

LENGTHS = np.linspace(50.0, 1500.0, 30)  # tokens: a spread, so batches drain


@dataclass(frozen=True)
class _Env:
    rollout_replicas: int = 1
    borrowable_replicas: int = 0
    aux_trainer_ranks: int = 0


def _model() -> _Model:
    """One replica, 16 groups of 2; a decode step of 5 ms + 0.2 ms per running sequence."""
    return _Model(a=5e-3, beta=2e-4, cap=32.0, group_slots=16, tokens=0.0,
                  longest_replica=float(LENGTHS.max()), staggered=lambda x: float(LENGTHS.max()),
                  residual=Residual(LENGTHS), responses=8, group_size=2, first_running=8.0,
                  prefill_step_s=0.0, prefill_group_s=0.0, micro_count=1.0, micro_s=1.0,
                  aux_micro_s=1.0, max_rank_s=1.0, overhead_s=0.0, weight_sync_s=0.0,
                  c_roll=0.0, c_roll_in=0.0, c_train=0.0)


def _pipe_with_batch_draining() -> tuple[Pipeline, float]:
    """Batch 0's 8 responses all started at t = 0 on the one primary replica."""
    m = _model()
    pipe = Pipeline(m, _Env(), s=1, group_longest=float(LENGTHS.max()), theta_fn=lambda idle: math.inf)
    step = m.a + m.beta * 8
    pipe._started[0] = _Batch(0, 0.0, 0, tau=LENGTHS.max() * step, step=step, first=0.0, last=0.0)
    pipe._pools[0] = {PRIMARY}
    pipe._chunks.append((0.0, 0.0, 8.0, PRIMARY))
    return pipe, step


def _handback(index: int, at: float, step: float, responses: int) -> _Batch:
    """Prefixes cut at ``at`` from groups started at 0 on a reclaimed replica."""
    left = LENGTHS.max() - at / step
    return _Batch(index, at, 0, tau=left * step, step=step, first=0.0, last=0.0, resume=True,
                  longest=left, left_responses=responses)


def test_resumed_prefixes_slow_a_batch_draining_on_the_primaries():
    pipe, step = _pipe_with_batch_draining()
    alone = pipe._ready_of(0, [], _Plan())
    assert alone == pytest.approx(pipe._ready(pipe._started[0], np.empty(0), _Plan()))
    pipe._resumed[1] = [(_handback(1, 0.5, step, 16), 0.5)]  # resumed at once, at 0.5 s
    beside = pipe._ready_of(0, [], _Plan())
    assert beside > alone
    pipe._resumed[2] = [(_handback(2, 0.5, step, 16), 0.5)]
    assert pipe._ready_of(0, [], _Plan()) > beside  # more prefixes, more load


def test_resumed_prefixes_load_each_other_and_count_once():
    """Two batches' prefixes resumed together each drain at the load of both; a batch's
    own prefixes are in its load once (committed or planned)."""
    pipe, step = _pipe_with_batch_draining()
    pipe._started.clear()
    pipe._pools.clear()
    pipe._chunks.clear()
    mine = _handback(1, 0.5, step, 16)
    pipe._resumed[1] = [(mine, 0.5)]
    alone = pipe._ready_of(1, [], _Plan())
    planned = _Plan()  # the same prefixes, planned instead of committed
    planned[(1, True)] = np.array([0.5])
    planned.resumed.append((mine, 0.5))
    pipe._resumed.clear()
    assert pipe._ready_of(1, [mine], planned) == pytest.approx(alone)
    pipe._resumed[1] = [(mine, 0.5)]
    pipe._resumed[2] = [(_handback(2, 0.5, step, 16), 0.5)]
    assert pipe._ready_of(1, [], _Plan()) > alone
