"""DAPO's dynamic sampling in a real run's files, on the fake device backend (no Ray, no vLLM):
the ledger (``trained_groups.jsonl``) records each step's filtered groups beside its trained
ones, its audit and the resume checks account for every group, the metrics report the keep
rate, a resumed run maps the checkpoint's groups, and the config takes veRL's names."""

from __future__ import annotations

import json

import pytest
from fake_run import run_fake

from bidirl.obs.metrics import read_metrics
from bidirl.runtime.boundary import StepBoundary
from bidirl.runtime.calibrated_scenario import keep_rate_fit
from bidirl.runtime.checkpoints import ledger_problem, read_jsonl
from bidirl.runtime.config import ConfigError, load_config, resume_safe
from bidirl.runtime.group_ids import GroupIds
from bidirl.runtime.reporting import StepReporter
from bidirl.runtime.run_dir import truncate_ledger
from bidirl.runtime.run_summary import audit
from bidirl.runtime.stops import StopSignals

STEPS, PPS = 6, 4


def _run(tmp_path):
    cfg = load_config(None, [f"run.steps={STEPS}", f"rollout.prompts_per_step={PPS}", "rollout.group_size=4",
                             "rollout.max_new_tokens=48", "run.tensorboard=false", "run.val_every=0",
                             "run.train_samples_every=0", "algorithm.filter_groups.enable=true"])
    kept = {}

    def setup(ex):
        rep = StepReporter(cfg, tmp_path, 0, ex)
        rep.progress.stream = open(tmp_path / "progress.txt", "w")  # noqa: SIM115 - closed by the reporter
        boundary = StepBoundary(cfg, tmp_path, 0, {}, StopSignals(), ex, None, rep, tmp_path / "trained_groups.jsonl")
        boundary.checkpoint = lambda next_step: None  # a fake trainer saves nothing
        kept.update(rep=rep, boundary=boundary)
        return boundary.after_step

    run = run_fake("async", steps=STEPS, prompts=PPS, flat_every=3, setup=setup)
    kept["rep"].close()
    kept["boundary"].close()
    return cfg, run


def test_the_ledger_records_filtered_groups_and_the_audit_accounts_for_every_one(tmp_path):
    cfg, run = _run(tmp_path)
    ledger = tmp_path / "trained_groups.jsonl"
    records = read_jsonl(ledger)[0]
    filtered = [r for r in records if r.get("outcome") == "filtered"]
    assert filtered and all(set(r) == {"group", "step", "outcome"} for r in filtered)
    assert sorted(r["group"] for r in filtered) == sorted(run.filtered)
    created = run.executor.rollout.next_group_id()
    checked = audit(ledger, cfg, created=created)
    assert checked["ok"] and checked["groups_trained"] == STEPS * PPS
    assert checked["groups_filtered"] == len(filtered) == created - STEPS * PPS
    assert checked["keep_rate"] == pytest.approx(STEPS * PPS / created, abs=1e-4)
    assert audit(ledger, cfg)["ok"]  # without the executor: past the highest id recorded
    for k in range(STEPS + 1):  # every boundary is a consistent resume point
        assert ledger_problem(records, k, PPS) is None, k
    truncate_ledger(ledger, 3)
    left = read_jsonl(ledger)[0]
    assert {r["step"] for r in left} == {0, 1, 2} and any(r.get("outcome") == "filtered" for r in left)
    metrics = [m for m in read_metrics(tmp_path) if "filter/keep_rate" in m]
    assert len(metrics) == STEPS and all(0 < m["filter/keep_rate"] < 1 for m in metrics)
    assert sum(m["filter/groups_filtered"] for m in metrics) == len(filtered)


def test_the_resume_check_refuses_a_step_short_of_groups_or_a_group_recorded_twice():
    records = [{"group": g, "step": 0, "staleness": 0} for g in (1, 2)] + [{"group": 0, "step": 0,
                                                                          "outcome": "filtered"}]
    assert ledger_problem(records, 1, 2) is None
    assert "1 steps short" in ledger_problem(records[1:], 1, 2)
    twice = records + [{"group": 1, "step": 0, "outcome": "filtered"}]
    assert "1 groups twice" in ledger_problem(twice, 1, 2)


def test_a_resumed_run_lists_the_checkpoints_groups_by_step_then_creates_new_ones():
    plain = GroupIds.resumed({8: None, 9: None}, 10, prompts_per_step=4)  # a checkpoint of step 2
    assert [plain.global_id(i) for i in range(4)] == [8, 9, 10, 11]  # the offset it always was
    ids = GroupIds.resumed({13: 2, 9: 3, 12: 2, 14: 3}, 17, prompts_per_step=4)
    assert [ids.global_id(i) for i in range(6)] == [12, 13, 9, 14, 17, 18]
    assert [ids.local_id(g) for g in (12, 13, 9, 14, 17, 18)] == list(range(6))
    assert GroupIds().global_id(5) == 5 and GroupIds().local_id(5) == 5


def test_the_config_takes_verls_names_and_refuses_reproducible_mode():
    cfg = load_config(None, ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=5",
                             "algorithm.filter_groups.metric=seq_reward"])
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.max_num_gen_batches == 5
    assert load_config(None, ["algorithm.filter_groups.metric=acc"]).algorithm.filter_groups.metric == "acc"
    with pytest.raises(ConfigError, match="algorithm.filter_groups.enable: must be false with scheduler.reproducible"):
        load_config(None, ["algorithm.filter_groups.enable=true", "scheduler.reproducible=true"])
    assert resume_safe("algorithm.filter_groups.max_num_gen_batches")
    assert not resume_safe("algorithm.filter_groups.enable")


def test_the_calibrated_scenario_fits_the_keep_rate_over_the_versions():
    def done(t, flags):
        return {"event": "GroupsCompleted", "t": t, "group_ids": list(range(len(flags))),
                "response_lengths": [[4]] * len(flags), "filtered": flags}

    step = [{"event": "TrainStepFinished", "t": float(t)} for t in (1, 2, 3)]
    records = step + [done(0.5, [True, True, False, False]), done(3.5, [False, False, False, True])]
    fit = keep_rate_fit(records, steps=4)
    assert fit == {"start": 0.5, "end": 0.75}  # half kept at version 0, three quarters at version 3
    assert keep_rate_fit([done(0.5, [False, False])], 4) is None  # nothing filtered: no keep_rate
    assert json.dumps(fit)


def test_a_filtering_runs_calibrated_scenario_filters_in_the_simulator():
    from bidirl.perf.scenario import from_dict
    from bidirl.runtime import calibrated_scenario
    from bidirl.sim.run import simulate

    cfg = load_config(None, [f"run.steps={STEPS}", f"rollout.prompts_per_step={PPS}",
                             "algorithm.filter_groups.enable=true"])
    run = run_fake("async", steps=STEPS, prompts=PPS, flat_every=3)
    data = calibrated_scenario.scenario_dict(calibrated_scenario.facts(cfg, run.executor, run.intervals))
    keep = data["workload"]["keep_rate"]
    assert 0.4 < keep["start"] <= 0.8 and data["workload"]["response_length"]["order"] == "cycle"
    result = simulate(from_dict(data, "calibrated"), "async")
    assert result.groups_filtered > 0 and result.groups_lost == 0 and result.extra["ledger_ok"]
