"""End to end: ``bidirl train`` on veRL-layout rows whose prompts are ~150 tokens.

Before prompt lengths were measured, vLLM's ``max_model_len`` came from the length of a
mapping (2) and every run was capped at ``2*4 + max_new_tokens + 64`` tokens: these rows
failed after the whole start-up.  Now the context is the longest prompt + the new tokens.
"""

from __future__ import annotations

import json
import random

import pytest
from runtime_cli_helpers import SMALL, run_cli

from bidirl.algo.data import save_dataset

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


def _rows(n: int, seed: int = 0) -> list[dict]:
    """'copy' rows with a system turn: ~150 tokens with the tiny model's character tokenizer."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        answer = str(rng.randint(10, 9999))
        system = ("You are a careful assistant. Repeat the number the user gives, digit for digit. " * 2)
        system = system[:rng.randint(125, 145)]
        rows.append({"prompt": [{"role": "system", "content": system},
                                {"role": "user", "content": f"copy {answer}"}],
                     "data_source": "copy", "reward_model": {"ground_truth": answer},
                     "extra_info": {"index": i}})
    return rows


def test_train_runs_on_prompts_longer_than_the_old_cap(tmp_path, real_runtime_available):
    data = save_dataset(_rows(32), tmp_path / "train.jsonl")
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=2", f"data.files={data}",
                  "scheduler.policy=sync", "cluster.prewarm=false", "run.plot=false",
                  "run.tensorboard=false")
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("[bidirl] prompts:"))
    longest = int(line.split("longest ")[1].split()[0])
    assert 145 <= longest <= 165 and f"max_model_len {longest + 8}" in line, line
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"] and summary["steps"] == 2
