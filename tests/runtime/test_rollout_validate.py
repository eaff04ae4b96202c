"""``RolloutRole.validate``: greedy answers of the current weights, with training requests in flight.

The HF model on the same weights is the reference: a greedy validation response is its
argmax sequence, and a greedy training response interrupted by a validation comes out
equal to the uninterrupted one, every token still tagged with the engine's version.
``rollout.top_k`` and ``rollout.min_new_tokens`` reach vLLM's sampling parameters.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from bidirl.engines.hf_reference import load_reference, score_tokens  # noqa: E402
from bidirl.runtime.messages import ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = pytest.mark.vllm


def test_validation_is_greedy_and_leaves_live_requests_alone(tiny_model_dir):
    from bidirl.models.tiny import encode_prompt, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    copy, add = (encode_prompt(tok, [{"role": "user", "content": t}]) for t in ("copy 4821", "add 2+3"))
    reference = load_reference(tiny_model_dir)
    role = RolloutRole(tiny_model_dir, max_model_len=512, kv_cache_bytes=64 << 20)
    try:
        role.submit([ResponseRequest(1, 0, copy, 120, temperature=0.0)])
        while role.running:
            uninterrupted = role.run(10.0, stop_on_finish=False)["finished"]
        role.submit([ResponseRequest(2, 0, copy, 120, temperature=0.0)])
        role.run(0.0)  # a few tokens in
        out = role.validate([add, copy], max_new_tokens=24, temperature=0.0)
        assert out["version"] == 0 and len(out["responses"]) == 2 and out["seconds"] >= 0
        for prompt, ids in zip((add, copy), out["responses"], strict=True):
            assert 1 <= len(ids) <= 24
            _, argmax = score_tokens(reference, prompt, ids)
            assert ids == argmax, "greedy: every token is the reference's argmax"
        assert role.running == 1, "the training request is back in the engine"
        done = []
        while role.running:
            done += role.run(10.0, stop_on_finish=False)["finished"]
        (resumed,) = done
        assert resumed.token_ids == uninterrupted[0].token_ids and set(resumed.versions) == {0}
        assert resumed.finished and len(resumed.logprobs) == len(resumed.token_ids)
        # rollout.top_k reaches vLLM: top_k=1 samples the argmax even at temperature 1
        role.sampling.top_k = 1
        role.submit([ResponseRequest(3, 0, add, 16, temperature=1.0, seed=5)])
        done = []
        while role.running:
            done += role.run(10.0, stop_on_finish=False)["finished"]
        _, argmax = score_tokens(reference, add, done[0].token_ids)
        assert done[0].token_ids == argmax
        # rollout.min_new_tokens reaches vLLM: EOS is masked until the cap, so every response
        # runs to it and no EOS appears; the same seeds without it end some responses early.
        def sample(first_id: int) -> list:
            role.submit([ResponseRequest(first_id + i, 0, add, 120, temperature=2.0, seed=i) for i in range(16)])
            done = []
            while role.running:
                done += role.run(10.0, stop_on_finish=False)["finished"]
            return done

        role.sampling.top_k = -1
        free = sample(10)
        assert any(len(r.token_ids) < 120 and r.token_ids[-1] == tok.eos_token_id for r in free)
        role.sampling.min_tokens = 120
        forced = sample(30)
        assert [len(r.token_ids) for r in forced] == [120] * 16
        assert all(tok.eos_token_id not in r.token_ids for r in forced)
    finally:
        role.release()
