"""Reference HF engines: log-probs, seeding, stop handling, abort/resume and versioned updates."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bidirl.engines.base import (
    GenerationRequest,
    RolloutEngine,
    StreamingRolloutEngine,
    continuation,
)
from bidirl.engines.hf_engine import AsyncHFEngine, HFEngine
from bidirl.engines.trainer_torch import TorchTrainer, TrainSample

PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]  # <|bos|><|user|>copy 4821<|assistant|>


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(tiny_model_dir, seed=0)


def _perturbed(weights, scale=0.05):
    rng = np.random.default_rng(0)
    return {k: v + rng.normal(0, scale, v.shape).astype(np.float32) for k, v in weights.items()}


def test_protocols(engine, tiny_model_dir):
    assert isinstance(engine, RolloutEngine)
    assert isinstance(AsyncHFEngine(tiny_model_dir), StreamingRolloutEngine)


def test_logprobs_match_teacher_forcing(engine, tiny_model_dir):
    reqs = [GenerationRequest(f"r{i}", PROMPT, 24, temperature=1.0, seed=i) for i in range(4)]
    results = engine.generate(reqs)
    trainer = TorchTrainer(tiny_model_dir)
    forced = trainer.compute_logprobs([TrainSample(PROMPT, r.token_ids, r.logprobs, 0.0) for r in results])
    for r, lp in zip(results, forced):
        assert r.finished and r.finish_reason in ("stop", "length")
        assert len(r.token_ids) == len(r.logprobs) == len(r.versions) and set(r.versions) == {0}
        assert np.abs(lp - np.array(r.logprobs)).max() < 1e-5


def test_seeded_sampling_is_reproducible(engine):
    req = GenerationRequest("s", PROMPT, 20, temperature=1.0, seed=7)
    a, b = engine.generate([req, req])
    c = engine.generate([GenerationRequest("s", PROMPT, 20, temperature=1.0, seed=8)])[0]
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_stop_tokens_budget_and_trivial_requests(engine):
    greedy = engine.generate([GenerationRequest("g", PROMPT, 12, temperature=0.0, stop_token_ids=())])[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12
    stop_at = greedy.token_ids[3]
    first = greedy.token_ids.index(stop_at)
    stopped = engine.generate([GenerationRequest("g", PROMPT, 12, temperature=0.0, stop_token_ids=[stop_at])])[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy.token_ids[: first + 1]
    # nothing left to do: no budget, or the prefix already ends in a stop token
    done = engine.generate([continuation(GenerationRequest("g", PROMPT, 12, stop_token_ids=[stop_at]), stopped)])[0]
    assert done.finished and done.finish_reason == "stop" and done.token_ids == stopped.token_ids
    zero = engine.generate([GenerationRequest("z", PROMPT, 0)])[0]
    assert zero.finished and zero.finish_reason == "length" and zero.token_ids == []


def test_sync_prefix_resume_equals_uninterrupted(engine):
    req = GenerationRequest("p", PROMPT, 30, temperature=0.0, stop_token_ids=())
    full = engine.generate([req])[0]
    partial = type(full)("p", full.token_ids[:11], full.logprobs[:11], full.versions[:11], False, "abort", 0)
    resumed = engine.generate([continuation(req, partial)])[0]
    assert resumed.num_prefix_tokens == 11 and resumed.num_new_tokens == 19
    assert resumed.token_ids == full.token_ids
    assert np.allclose(resumed.logprobs, full.logprobs, atol=1e-5)


def test_request_validation():
    with pytest.raises(ValueError, match="prefix has 1 tokens"):
        GenerationRequest("x", PROMPT, 5, prefix_token_ids=[3])
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationRequest("x", PROMPT, -1)
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        GenerationRequest("x", [], 5)


async def _stream_until(engine, req, n_tokens):
    got = []

    async def consume():
        async for snapshot in engine.stream(req):
            got.append(snapshot)

    task = asyncio.create_task(consume())
    while not got or len(got[-1].token_ids) < n_tokens:
        await asyncio.sleep(0)
    return task, got


def test_async_abort_then_resume_matches_uninterrupted(tiny_model_dir):
    async def main():
        eng = AsyncHFEngine(tiny_model_dir)
        req = GenerationRequest("a", PROMPT, 40, temperature=0.0, stop_token_ids=())
        (full,) = await eng.generate([req])
        task, got = await _stream_until(eng, req, 15)
        (partial,) = await eng.abort(["a"])
        await task
        assert partial.finish_reason == "abort" and not partial.finished
        assert got[-1].finish_reason == "abort" and got[-1].token_ids == partial.token_ids
        assert 15 <= len(partial.token_ids) < 40
        assert partial.token_ids == full.token_ids[: len(partial.token_ids)]
        (resumed,) = await eng.generate([continuation(req, partial)])
        assert resumed.token_ids == full.token_ids and resumed.finished
        assert await eng.abort(["a", "unknown"]) == []  # finished/unknown ids are skipped

    asyncio.run(main())


def test_async_update_mid_flight_tags_versions(tiny_model_dir):
    async def main():
        eng = AsyncHFEngine(tiny_model_dir)
        trainer = TorchTrainer(tiny_model_dir)
        new = _perturbed(trainer.get_weights_numpy())
        req = GenerationRequest("u", PROMPT, 40, temperature=1.0, seed=1, stop_token_ids=())
        task, got = await _stream_until(eng, req, 10)
        await eng.update_weights(new, version=1)
        await task
        result = got[-1]
        assert result.finished and eng.version == 1
        v = np.array(result.versions)
        assert (v == 0).sum() >= 10 and (v == 1).sum() >= 1 and np.all(np.diff(v) >= 0)
        old_lp = trainer.compute_logprobs([TrainSample(PROMPT, result.token_ids, result.logprobs, 0.0)])[0]
        trainer.set_weights_numpy(new)
        new_lp = trainer.compute_logprobs([TrainSample(PROMPT, result.token_ids, result.logprobs, 0.0)])[0]
        lp = np.array(result.logprobs)
        assert np.abs(old_lp[v == 0] - lp[v == 0]).max() < 1e-5
        assert np.abs(new_lp[v == 1] - lp[v == 1]).max() < 1e-5

    asyncio.run(main())


def test_update_weights_changes_greedy_output(tiny_model_dir):
    eng = HFEngine(tiny_model_dir)
    req = GenerationRequest("w", PROMPT, 20, temperature=0.0, stop_token_ids=())
    before = eng.generate([req])[0]
    eng.update_weights(_perturbed(TorchTrainer(tiny_model_dir).get_weights_numpy()), version=3)
    after = eng.generate([req])[0]
    assert after.token_ids != before.token_ids and set(after.versions) == {3}
    with pytest.raises(KeyError, match="unknown parameter"):
        eng.update_weights({"nope": np.zeros(1, np.float32)}, 4)
