"""DAPO's dynamic sampling (``algorithm.filter_groups``) through the real runtime's executor,
every policy, on the fake device backend.

A third of the prompts score 0 whatever the response (their groups have no spread): the
rollout driver judges each group as it completes, the controller records the filtered ones
and queues a replacement for the same step.  Checked: every group the run created is trained
once or filtered once, never both, never lost; every step trains exactly its batch; the
staleness bound holds for replacements too; and the cap stops the run with one line.
"""

from __future__ import annotations

import pytest
from fake_devices import Costs
from fake_run import run_fake

from bidirl.controller.queue import GenerationCapError
from bidirl.core.ledger import audit_trained
from bidirl.policy import policy_names

WORKLOAD = dict(rollout=2, train=2, max_new=64, steps=8, prompts=6,
                costs=Costs(c_in_s=0.01, c_out_s=0.01, decode_s=0.01))


@pytest.mark.parametrize("policy", policy_names())
def test_every_group_is_trained_once_or_filtered_once(policy):
    run = run_fake(policy, **WORKLOAD, flat_every=3)
    spec, ex = run.spec, run.executor
    created = ex.rollout.next_group_id()
    audit = audit_trained(range(created), run.trained, run.staleness, spec.staleness, run.filtered)
    assert audit.ok, (audit.groups_lost[:5], audit.trained_twice[:5], audit.filtered_twice[:5],
                      audit.staleness_violations[:5])
    assert audit.groups_trained == WORKLOAD["steps"] * WORKLOAD["prompts"]
    assert audit.groups_filtered == created - audit.groups_trained > 0, "more groups generated than trained"
    # the flat prompts' groups are all filtered (another may tie by chance)
    assert {g for g in range(created) if g % 3 == 0} <= set(run.filtered)
    for step, rec in ex.steps.items():  # each step trains exactly its batch
        assert len(rec.group_ids) == WORKLOAD["prompts"], step
    assert max(run.staleness.values()) <= spec.staleness
    ctrl = ex.controller.state.groups.audit(spec.staleness)  # the controller's own ledger agrees
    assert ctrl.ok and ctrl.groups_filtered == audit.groups_filtered
    assert 0.5 < ex.controller.state.est.keep_rate.value < 0.8  # about 2/3 kept, measured online


def test_replacements_join_the_step_of_the_group_they_replace():
    run = run_fake("async", **WORKLOAD, flat_every=3)
    groups = run.executor.controller.state.groups.groups
    for g, step in run.filtered_at.items():  # recorded with the step it was filtered from
        assert groups[g].batch == step
    # the replacements are the data stream's next prompts: ids beyond steps x prompts train too
    assert max(run.trained) >= WORKLOAD["steps"] * WORKLOAD["prompts"]


def test_a_step_that_needs_more_than_the_cap_stops_the_run_in_one_line():
    with pytest.raises(GenerationCapError) as e:
        run_fake("async", **WORKLOAD, flat_every=1, max_gen_batches=2)  # nothing is ever kept
    msg = str(e.value)
    assert "max_num_gen_batches=2" in msg and "keep rate so far 0.00" in msg and "\n" not in msg
    assert e.value.batch == 0 and e.value.generated == 2 * WORKLOAD["prompts"]


@pytest.mark.parametrize("policy", ["async", "bidirl"])
def test_a_resumed_run_loses_no_group_and_records_none_twice(policy):
    first = run_fake(policy, **WORKLOAD, flat_every=3, stop_after=3)
    assert first.state is not None and max(first.trained) < first.state["next_group"]
    held = first.state["store"]["groups"]
    assert held and all(g["batch"] >= 3 for g in held), "the checkpoint holds the later steps' groups"
    second = run_fake(policy, **WORKLOAD, flat_every=3, resume=first.state)
    trained, filtered = first.trained + second.trained, first.filtered + second.filtered
    staleness = {**first.staleness, **second.staleness}
    created = second.executor.rollout.next_group_id()
    audit = audit_trained(range(created), trained, staleness, second.spec.staleness, filtered)
    assert audit.ok, (audit.groups_lost[:5], audit.trained_twice[:5], audit.filtered_twice[:5],
                      audit.staleness_violations[:5])
    assert audit.groups_trained == WORKLOAD["steps"] * WORKLOAD["prompts"] and audit.groups_filtered > 0
    assert sorted(second.executor.steps) == list(range(3, WORKLOAD["steps"]))
    assert all(len(rec.group_ids) == WORKLOAD["prompts"] for rec in second.executor.steps.values())
