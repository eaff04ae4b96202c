"""The real runtime's executor, every policy, on the in-process fake device backend.

The same ``DeviceExecutor`` that drives Ray actors runs here against fake workers on a
virtual clock (``fake_devices.py``), so these are the simulator's invariants checked on
the real runtime's logic, without Ray or vLLM:

* every group of every step is trained exactly once, within the staleness bound (the one
  ledger audit, ``core.ledger.audit_trained``);
* device time is conserved: each device's intervals tile ``[0, wall]``;
* a response interrupted by a reclaim and resumed elsewhere equals the uninterrupted one;
* borrowing does not change the update: replaying the merged micro-batches on one trainer
  gives bitwise the same weights;
* a lent device that dies mid-step loses nothing; a run is a function of its inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_devices import Costs, FakeTrainer, response_length, token_at
from fake_run import run_fake

from bidirl.core.ledger import audit_trained
from bidirl.obs.accounting import check_conservation
from bidirl.obs.trace import trace_sha256
from bidirl.policy import policy_names

# Long responses and a cheap trainer: the trainer idles, lending it as a replica pays.
ROLLOUT_HEAVY = dict(rollout=1, train=2, max_new=256, steps=10, prompts=8,
                     costs=Costs(c_in_s=0.01, c_out_s=0.01, decode_s=0.01))
# Short responses and a costly trainer: replicas idle, auxiliary trainers pay.
TRAIN_HEAVY = dict(rollout=2, train=1, max_new=16, steps=10,
                   costs=Costs(train_per_token_s=5e-3, c_in_s=0.01, c_out_s=0.01))
WORKLOADS = {"rollout-heavy": ROLLOUT_HEAVY, "train-heavy": TRAIN_HEAVY}
LENDS_TRAIN = {"roll-borrow", "bidirl-opportunistic", "bidirl"}  # where rollout-heavy must borrow
LENDS_ROLL = {"train-borrow", "bidirl-opportunistic", "bidirl"}  # where train-heavy must borrow


def _check_invariants(run, workload: dict, policy: str) -> None:
    spec, ex = run.spec, run.executor
    audit = audit_trained(range(spec.total_groups), run.trained, run.staleness, spec.staleness)
    assert audit.ok, (audit.groups_lost[:5], audit.trained_twice[:5], audit.staleness_violations[:5])
    assert audit.groups_trained == workload["steps"] * workload.get("prompts", 4)
    assert check_conservation(run.intervals, spec.devices, ex.now()) == []
    for (g, i), r in run.responses.items():  # resumed or not, each response is the same sequence
        n = response_length(g, i, workload["max_new"])
        assert r.token_ids == [token_at(g, i, p) for p in range(n)], (g, i)
        assert len(r.logprobs) == len(r.versions) == n and r.versions == sorted(r.versions)
    if policy == "sync":
        assert max(run.staleness.values()) == 0
    if policy in ("sync", "one-step-off", "async"):
        assert ex.hosting.lends["roll_on_train"] == ex.hosting.lends["train_on_roll"] == 0


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_keeps_the_invariants(policy, workload):
    kw = WORKLOADS[workload]
    run = run_fake(policy, **kw)
    _check_invariants(run, kw, policy)
    lends = run.executor.hosting.lends
    if workload == "rollout-heavy" and policy in LENDS_TRAIN:
        assert lends["roll_on_train"] > 0, "a rollout-bound run lends its idle trainer"
        interrupted = sum(g.interruptions for g in run.executor.controller.state.groups.groups.values())
        assert interrupted > 0, "reclaims handed partial prefixes back (and they resumed exactly)"
    if workload == "train-heavy" and policy in LENDS_ROLL:
        assert lends["train_on_roll"] > 0, "a train-bound run lends its idle replicas"


def _replayed_weights(run) -> np.ndarray:
    """One trainer, computing every merged micro-batch itself, summed in the same order
    (each data-parallel rank's share in merge order, then the ranks in rank order)."""
    ranks = [run.backend.workers[d].roles["train"] for d in run.spec.train_devices]
    alone = FakeTrainer(run.backend.costs)
    for step in range(len(ranks[0].applied)):
        shares = [r.applied[step] for r in ranks]
        total_tokens = sum(len(s["response_ids"]) for mbs in shares for mb in mbs for s in mb)
        total = np.zeros_like(alone.w)
        for mbs in shares:
            part = np.zeros_like(alone.w)
            for mb in mbs:
                part += alone.grad(mb, total_tokens)
            total += part
        alone.step_with(total)
    return alone.w


@pytest.mark.parametrize("policy,workload", [("bidirl", TRAIN_HEAVY), ("train-borrow", TRAIN_HEAVY),
                                             ("bidirl-opportunistic", dict(TRAIN_HEAVY, train=2))])
def test_borrowing_does_not_change_the_update(policy, workload):
    run = run_fake(policy, **workload)
    chunks = [c for rec in run.executor.steps.values() for c in rec.chunks]
    assert any(ex != "primary" for ex, _ in chunks), "auxiliary trainers computed chunks"
    primary = run.backend.workers[run.spec.train_devices[0]].roles["train"]
    assert len(primary.applied) == workload["steps"]
    np.testing.assert_array_equal(_replayed_weights(run), primary.w)
    for d in run.spec.train_devices[1:]:  # data-parallel ranks step with the same all-reduced sum
        np.testing.assert_array_equal(run.backend.workers[d].roles["train"].w, primary.w)


def test_a_lent_device_that_dies_mid_step_loses_nothing():
    run = run_fake("bidirl-opportunistic", **TRAIN_HEAVY, kill_aux_at_step=2)
    assert run.executor.lost_devices, "the fault was injected"
    _check_invariants(run, TRAIN_HEAVY, "bidirl-opportunistic")
    primary = run.backend.workers[run.spec.train_devices[0]].roles["train"]
    np.testing.assert_array_equal(_replayed_weights(run), primary.w)


def test_reclaims_wait_for_at_most_the_work_in_progress():
    run = run_fake("bidirl", **ROLLOUT_HEAVY)
    waits = run.executor.reclaim_waits
    assert waits
    for w in waits:  # the call in flight when the reclaim arrived: one decode step or micro-batch
        assert w["wait_s"] <= w["last_work_s"] + 1e-9, w


def test_a_run_is_a_function_of_its_inputs():
    a, b = (run_fake("bidirl", **ROLLOUT_HEAVY) for _ in range(2))
    assert trace_sha256(a.intervals) == trace_sha256(b.intervals)
    assert a.executor.now() == b.executor.now()
