"""End to end on CPU with real vLLM, Ray and torch: ``bidirl train`` on the tiny model.

Each run starts Ray and two vLLM engines (~30-40 s here), so the file keeps to a few runs
and checks many things on each: the ledger audit (every group trained exactly once),
staleness against the bound from the recorded token versions, the run directory's files,
and kill-and-resume losing nothing and training nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from runtime_cli_helpers import ROOT, SMALL, assert_run_sound, bidirl_cmd, run_cli

from bidirl.obs.accounting import check_conservation
from bidirl.obs.metrics import read_metrics
from bidirl.runtime.config import TrainConfig

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


def _device_intervals(trace: dict) -> list:
    """The trace's device-time spans (its complete "X" events) as ``Interval``s, for
    ``check_conservation``."""
    from bidirl.core.timeline import Activity, Interval

    return [Interval(e["args"]["device"], e["args"]["pool"], e["args"]["role"], Activity(e["args"]["activity"]),
                     e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, "", e["args"]["borrowed"])
            for e in trace["traceEvents"] if e.get("ph") == "X"]


def _ledger(run_dir):
    return [json.loads(ln) for ln in (run_dir / "trained_groups.jsonl").read_text().splitlines() if ln]


def test_async_grpo_end_to_end(tmp_path, real_runtime_available):
    """With DAPO's dynamic sampling on: a group whose rewards come out all equal is filtered and
    replaced (the ledger records it; the audit accounts for it).  With KL in the reward: each
    step asks the trainer's reference model for the responses' KL (veRL's metric names)."""
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=5", "scheduler.policy=async",
                  "scheduler.staleness=1", "cluster.prewarm=false", "run.val_every=2", "data.val_max_samples=8",
                  "run.train_samples_every=2", "algorithm.filter_groups.enable=true",
                  "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1",
                  "algorithm.kl_penalty=low_var_kl")
    assert out.returncode == 0, out.stderr[-3000:]
    console = (out.stdout + out.stderr).splitlines()
    assert len(console) < 30, "\n".join(console)  # vLLM and Ray at WARNING, no line per weight sync
    assert not any("Failed to load weights" in ln or " INFO " in ln for ln in console), "\n".join(console)
    assert not any("skipped" in ln for ln in console), "a stage model without an error yet is no skipped metric"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"] and summary["audit"]["groups_lost"] == 0
    records = _ledger(run)
    ledger = [r for r in records if r.get("outcome") != "filtered"]
    filtered = [r["group"] for r in records if r.get("outcome") == "filtered"]
    groups = [r["group"] for r in ledger]
    assert len(groups) == 5 * 4 and sorted(groups + filtered) == list(range(len(records))), \
        "every group created trained exactly once or filtered exactly once"
    assert summary["groups_filtered"] == summary["audit"]["groups_filtered"] == len(filtered)
    assert summary["keep_rate"] == pytest.approx(20 / (20 + len(filtered)), abs=1e-4)
    assert max(r["staleness"] for r in ledger) <= 1
    assert any(r["staleness"] == 1 for r in ledger), "async should use its staleness budget"
    metrics = read_metrics(run)
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 5
    for key in ("timing_s/step", "perf/throughput", "trainer/idle_ratio", "rollout/idle_ratio",
                "staleness/mean", "staleness/max", "filter/keep_rate", "filter/groups_filtered"):
        assert key in steps[0], key
    assert any(k.startswith("final/stage_model_median_error/") for k in metrics[-1])
    for key in ("critic/score/mean", "response_length/mean", "response_length/clip_ratio", "prompt_length/mean",
                "actor/entropy", "actor/lr", "timing_s/gen", "timing_s/update_actor"):
        assert key in steps[-1], key
    assert any("timing_s/update_weights" in m for m in steps)
    assert all(m["actor/reward_kl_penalty_coeff"] == 0.1 and m["actor/reward_kl_penalty"] >= -1e-6 for m in steps)
    assert steps[-1]["actor/reward_kl_penalty"] > 1e-4, "the policy moved away from its reference"
    # validation: at steps 2 and 4 and at the end, on replica 0, outside the ledger
    val = [m for m in metrics if "val/score/mean" in m]
    versions = [m["step"] for m in val]  # the version each ran on: the one asked for, or a newer one
    assert len(versions) == 3 and versions[0] >= 2 and versions[1] >= 4 and versions[-1] == 5, versions
    task = TrainConfig().data.task  # the default task: veRL's val-core/<data_source>/... names
    assert all(m["val/prompts"] == 8 and f"val-core/{task}/reward/mean@1" in m for m in val)
    samples = [json.loads(ln) for ln in (run / "samples.jsonl").read_text().splitlines()]
    assert {(s["kind"], s["step"]) for s in samples} == {("val", v) for v in versions} | {
        ("train", 0), ("train", 2), ("train", 4)}
    assert all(isinstance(s["response"], str) and isinstance(s["score"], float) for s in samples)
    assert summary["val_score"] == val[-1]["val/score/mean"] and summary["reward_last_50"] is not None
    trace = json.loads((run / "trace.json").read_text())
    assert {e["tid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {1, 2}
    assert any("validate" in e.get("name", "") for e in trace["traceEvents"] if e.get("ph") == "X")
    # the figures are the training loop's: the final validation comes after it, counted apart
    end = max((e["ts"] + e["dur"]) / 1e6 for e in trace["traceEvents"] if e.get("ph") == "X")
    last_val = max(e["ts"] / 1e6 for e in trace["traceEvents"] if "validate" in e.get("name", ""))
    assert summary["final_validation_s"] > 0 and last_val >= summary["wall_s"] - 0.006  # wall_s: 2 decimals
    assert summary["wall_s"] + summary["final_validation_s"] == pytest.approx(end, abs=0.01)
    pool_s = summary["extra"]["pool_seconds"]
    assert sum(sum(v.values()) for v in pool_s.values()) == pytest.approx(2 * summary["wall_s"], abs=0.011)
    assert (run / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(run.glob("events.out.tfevents.*")), "TensorBoard events written"
    assert (run / "config.yaml").is_file()


def test_kill_mid_run_then_resume_loses_nothing(tmp_path, real_runtime_available):
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), *SMALL, "run.steps=10", "run.checkpoint_every=1",
            "scheduler.policy=async", "scheduler.staleness=2", "cluster.prewarm=false"]
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(bidirl_cmd(*args), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            # any mid-run checkpoint from step 4 on (the newest two are kept, so poll for all)
            if any(4 <= int(p.parent.name.split("_")[1]) < 10
                   for p in (run / "checkpoints").glob("step_*/COMPLETE")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "run ended before it could be killed: " + proc.stderr.read()[-2000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and every Ray process with it
    finally:
        proc.wait(timeout=60)
    state = json.loads(max((run / "checkpoints").glob("step_*/state.json"),
                           key=lambda p: int(p.parent.name.split("_")[1])).read_text())
    buffered = [g for g in state["store"]["groups"] if g["done"] or g["partial"]]
    assert buffered, "with staleness 2 the checkpoint holds groups generated ahead"
    out = run_cli("train", "--resume", str(run))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from" in out.stderr
    groups = [r["group"] for r in _ledger(run)]
    assert sorted(groups) == list(range(10 * 4)), "no group lost, none trained twice"
    assert max(r["staleness"] for r in _ledger(run)) <= 2
    assert_run_sound(run, 10)


def test_bad_config_and_data_are_one_line_errors(tmp_path):
    out = run_cli("train", "scheduler.policy=fastest")
    assert out.returncode == 2 and "scheduler.policy" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "data_source": "add", "reward_model": {"ground_truth": "1"}}\n'
                   '{"prompt": 3, "data_source": "add", "reward_model": {"ground_truth": "1"}}\n')
    out = run_cli("train", "--run-dir", str(tmp_path / "r"), f"data.files={bad}")
    assert out.returncode == 2 and "line 2" in out.stderr and "prompt" in out.stderr
    assert "Traceback" not in out.stderr


def test_device_time_is_conserved_with_a_data_parallel_trainer(tmp_path, real_runtime_available):
    """``sync`` on one rollout device and two train devices, which form a gloo data-parallel
    group (3 device workers on this 2-core machine): every device's time adds up to the wall,
    the run audits clean, and sync's phase switches are colocated switches, not borrows."""
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=4", "scheduler.policy=sync",
                  "cluster.train_devices=2", "cluster.oversubscribe=true")
    assert out.returncode == 0, out.stderr[-3000:]
    trace = json.loads((run / "trace.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"] and summary["audit"]["groups_trained"] == 4 * 4, summary["audit"]
    assert summary["audit"]["max_staleness"] == 0, "sync trains only on-policy samples"
    # sync's phase switches are colocated switches, not borrows (the simulator's meaning too)
    assert summary["extra"]["colocated_switches"] >= 2 and summary["borrows"]["roll_on_train"] == 0
    ivs = _device_intervals(trace)
    assert {i.device for i in ivs} == {0, 1, 2}
    wall = max(i.end_s for i in ivs)
    assert check_conservation(ivs, 3, wall, tol=1e-5) == []


@pytest.mark.parametrize("policy", ["one-step-off", "roll-borrow", "train-borrow", "bidirl"])
def test_every_policy_runs_for_real(tmp_path, policy, real_runtime_available):
    """async, sync and bidirl-opportunistic run in the tests above; these are the rest."""
    run = tmp_path / "run"
    # bidirl lends both ways: its weights also move by the collective transport, a delta at a time
    # (the sync group follows each lend and reclaim, runtime/sync_driver.py), and its replicas
    # span two devices (rollout.tensor_parallel_size=2), as does the training unit it lends
    sync = ["rollout.weight_sync=collective", "rollout.weight_sync_delta=true"] if policy == "bidirl" else []
    tp = ["cluster.rollout_devices=2", "cluster.train_devices=2", "rollout.tensor_parallel_size=2",
          "cluster.oversubscribe=true"] if policy == "bidirl" else []
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=3", f"scheduler.policy={policy}",
                  "run.plot=false", "run.tensorboard=false", *sync, *tp)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"], summary["audit"]
    assert sorted(r["group"] for r in _ledger(run)) == list(range(3 * 4))
    if policy in ("roll-borrow", "bidirl"):
        assert any(k.startswith("prewarm.roll_on_train") for k, _ in summary["switches"])
    if tp:  # one 2-device unit a pool: each lendable role measured once; 4 devices' time conserved
        prewarmed = sorted(k for k, _ in summary["switches"] if k.startswith("prewarm."))
        assert prewarmed == ["prewarm.roll_on_train.c_in", "prewarm.roll_on_train.c_out",
                             "prewarm.train_on_roll.c_in", "prewarm.train_on_roll.c_out"], prewarmed
        ivs = _device_intervals(json.loads((run / "trace.json").read_text()))
        assert {i.device for i in ivs} == {0, 1, 2, 3}
        assert check_conservation(ivs, 4, max(i.end_s for i in ivs), tol=1e-5) == []
    if sync:  # every sync recorded; a delta never moves more than a whole send
        ws = summary["weight_sync"]
        assert ws["transport"] == "collective" and ws["delta"] and ws["syncs"] >= 2  # versions 1 and 2
        assert 0 < ws["bytes_moved"] <= ws["full_bytes"]
    # every borrow decision is in admissions.jsonl, and they add up to the summary's counts
    logged = [json.loads(ln) for ln in (run / "admissions.jsonl").read_text().splitlines() if ln]
    counts = {k: v for k, v in summary["admission"].items() if k != "latest"}
    assert len(logged) == sum(counts.values())
    for key, n in counts.items():
        direction, verdict = key.split(".")
        assert sum(1 for d in logged if d["direction"] == direction and d["admit"] == (verdict == "admitted")) == n


def test_a_users_environment_file_trains_with_borrowing(tmp_path, real_runtime_available):
    """docs/environments.md's promise, as a user would run it: ``examples/retry_env.py`` and
    their own veRL-layout parquet, ``bidirl train env.path=... data.files=...`` and nothing
    else about turns.  Validation plays episodes before training too (``run.val_before_train``
    once skipped the multi-turn validator), every trajectory group is trained once, and the
    multi-turn metrics are there."""
    import pandas as pd

    rows = [{"prompt": [{"role": "user", "content": f"Reverse: {w}"}], "data_source": "user",
             "reward_model": {"ground_truth": w[::-1]}, "extra_info": {"index": i}}
            for i, w in enumerate(["abc", "dog", "sun", "map", "cat", "red", "owl", "pin"] * 4)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=3", "scheduler.policy=bidirl",
                  f"env.path={ROOT / 'examples' / 'retry_env.py'}", f"data.files={tmp_path / 'train.parquet'}",
                  f"data.val_files={tmp_path / 'train.parquet'}", "env.max_turns=3",
                  "run.val_before_train=true", "run.val_every=3", "data.val_max_samples=4",
                  "run.plot=false")
    assert out.returncode == 0, out.stderr[-3000:]
    assert_run_sound(run, 3)
    metrics = read_metrics(run)
    vals = [m for m in metrics if "val/score/mean" in m]
    assert [m["step"] for m in vals][:1] == [0], "validated before training"
    assert all("val/multi_turn/turns_mean" in m for m in vals)
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 3 and all(1 <= m["multi_turn/turns_mean"] <= 3 for m in steps)
