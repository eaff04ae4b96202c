"""Streaming vLLM engine (``AsyncLLM``, one EngineCore subprocess): abort, resume, live updates."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("vllm")

from bidirl.engines.base import GenerationRequest, StreamingRolloutEngine, continuation  # noqa: E402
from bidirl.engines.trainer_torch import TorchTrainer, TrainSample  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]


async def _stream_until(engine, req, n_tokens):
    got = []

    async def consume():
        async for snapshot in engine.stream(req):
            got.append(snapshot)

    task = asyncio.create_task(consume())
    while not got or len(got[-1].token_ids) < n_tokens:
        assert not task.done(), "request finished before the interruption point"
        await asyncio.sleep(0.001)
    return task, got


async def _scenario(model_dir):
    from bidirl.engines.vllm_engine import AsyncVLLMEngine

    trainer = TorchTrainer(model_dir)
    engine = AsyncVLLMEngine(model_dir)
    try:
        assert isinstance(engine, StreamingRolloutEngine)

        # abort mid-generation returns a partial prefix; resuming it reproduces greedy output
        req = GenerationRequest("a", PROMPT, 300, temperature=0.0, stop_token_ids=())
        (full,) = await engine.generate([req])
        assert full.finished and len(full.token_ids) == 300
        task, got = await _stream_until(engine, req, 40)
        (partial,) = await engine.abort(["a"])
        await task
        assert partial.finish_reason == "abort" and not partial.finished and 40 <= len(partial.token_ids) < 300
        assert got[-1].finish_reason == "abort" and got[-1].token_ids == partial.token_ids
        assert partial.token_ids == full.token_ids[: len(partial.token_ids)]
        (resumed,) = await engine.generate([continuation(req, partial)])
        assert resumed.token_ids == full.token_ids
        assert np.abs(np.array(resumed.logprobs) - full.logprobs).max() < 1e-4

        # a weight update with a request in flight: tokens are tagged by the weights that made them
        rng = np.random.default_rng(0)
        new = {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32) for k, v in trainer.get_weights_numpy().items()}
        req = GenerationRequest("u", PROMPT, 300, temperature=1.0, seed=3, stop_token_ids=())
        task, got = await _stream_until(engine, req, 30)
        await engine.update_weights(new, version=1)
        await task
        result = got[-1]
        assert result.finished and len(result.token_ids) == 300 and engine.version == 1
        v = np.array(result.versions)
        assert (v == 0).sum() >= 30 and (v == 1).sum() >= 1 and np.all(np.diff(v) >= 0)
        lp = np.array(result.logprobs)
        sample = [TrainSample(PROMPT, result.token_ids, result.logprobs, 0.0)]
        old_forced = trainer.compute_logprobs(sample)[0]
        trainer.set_weights_numpy(new)
        new_forced = trainer.compute_logprobs(sample)[0]
        assert np.abs(old_forced[v == 0] - lp[v == 0]).max() <= 1e-3
        assert np.abs(new_forced[v == 1] - lp[v == 1]).max() <= 1e-3
    finally:
        await engine.close()


def test_async_abort_resume_and_live_update(tiny_model_dir):
    asyncio.run(_scenario(tiny_model_dir))
