"""End to end: a reward file that misbehaves cannot poison the model nor stall or end the run.

With ``data.on_bad_reward=zero``, a reward that returns NaN for some responses and hangs once
(abandoned after ``data.reward_timeout_s``) is scored 0 while the run trains to the end,
counts the bad rewards, shows the slow call on the progress line and writes a finite
checkpoint; a reward bad for every response stops the run after its first step with one
line and exit status 2, instead of training on zeros and exiting 0 (the one-line way out
every ``BadRewardError`` takes; what the line says for a NaN under the default ``error``:
``test_reward_call.py``). One run each: a Ray + vLLM start-up is most of a test.
"""

from __future__ import annotations

import json

import pytest
from runtime_cli_helpers import SMALL, assert_run_sound, run_cli

from bidirl.obs.metrics import read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

# Every 5th call returns NaN; the first call (the check before any worker starts) is fine.
REWARD = '''
import os
import time

_calls = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    _calls[0] += 1
    if _calls[0] == 3 and os.environ.get("HANG_ONCE"):
        time.sleep(600)  # far past data.reward_timeout_s
    if _calls[0] % 5 == 0:
        return float("nan")
    return float(solution_str.strip() == str(ground_truth).strip())
'''

ALWAYS_RAISES = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("answer")
'''

ARGS = [*SMALL, "run.steps=3", "scheduler.policy=async", "cluster.prewarm=false", "run.plot=false",
        "run.tensorboard=false"]


def test_nan_and_hung_rewards_scored_zero_keep_the_model_finite(tmp_path, real_runtime_available, monkeypatch):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(REWARD)
    run = tmp_path / "run"
    monkeypatch.setenv("HANG_ONCE", "1")
    out = run_cli("train", "--run-dir", str(run), *ARGS, f"data.reward_fn={reward}", "data.on_bad_reward=zero",
                  "data.reward_timeout_s=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "nan_reward.py:compute_score did not return within 2 s (data.reward_timeout_s=2" in out.stderr
    assert "slow rewards 1" in out.stdout + out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit_ok"] and summary["audit"]["groups_trained"] == 3 * 4
    steps = [m for m in read_metrics(run) if "reward/mean" in m]
    assert len(steps) == 3 and all("reward/bad_count" in m for m in steps)
    total = sum(m["reward/bad_count"] for m in steps)
    assert total > 0 and summary["reward_bad_count"] == total
    assert summary["skipped_steps"] == 0, "the bad rewards were scored 0: nothing non-finite reached the trainer"
    assert_run_sound(run, 3)  # every group once, the final weights finite
    assert "scored 0" in out.stderr


def test_every_reward_bad_under_zero_is_an_error_not_a_run_on_zeros(tmp_path, real_runtime_available):
    reward = tmp_path / "raises.py"
    reward.write_text(ALWAYS_RAISES)
    out = run_cli("train", "--run-dir", str(tmp_path / "run"), *ARGS, f"data.reward_fn={reward}",
                  "data.on_bad_reward=zero")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("bidirl train: error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert "every reward of the first training step was bad" in errors[0]
    assert "raises.py:compute_score raised KeyError: 'answer'" in errors[0]
