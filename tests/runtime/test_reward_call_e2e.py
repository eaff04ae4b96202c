"""End to end: the guarded reward call in a real run (Ray, vLLM, the trainer).

A reward that hangs once is abandoned after ``data.reward_timeout_s`` and, under
``data.on_bad_reward=zero``, scored 0 while the run trains to the end, the slow call on the
progress line; a reward bad for every response stops the run after its first step with one
bidirl line and exit status 2, instead of training on zeros and exiting 0.
"""

from __future__ import annotations

import json

import pytest
from runtime_cli_helpers import SMALL, assert_run_sound, run_cli

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ARGS = [*SMALL, "run.steps=2", "scheduler.policy=async", "cluster.prewarm=false", "run.plot=false",
        "run.tensorboard=false", "model.warm_start_steps=0"]

# The 3rd call (the first is the check before any worker starts) hangs far past the limit.
HANGS_ONCE = '''
import time

_calls = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    _calls[0] += 1
    if _calls[0] == 3:
        time.sleep(600)
    return float(solution_str.strip() == str(ground_truth).strip())
'''

ALWAYS_RAISES = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("answer")
'''


def test_a_hung_reward_is_abandoned_and_the_run_goes_on(tmp_path, real_runtime_available):
    reward = tmp_path / "hangs.py"
    reward.write_text(HANGS_ONCE)
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *ARGS, f"data.reward_fn={reward}", "data.on_bad_reward=zero",
                  "data.reward_timeout_s=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "hangs.py:compute_score did not return within 2 s (data.reward_timeout_s=2" in out.stderr
    assert "slow rewards 1" in out.stdout + out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reward_bad_count"] == 1
    assert_run_sound(run, 2)


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
