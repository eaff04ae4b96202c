"""An auxiliary trainer joining a step in progress (``JoinStep``), on the fake device backend.

A replica that rolled out the next batch and is stopped by the staleness bound joins the
step the trainer is computing: it takes unclaimed micro-batches from the tail while the
primary takes its own from the head.  Checked here on the real runtime's executor:

* joins happen where training is the bottleneck, and the step gets shorter;
* the update is bitwise the one ``async`` computes without borrowing (each micro-batch is
  merged where the plan put it, whoever computed it), with one trainer or two
  data-parallel ranks;
* a joiner that dies mid-step loses nothing: its micro-batch goes back to the primary.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_run import run_fake
from test_executor_fake import TRAIN_HEAVY, _check_invariants

from bidirl.policy.split import RankProgress, steal_schedule


def _joined(run) -> int:
    return sum(n for rec in run.executor.steps.values() for ex, n in rec.chunks if ex.endswith("(joined)"))


def _weights(run) -> list[np.ndarray]:
    return [run.backend.workers[d].roles["train"].w for d in run.spec.train_devices]


@pytest.mark.parametrize("train", [1, 2])
def test_joining_does_not_change_the_update(train):
    kw = dict(TRAIN_HEAVY, train=train)
    base = run_fake("async", **kw)
    for policy in ("bidirl", "bidirl-opportunistic"):
        run = run_fake(policy, **kw)
        _check_invariants(run, kw, policy)
        if policy == "bidirl":
            assert _joined(run) > 0, "replicas stopped by the staleness bound joined steps in progress"
        static = any(ex not in ("primary",) and not ex.endswith("(joined)")
                     for rec in run.executor.steps.values() for ex, _ in rec.chunks)
        if train == 1 or not static:  # chunks of a plan are merged by rank 0, joins where they belong
            for w, w0 in zip(_weights(run), _weights(base)):
                np.testing.assert_array_equal(w, w0)


def test_a_sharded_primary_merges_by_index_so_no_plan_changes_the_update():
    """fsdp2: micro-batch i is merged by rank i % 2 whoever computed it, the plan's
    auxiliary chunks included, so two ranks end bitwise as ``async`` does (DDP's ranks merge
    a plan's chunks on rank 0 and are equal only without them, above)."""
    kw = dict(TRAIN_HEAVY, train=2, strategy="fsdp2")
    base = run_fake("async", **kw)
    statics = 0
    for policy in ("bidirl", "bidirl-opportunistic"):
        run = run_fake(policy, **kw)
        _check_invariants(run, {k: v for k, v in kw.items() if k != "strategy"}, policy)
        statics += sum(not ex.endswith("(joined)") and ex != "primary"
                       for rec in run.executor.steps.values() for ex, _ in rec.chunks)
        for w, w0 in zip(_weights(run), _weights(base)):
            np.testing.assert_array_equal(w, w0)
    assert statics > 0, "a plan gave auxiliaries chunks of their own"


def test_joins_shorten_the_steps():
    kw = dict(TRAIN_HEAVY, steps=12)
    base, run = run_fake("async", **kw), run_fake("bidirl", **kw)
    steps = lambda r: sorted(x.finished_s - x.started_s for x in r.executor.steps.values())  # noqa: E731
    assert _joined(run) > 0
    assert steps(run)[len(steps(run)) // 2] < 0.75 * steps(base)[len(steps(base)) // 2]


def test_a_joiner_that_dies_mid_step_loses_nothing():
    kw = dict(TRAIN_HEAVY, rollout=1)  # the opportunistic policy lends only by joining
    run = run_fake("bidirl-opportunistic", **kw, kill_aux_at_step=3)
    assert run.executor.lost_devices, "the fault was injected"
    assert all(ex in ("primary", "0 (joined)") for rec in run.executor.steps.values() for ex, _ in rec.chunks)
    _check_invariants(run, kw, "bidirl-opportunistic")
    np.testing.assert_array_equal(_weights(run)[0], _weights(run_fake("async", **kw))[0])


def test_the_steal_schedule_takes_each_micro_batch_once_from_the_tail():
    ranks = [RankProgress(1.0, 1.0, tuple((i, 1.0) for i in range(2, 12, 2))),
             RankProgress(1.5, 1.0, tuple((i, 1.0) for i in range(3, 12, 2)))]
    plan = steal_schedule(ranks, [0.2, 0.9], {i: 1.5 for i in range(12)})
    taken = [i for aux in plan.stolen for i, _ in aux]
    assert len(taken) == len(set(taken)) and set(taken) <= set(range(2, 12))
    first = [aux[0][0] for aux in plan.stolen]
    assert first == [11, 10]  # the highest unclaimed index, whoever is free first
    for aux, start in zip(plan.stolen, (0.2, 0.9)):  # back to back from its start
        assert [c for _, c in aux] == [start + 1.5 * k for k in range(len(aux))]
    alone = steal_schedule(ranks, [], {})
    assert plan.primary_end_s < alone.primary_end_s == 7.5
    late = steal_schedule(ranks, [100.0], {i: 1.5 for i in range(12)})
    assert late.stolen == ((),) and late.primary_end_s == 7.5
