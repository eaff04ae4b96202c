"""Helpers for real-runtime tests: a small, fast config and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
         "trainer.micro_batch_size=8", "run.tensorboard=true"]


def bidirl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bidirl.cli", *args]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run(bidirl_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)




def run_script(path: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A test-only driver script (e.g. ``faulty_train.py``) with the CLI's environment."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, path, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)
