"""Reproducible mode: the final weights are bitwise the same whatever the policy borrows.

``scheduler.reproducible=true`` generates batch b at exactly version max(0, b - s), moves
weights only at batch boundaries and restarts an interrupted response from its own seed
(``policy/reproducible.py``).  ``async`` on one rollout replica (no borrowing) and
``bidirl-opportunistic`` on two (the bidirl scheduler lending every idle device, both
directions: borrowed replicas reclaimed mid-generation, auxiliary trainers computing
chunks, replicas coming home having missed a sync) must then end with the same weights,
bit for bit, over 20 steps, with validations interrupting generation on the way.  With LoRA
(``model.lora_rank``) too: only the adapters cross, and the replicas merge them alike; and
with a sharded primary (fsdp2 over two ranks); these two over 8 steps (the suite's time),
which borrow both ways as the 20 do.
"""

from __future__ import annotations

import json

import pytest
from runtime_cli_helpers import run_cli

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ARGS = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
        "trainer.micro_batch_size=4", "run.val_every=5", "run.plot=false",
        "run.tensorboard=false", "scheduler.reproducible=true", "run.checkpoint_every=0"]


def _weights(run, steps: int):
    from safetensors.numpy import load_file

    files = sorted((run / "checkpoints" / f"step_{steps}" / "model").glob("*.safetensors"))
    assert files, f"no final weights in {run}"
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize(("trainer", "steps"), [([], 20), (["model.lora_rank=8", "trainer.lr=5e-3"], 8),
                                                (["trainer.strategy=fsdp2", "cluster.train_devices=2"], 8)],
                         ids=["one-trainer", "lora", "fsdp2-two-ranks"])
def test_async_and_bidirl_end_bitwise_equal(tmp_path, trainer, steps):
    """LoRA: the adapters alone are trained, merged and compared.  fsdp2 over two ranks: the
    primary's shards take the auxiliaries' gradients (micro-batch i folded on rank i % 2,
    whoever computed it) and its checkpoint is sharded; the model directory compared is rank
    0's gathered weights."""
    import numpy as np

    runs = {}
    for policy, replicas in (("async", 1), ("bidirl-opportunistic", 2)):
        run = tmp_path / policy
        out = run_cli("train", "--run-dir", str(run), *ARGS, *trainer, f"run.steps={steps}",
                      f"scheduler.policy={policy}", f"cluster.rollout_devices={replicas}", "cluster.oversubscribe=true")
        assert out.returncode == 0, out.stderr[-3000:]
        runs[policy] = (json.loads((run / "summary.json").read_text()), _weights(run, steps))
    (s_async, w_async), (s_bidirl, w_bidirl) = runs["async"], runs["bidirl-opportunistic"]
    assert s_async["borrows"] == {"roll_on_train": 0, "train_on_roll": 0}
    assert s_bidirl["borrows"]["roll_on_train"] >= 1 and s_bidirl["borrows"]["train_on_roll"] >= 1, \
        s_bidirl["borrows"]
    assert s_async["audit_ok"] and s_bidirl["audit_ok"]
    assert w_async.keys() == w_bidirl.keys()
    if "model.lora_rank=8" in trainer:  # the checkpoint holds the adapters alone
        assert all(".lora_A." in k or ".lora_B." in k for k in w_async)
    differ = [k for k in w_async if not np.array_equal(w_async[k], w_bidirl[k])]
    assert not differ, f"weights differ: {differ[:5]}"
    assert s_async["rewards"] == s_bidirl["rewards"]  # every step trained the same samples

