"""Validation and per-step reporting on the fake device backend (no Ray, no vLLM).

Validation runs on replica 0 outside the group ledger: every group is still trained
exactly once, each validation runs on the version it was asked for or a newer one, the
final one on the final weights, and its device time shows as ``validate``.  The reporter
logs veRL's metric names, the validation metrics at step = version, and ``samples.jsonl``.
"""

from __future__ import annotations

import json

import pytest
from fake_run import reward, run_fake

from bidirl.algo.data import PromptRow
from bidirl.obs.accounting import check_conservation
from bidirl.obs.metrics import read_metrics
from bidirl.obs.samples_log import read_samples, truncate_samples
from bidirl.runtime.boundary import StepBoundary
from bidirl.runtime.config import load_config
from bidirl.runtime.reporting import StepReporter
from bidirl.runtime.reward_call import BadRewardError, RewardFn
from bidirl.runtime.stops import StopSignals
from bidirl.runtime.validation import Validator, ValSet, score_validation


def _val_set(n: int = 5, max_new: int = 8) -> ValSet:
    rows = [PromptRow(({"role": "user", "content": f"q{i}"},), "even" if i % 2 == 0 else "odd", str(i),
                      {}, index=i, path="val.jsonl") for i in range(n)]
    return ValSet(rows, [[1, 2, 3, i] for i in range(n)], max_new)


def test_scoring_logs_verl_names_per_source_extras_and_samples():
    vs = _val_set(4)

    def fn(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(ground_truth) / 4, "acc": ground_truth == "3", "note": "ignored"}

    out = {"version": 7, "responses": [[5] * 8, [5, 6], [5], [5, 6, 7]], "seconds": 0.5}
    r = score_validation(vs, out, RewardFn(fn), lambda ids: "x" * len(ids), n_samples=2)
    m = r.metrics
    assert r.version == 7 and r.score == pytest.approx((0 + 1 + 2 + 3) / 16)
    assert m["val/score/mean"] == r.score and m["val/score/max"] == 0.75 and m["val/score/min"] == 0.0
    assert m["val-core/even/reward/mean@1"] == pytest.approx((0 + 2) / 8)
    assert m["val-core/odd/reward/mean@1"] == pytest.approx((1 + 3) / 8)
    assert m["val-aux/odd/acc/mean@1"] == 0.5 and m["val-aux/even/acc/mean@1"] == 0.0
    assert m["val/response_length/mean"] == 3.5 and m["val/response_length/clip_ratio"] == 0.25
    assert m["timing_s/val"] == 0.5 and m["val/bad_count"] == 0
    assert [s["prompt"] for s in r.samples] == ["q0", "q1"]
    assert r.samples[0] == {"kind": "val", "step": 7, "version": 7, "data_source": "even", "prompt": "q0",
                            "response": "x" * 8, "score": 0.0, "ground_truth": "0"}


def test_a_collapsed_policy_shows_in_the_mode_share_and_distinct_count():
    vs = _val_set(4)
    out = {"version": 3, "responses": [[0], [0], [0], [1]]}  # three of four answer "0"
    m = score_validation(vs, out, RewardFn(lambda *a, **k: 0.5), lambda ids: str(ids[0])).metrics
    assert m["val/distinct"] == 2 and m["val/mode_share"] == 0.75
    spread = {"version": 3, "responses": [[0], [1], [2], [3]]}
    m = score_validation(vs, spread, RewardFn(lambda *a, **k: 0.5), lambda ids: str(ids[0])).metrics
    assert m["val/distinct"] == 4 and m["val/mode_share"] == 0.25


def test_a_bad_validation_reward_follows_on_bad_reward():
    vs = _val_set(2)
    out = {"version": 1, "responses": [[1], [2]]}

    def nan(*_a, **_k):
        return float("nan")

    with pytest.raises(BadRewardError, match="validation.*val.jsonl line 1"):
        score_validation(vs, out, RewardFn(nan, "error"), str)
    r = score_validation(vs, out, RewardFn(nan, "zero"), str)
    assert r.metrics["val/bad_count"] == 2 and r.score == 0.0


def _attach(every: int, steps: int, log: list):
    """A setup for run_fake: a validator asked for every ``every`` steps, as the reporter does."""

    def setup(ex):
        vs = _val_set()
        ex.validator = Validator(ex, vs, lambda out: score_validation(vs, out, reward, str), log.append)
        requested: list[int] = []
        ex.validator.requested = requested

        def on_step(rec):
            k = rec.step + 1
            if k % every == 0 and k < steps:
                requested.append(k)
                ex.validator.request(k)

        return on_step

    return setup


@pytest.mark.parametrize("policy", ["sync", "async", "bidirl"])
def test_validation_stays_out_of_the_ledger_and_follows_the_weights(policy):
    log: list = []
    steps = 8
    run = run_fake(policy, steps=steps, setup=_attach(2, steps, log))
    spec = run.spec
    assert sorted(run.trained) == list(range(steps * spec.groups_per_step))
    assert set(run.trained.values()) == {1}, "validation trains nothing, and nothing twice"
    requested = run.executor.validator.requested
    assert requested == [2, 4, 6]
    versions = [r.version for r in log]
    assert versions[-1] == steps, "the final validation runs on the final weights"
    assert versions == sorted(versions) and len(versions) >= 2
    for k in requested:  # each request is met by a validation of that version or a newer one
        assert any(v >= k for v in versions)
    assert any(iv.label == "validate" for iv in run.intervals)
    wall = max(iv.end_s for iv in run.intervals)
    assert check_conservation(run.intervals, spec.devices, wall, tol=1e-9) == []


def test_the_reporter_logs_verl_names_validation_and_samples(tmp_path):
    steps = 6
    cfg = load_config(None, [f"run.steps={steps}", "run.val_every=2", "run.train_samples_every=2",
                             "run.train_samples=2", "run.val_samples=3", "run.tensorboard=false",
                             "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=48"])
    reporters = []

    def setup(ex):
        rep = StepReporter(cfg, tmp_path, 0, ex)
        rep.progress.stream = open(tmp_path / "progress.txt", "w")  # noqa: SIM115 - closed by the reporter
        vs = _val_set()
        ex.validator = Validator(ex, vs, lambda out: score_validation(vs, out, reward, str, n_samples=3),
                                 rep.on_validation)
        boundary = StepBoundary(cfg, tmp_path, 0, {}, StopSignals(), ex, None, rep, tmp_path / "trained_groups.jsonl")
        boundary.checkpoint = lambda next_step: None  # a fake trainer saves nothing: this test is the reports
        reporters.append((rep, boundary))
        return boundary.after_step

    run_fake("async", steps=steps, setup=setup)
    rep, boundary = reporters[0]
    rep.close()
    boundary.close()
    assert sorted(boundary.rewards_by_step) == list(range(steps)) and boundary.next_step == steps
    totals = rep._guard_totals()
    rep.metrics.close()
    records = read_metrics(tmp_path)
    train = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in train] == list(range(steps))
    for key in ("critic/score/mean", "critic/score/max", "critic/score/min", "response_length/mean",
                "response_length/max", "response_length/clip_ratio", "prompt_length/mean", "timing_s/gen",
                "timing_s/update_actor", "timing_s/step", "perf/throughput", "perf/total_num_tokens"):
        assert key in train[-1], key
    assert train[0]["critic/score/mean"] == train[0]["reward/mean"]
    assert train[0]["prompt_length/mean"] == 6 and train[0]["response_length/max"] <= 48
    assert any("timing_s/update_weights" in r for r in train)
    val = [r for r in records if "val/score/mean" in r]
    assert [r["step"] for r in val] == [2, 4, 6] and "val-core/even/reward/mean@1" in val[0]
    assert {"val/mode_share", "val/distinct"} <= set(val[0])
    assert totals["val_score"] == val[-1]["val/score/mean"] and [v["step"] for v in totals["val_scores"]] == [2, 4, 6]
    samples = read_samples(tmp_path)
    kinds = [(s["kind"], s["step"]) for s in samples]
    assert sorted(k for k in kinds if k[0] == "train") == [("train", s) for s in (0, 0, 2, 2, 4, 4)]
    assert sorted(k for k in kinds if k[0] == "val") == [("val", s) for s in (2, 2, 2, 4, 4, 4, 6, 6, 6)]
    assert all({"prompt", "response", "score", "version"} <= set(s) for s in samples)
    assert "val 0." in (tmp_path / "progress.txt").read_text()


def test_samples_are_cut_back_on_resume(tmp_path):
    lines = [{"kind": "train", "step": s} for s in range(5)] + [{"kind": "val", "step": s} for s in (2, 4)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn')
    assert truncate_samples(tmp_path, 4) == 3  # train 4, val 4 and the torn line
    assert [(r["kind"], r["step"]) for r in read_samples(tmp_path)] == [
        ("train", 0), ("train", 1), ("train", 2), ("train", 3), ("val", 2)]


def test_the_reporter_warns_when_one_validation_response_takes_most(tmp_path, capsys):
    from bidirl.runtime.validation import ValResult

    cfg = load_config(None, ["run.tensorboard=false"])
    rep = StepReporter(cfg, tmp_path, 0, ex=None)
    rep.on_validation(ValResult(4, 0.5, {"val/score/mean": 0.5, "val/mode_share": 0.75, "val/distinct": 2,
                                         "val/prompts": 4}))
    assert rep.val_mode_share == 0.75
    assert "one response is 75% of 4 (2 distinct)" in capsys.readouterr().err
    line = rep.progress.update(5, val_score=rep.val_score, val_mode_share=rep.val_mode_share)
    assert "val 0.500 COLLAPSE? 75% one response" in line
    rep.on_validation(ValResult(6, 0.5, {"val/score/mean": 0.5, "val/mode_share": 0.25, "val/distinct": 4,
                                         "val/prompts": 4}))
    assert capsys.readouterr().err == ""
    rep.close()
    rep.metrics.close()
