"""A tensor-parallel rollout replica (``rollout.tensor_parallel_size=2``) against HF.

The engine's two shards run in vLLM's own worker processes; what the runtime relies on must
hold as for a one-device replica (``test_rollout_role.py``): greedy tokens are the HF
reference's argmaxes and behaviour log-probs its teacher-forced ones, a reclaimed response
resumes exactly from its prefix, a weight update reaches both shards, and releasing the
role stops the shards' processes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("vllm")

from bidirl.engines.hf_reference import load_reference, score_tokens  # noqa: E402
from bidirl.runtime.messages import ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]  # <|bos|><|user|>copy 4821<|assistant|>


def _children() -> set[int]:
    """This process's child processes that vLLM's multiprocessing starts (its shard workers;
    not Python's own resource tracker, which lives as long as this process)."""
    out = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            out |= {int(p) for p in f.read().split()}
    return {p for p in out if b"resource_tracker" not in _cmdline(p)}


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _finish(role):
    done = []
    while role.running:
        done += role.run(10.0, stop_on_finish=False)["finished"]
    return sorted(done, key=lambda r: (r.group_id, r.index))


def test_a_two_way_replica_generates_resumes_and_reloads_as_hf(tiny_model_dir):
    reference = load_reference(tiny_model_dir)
    before = _children()
    role = RolloutRole(tiny_model_dir, max_model_len=512, kv_cache_bytes=64 << 20, tensor_parallel_size=2)
    try:
        assert len(_children() - before) >= 2, "one worker process a shard"
        role.submit([ResponseRequest(1, 0, PROMPT, 60, temperature=0.0)])
        (full,) = _finish(role)
        forced, argmax = score_tokens(reference, PROMPT, full.token_ids)
        assert full.token_ids == argmax and len(full.token_ids) == 60
        assert np.abs(forced - np.array(full.logprobs)).max() <= 1e-3

        # a reclaim mid-response: the partial resumes from its prefix to the same tokens
        role.submit([ResponseRequest(2, 0, PROMPT, 60, temperature=0.0)])
        while not role.snapshot() or len(role.snapshot()[0].token_ids) < 30:
            role.poll(0.002)
        (partial,) = role.abort_all()
        assert 30 <= len(partial.token_ids) < 60 and partial.token_ids == full.token_ids[:len(partial.token_ids)]
        role.submit([partial.as_request()])
        (resumed,) = _finish(role)
        assert resumed.token_ids == full.token_ids

        # new weights reach both shards: greedy follows the new model, log-probs are its own
        rng = np.random.default_rng(0)
        new = {k: v.detach().numpy() + rng.normal(0, 0.05, tuple(v.shape)).astype(np.float32)
               for k, v in reference.named_parameters()}
        new_reference = load_reference(tiny_model_dir, new)
        role.update_weights(new, version=1)
        role.submit([ResponseRequest(3, 0, PROMPT, 40, temperature=0.0)])
        (after,) = _finish(role)
        forced, new_argmax = score_tokens(new_reference, PROMPT, after.token_ids)
        assert set(after.versions) == {1} and after.token_ids == new_argmax != full.token_ids[:40]
        assert np.abs(forced - np.array(after.logprobs)).max() <= 1e-3
    finally:
        shards = _children() - before
        role.release()
    alive = [p for p in shards if _cmdline(p)]  # a zombie's command line reads empty
    assert not alive, f"the shards' processes outlived the role: {alive}"
