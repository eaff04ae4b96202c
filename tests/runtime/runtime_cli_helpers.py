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


def assert_run_sound(run: Path, steps: int, prompts_per_step: int = 4) -> None:
    """What every fault test ends with: the ledger holds every group of ``steps`` steps exactly
    once, the summary's audit agrees, and the final checkpoint's weights are all finite."""
    import json

    import torch
    from safetensors.torch import load_file

    lines = (run / "trained_groups.jsonl").read_text().splitlines()
    groups = sorted(json.loads(ln)["group"] for ln in lines if ln)
    assert groups == list(range(steps * prompts_per_step)), "every group trained exactly once"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit_ok"] and summary["audit"]["groups_expected"] == steps * prompts_per_step, summary["audit"]
    assert summary["audit"]["trained_twice"] == 0 and summary["audit"]["groups_lost"] == 0
    files = sorted((run / "checkpoints" / f"step_{steps}").rglob("*.safetensors"))  # model/ (and trainer/)
    assert files, f"no weights in the final checkpoint step_{steps}"
    for f in files:
        weights = load_file(str(f))
        bad = [k for k, w in weights.items() if w.is_floating_point() and not bool(torch.isfinite(w).all())]
        assert weights and not bad, f"non-finite weights in {f}: {bad[:3]}"
