"""vLLM on real architectures built locally: the prompt sizes and weight syncs real runs have.

- 86 seeded requests of 48-token prompts are more than a CPU step's 4096-token budget: with
  chunked prefill one prompt was split across two steps and vLLM's rewind of its seeded
  generator died (``CPU Generator does not use offset``); now every prompt fits one step.
- A weight sync into a tied model (Qwen2.5-shaped: ``lm_head`` is ``embed_tokens``, the
  trainer ships the embedding alone) and an untied one (Llama-shaped) leaves vLLM computing
  exactly what the HF model with those weights computes.
- The head sizes ``model_check.cpu_head_sizes`` reads (``prepare.check_model_shape``) are vLLM's own.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("vllm")

from bidirl.engines.hf_reference import load_reference, score_tokens  # noqa: E402
from bidirl.runtime.messages import ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = pytest.mark.vllm


def _finish(role):
    done = []
    while role.running:
        done += role.run(10.0, stop_on_finish=False)["finished"]
    return sorted(done, key=lambda r: (r.group_id, r.index))


def test_cpu_head_sizes_are_vllms():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from bidirl.runtime.model_check import cpu_head_sizes

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == cpu_head_sizes()


@pytest.fixture(scope="module")
def qwen_role(qwen_dir):
    r = RolloutRole(str(qwen_dir), max_model_len=128, kv_cache_bytes=32 << 20)
    yield r
    r.release()


def test_seeded_prompts_beyond_one_steps_token_budget_all_finish(qwen_role):
    sched = qwen_role._engine.vllm_config.scheduler_config
    n, length = 86, 48
    assert n * length > sched.max_num_batched_tokens, "more prompt tokens than one step takes"
    rng = random.Random(0)
    qwen_role.submit([ResponseRequest(g, 0, [rng.randint(10, 4000) for _ in range(length)], 8, 1.0, seed=g)
                      for g in range(n)])
    done = _finish(qwen_role)
    assert [r.group_id for r in done] == list(range(n)) and all(r.finished for r in done)
    assert len({tuple(r.token_ids) for r in done}) > n // 2


@pytest.mark.parametrize("which", ["qwen", "llama"])
def test_weight_sync_matches_hf(which, request, qwen_role):
    """The trainer's parameters (for a tied model: no ``lm_head.weight``) pushed into vLLM."""
    from bidirl.engines.trainer_torch import TorchTrainer

    model_dir = request.getfixturevalue(f"{which}_dir")
    trainer = TorchTrainer(model_dir)
    rng = np.random.default_rng(1)
    weights = {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32)
               for k, v in trainer.get_weights_numpy().items()}
    assert ("lm_head.weight" in weights) == (which == "llama")
    reference = load_reference(model_dir, weights)
    if which == "qwen":  # the embedding's new values are the tied head's too
        assert np.array_equal(reference.lm_head.weight.detach().numpy(), weights["model.embed_tokens.weight"])
    role = qwen_role if which == "qwen" else RolloutRole(str(model_dir), max_model_len=128,
                                                         kv_cache_bytes=32 << 20)
    try:
        prompt = [int(x) for x in rng.integers(10, 4000, 30)]
        role.submit([ResponseRequest(0, 0, prompt, 20, temperature=0.0)])
        (before,) = _finish(role)
        role.update_weights(weights, version=1)
        role.submit([ResponseRequest(1, 0, prompt, 20, temperature=0.0)])
        (after,) = _finish(role)
    finally:
        if role is not qwen_role:
            role.release()
    forced, argmax = score_tokens(reference, prompt, after.token_ids)
    assert set(after.versions) == {1} and after.token_ids == argmax != before.token_ids
    assert np.abs(forced - np.array(after.logprobs)).max() <= 1e-3
