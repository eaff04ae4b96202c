"""The metrics of a step are a pure function of the step's record, its groups and what the
executor saw since the previous step: no executor, no store, no session."""

from __future__ import annotations

from types import SimpleNamespace

from bidirl.runtime.reporting import SinceLastStep, StepGroups, step_metrics


def _rec(**kw):
    base = dict(step=3, group_ids=[6, 7], rewards=[1.0, 0.0, 0.5, 0.5], staleness=[0, 1], started_s=10.0,
                finished_s=12.5, total_tokens=400, chunks=[("primary", 0), ("aux", 1)], c_grad_s=[0.2, 0.4],
                metrics={"loss": 0.3, "clip_frac": 0.1, "lr": 1e-3}, filtered=None)
    return SimpleNamespace(**{**base, **kw})


def _seen(**kw):
    decision = SimpleNamespace(direction="roll_on_train", admit=True, benefit_s=2.0, cost_s=float("inf"),
                               margin_s=0.5)
    base = dict(step_s=4.0, idle_ratios={"train": 0.25}, borrowed_s={"roll_on_train": 1.5}, gen_s=3.0,
                syncs_s=[0.1, 0.3], switches=[("roll_on_train.c_in", 0.2), ("roll_on_train.c_in", 0.4),
                                              ("train_on_roll.c_out", 0.1)],
                pair_medians={"roll_on_train.c_in/n0-n1": 0.3}, decisions=[decision], reclaim_waits=[{"wait_s": 0.7}],
                model_errors={"decode": 0.05, "train": None})
    return SinceLastStep(**{**base, **kw})


def test_the_metrics_of_a_step():
    groups = StepGroups(bad_count=1, extra_means={"acc": 0.5}, response_lengths=[4, 8, 8, 2], prompt_lengths=[5, 7])
    m = step_metrics(_rec(), groups, _seen(), max_new_tokens=8)
    assert m["reward/mean"] == m["critic/score/mean"] == 0.5 and m["reward/bad_count"] == 1
    assert m["response_length/clip_ratio"] == 0.5 and m["prompt_length/mean"] == 6
    assert m["perf/throughput"] == 100.0 and m["timing_s/update_actor"] == 2.5 and m["timing_s/gen"] == 3.0
    assert m["trainer/idle_ratio"] == 0.25 and m["rollout/idle_ratio"] == 0.0
    assert m["staleness/max"] == 1 and m["borrow/aux_chunks"] == 1 and m["borrow/roll_on_train_s"] == 1.5
    assert m["actor/loss"] == 0.3 and m["actor/pg_clipfrac"] == 0.1 and "actor/grad_norm" not in m
    assert m["reward/extra/acc"] == 0.5 and abs(m["timing_s/update_weights"] - 0.2) < 1e-12
    assert m["stage_model/decode_median_error"] == 0.05 and "stage_model/train_median_error" not in m
    assert abs(m["switch/roll_on_train/c_in_s"] - 0.3) < 1e-12 and m["switch/c_out_s"] == 0.1
    assert abs(m["switch/c_grad_s"] - 0.3) < 1e-12 and m["switch/c_in_s/roll_on_train/n0-n1"] == 0.3
    assert m["admission/roll_on_train/admitted"] == 1 and "admission/roll_on_train/cost_s" not in m
    assert m["switch/reclaim_wait_max_s"] == 0.7


def test_a_quiet_step_leaves_out_what_it_did_not_measure():
    groups = StepGroups(0, {}, [8, 8], [5])
    m = step_metrics(_rec(c_grad_s=[], metrics={}), groups,
                     _seen(step_s=0.0, gen_s=None, syncs_s=[], switches=[], pair_medians={}, decisions=[],
                           reclaim_waits=[], borrowed_s={}, model_errors={"decode": None, "train": None}), 8)
    assert m["perf/throughput"] == 0.0
    assert not [k for k in m if k.startswith(("switch/", "admission/", "timing_s/gen", "timing_s/update_weights",
                                               "stage_model/", "actor/", "borrow/roll"))]
