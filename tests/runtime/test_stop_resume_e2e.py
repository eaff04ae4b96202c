"""End to end: graceful stops and resumes you can trust, with real vLLM, Ray and torch.

A SIGTERM or SIGINT to the driver mid-run stops it at the next step boundary with a
checkpoint of that boundary, the summary, the trace and the timeline, status 128 + the
signal; ``--resume`` then trains every group exactly once.  A finished run is reported
finished, a changed ledger-relevant field is refused, and a damaged newest checkpoint (random
bytes in the middle of its weights: caught by its manifest's sha256) is marked and passed
over for the older one.  Each run here costs about half a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from runtime_cli_helpers import ROOT, SMALL, assert_run_sound, bidirl_cmd, run_cli

from bidirl.obs.metrics import read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ARGS = [*SMALL, "scheduler.policy=async", "scheduler.staleness=2", "cluster.prewarm=false",
        "run.tensorboard=false"]
PPS = 4  # SMALL's rollout.prompts_per_step


def _groups(run) -> list[int]:
    lines = (run / "trained_groups.jsonl").read_text().splitlines()
    return sorted(json.loads(ln)["group"] for ln in lines if ln)


def _reward_steps(run) -> list[int]:
    return [m["step"] for m in read_metrics(run) if "reward/mean" in m]


def _stop_with(sig, cmd: list[str], run, err_path, after_steps: int) -> tuple[int, str]:
    """Start ``cmd``, send ``sig`` to the driver once ``after_steps`` steps have metrics, and
    return (exit status, stderr)."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    with err_path.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        try:
            deadline = time.time() + 400
            while time.time() < deadline and proc.poll() is None:
                if (run / "metrics.jsonl").is_file() and len(_reward_steps(run)) >= after_steps:
                    break
                time.sleep(0.2)
            assert proc.poll() is None, "run ended before the signal: " + err_path.read_text()[-2000:]
            proc.send_signal(sig)  # the driver only, as a process manager (or Ctrl-C's SIGINT) would
            proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    return proc.returncode, err_path.read_text()


def _check_stopped(run, sig, status: int, stderr: str, after: int, steps: int) -> int:
    """What a stop by ``sig`` leaves (status, last line, checkpoint, summary, trace, ledger);
    returns the boundary it stopped at, at least ``after``."""
    assert status == 128 + sig, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    m = re.fullmatch(rf"\[bidirl\] stopped at step (\d+) by {sig.name}; resume with: bidirl train --resume {run}",
                     last)
    assert m, last
    k = int(m.group(1))
    assert after <= k < steps
    assert (run / "checkpoints" / f"step_{k}" / "COMPLETE").is_file(), "the boundary's checkpoint"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["by"] == sig.name and summary["stopped"]["at_step"] == k
    assert summary["audit"]["ok"], summary["audit"]
    assert (run / "trace.json").is_file() and (run / "timeline.png").is_file()
    assert _groups(run) == list(range(k * PPS)), "the ledger ends at the boundary"
    assert _reward_steps(run) == list(range(k)), "each step's metrics once"
    return k


def test_a_signal_stops_at_a_step_boundary_and_resume_trains_each_group_once(tmp_path, real_runtime_available):
    """SIGTERM stops the run at a boundary, and its resume completes it: every group trained
    exactly once.  (SIGINT takes the same path: ``test_exits.py`` checks its handler and line;
    a stopped resume once ran here too, a third run of ~45 s.)"""
    run, steps = tmp_path / "run", 6
    args = ["train", "--run-dir", str(run), *ARGS, f"run.steps={steps}", "run.checkpoint_every=0"]
    status, stderr = _stop_with(signal.SIGTERM, bidirl_cmd(*args), run, tmp_path / "stderr1.txt", after_steps=2)
    k = _check_stopped(run, signal.SIGTERM, status, stderr, 2, steps)

    out = run_cli("train", "--resume", str(run))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming from {run / 'checkpoints' / f'step_{k}'} at step {k}" in out.stderr
    assert _groups(run) == list(range(steps * PPS)), "no group lost, none trained twice"
    assert _reward_steps(run) == list(range(steps)), "each step's metrics once"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["segment_steps"]) == (steps, steps - k), "the run's steps, and this segment's"
    assert_run_sound(run, steps, PPS)


def test_finished_run_changed_config_and_damaged_checkpoint(tmp_path, real_runtime_available):
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *ARGS, "run.steps=3", "run.checkpoint_every=1", "run.plot=false")
    assert out.returncode == 0, out.stderr[-3000:]
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_2", "step_3"]

    out = run_cli("train", "--resume", str(run))
    assert out.returncode == 0 and "this run is finished (3 steps" in out.stderr, out.stderr[-3000:]
    assert "workers up" not in out.stderr, "nothing started"

    out = run_cli("train", "--resume", str(run), "run.steps=4", "rollout.group_size=8", "trainer.lr=5e-4")
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("bidirl train: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert "rollout.group_size is 4" in errors[0] and "Traceback" not in out.stderr
    assert not (run / "resume_changes.jsonl").exists(), "a refused resume records nothing"

    # random bytes into the middle of the newest weights: sizes, header and markers intact
    weights = ckpts / "step_3" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = os.urandom(64)
    weights.write_bytes(bytes(data))
    out = run_cli("train", "--resume", str(run), "run.steps=4", "trainer.lr=5e-4")  # a change it allows
    assert out.returncode == 0, out.stderr[-3000:]
    damaged = [ln for ln in out.stderr.splitlines() if "is unusable" in ln]
    assert damaged == [f"[bidirl] checkpoint {ckpts / 'step_3'} is unusable (model/model.safetensors: content "
                       "differs from MANIFEST.json (sha256 mismatch: changed after it was written)), marked DAMAGED; "
                       f"falling back to {ckpts / 'step_2'}, the newest usable checkpoint"], out.stderr[-3000:]
    assert f"resuming from {ckpts / 'step_2'} at step 2" in out.stderr
    changes = [json.loads(ln) for ln in (run / "resume_changes.jsonl").read_text().splitlines()]
    assert [(c["step"], c["field"], c["new"]) for c in changes] == [(2, "run.steps", 4), (2, "trainer.lr", 5e-4)]
    assert _groups(run) == list(range(4 * PPS)), "no group lost, none trained twice"
    assert _reward_steps(run) == [0, 1, 2, 3]
    assert (ckpts / "step_4" / "COMPLETE").is_file()
    assert_run_sound(run, 4, PPS)


def test_nonfinite_step_stop_checkpoints_its_boundary_and_resume_completes(tmp_path, real_runtime_available):
    """NaN advantages from step 2 on (``nonfinite_train.py``): ``trainer.on_nonfinite=stop`` ends the
    run with one line and status 2, the checkpoint of step 2 written (the weights the last good
    ones, the failed step's groups still buffered); the resume with ``skip`` trains every group once."""
    from runtime_cli_helpers import run_script

    run = tmp_path / "run"
    out = run_script("tests/runtime/nonfinite_train.py", "2", "--run-dir", str(run), *ARGS, "run.steps=4",
                     "run.checkpoint_every=0", "trainer.on_nonfinite=stop")
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("bidirl train: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert "non-finite" in errors[0] and "checkpoint of step 2 written" in errors[0], errors[0]
    assert f"--resume {run}" in errors[0] and "Traceback" not in out.stderr
    state = json.loads((run / "checkpoints" / "step_2" / "state.json").read_text())
    buffered = {g["group_id"] for g in state["store"]["groups"]}
    assert set(range(2 * PPS, 3 * PPS)) <= buffered, "the failed step's groups are in the checkpoint"
    assert _groups(run) == list(range(2 * PPS))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["by"] == "nonfinite_step" and summary["audit"]["ok"]
    assert (run / "trace.json").is_file()

    out = run_cli("train", "--resume", str(run), "trainer.on_nonfinite=skip")
    assert out.returncode == 0, out.stderr[-3000:]
    assert _groups(run) == list(range(4 * PPS)), "no group lost, none trained twice"
    assert _reward_steps(run) == [0, 1, 2, 3]
    assert_run_sound(run, 4, PPS)
