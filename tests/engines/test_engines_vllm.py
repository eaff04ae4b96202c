"""vLLM rollout engine (in-process ``LLM``) on the tiny model, checked against torch.

vLLM changes process-wide settings when it starts (thread-count hook, torch.compile off,
environment variables); the engine is built once per module.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("vllm")

from bidirl.engines.base import GenerationRequest, RolloutEngine, continuation  # noqa: E402
from bidirl.engines.hf_engine import HFEngine  # noqa: E402
from bidirl.engines.trainer_torch import TorchTrainer, TrainSample  # noqa: E402

pytestmark = pytest.mark.vllm
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return TorchTrainer(tiny_model_dir)  # before vLLM: it hooks torch.set_num_threads


@pytest.fixture(scope="module")
def engine(tiny_model_dir, trainer):
    from bidirl.engines.vllm_engine import VLLMEngine

    eng = VLLMEngine(tiny_model_dir)
    yield eng
    eng.close()


def test_loads_and_satisfies_protocol(engine):
    assert isinstance(engine, RolloutEngine) and engine.version == 0


def test_sampled_logprobs_match_torch(engine, trainer):
    reqs = [GenerationRequest(f"r{i}", PROMPT, 48, temperature=1.0, seed=i) for i in range(16)]
    results = engine.generate(reqs)
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    forced = trainer.compute_logprobs([TrainSample(PROMPT, r.token_ids, r.logprobs, 0.0) for r in results])
    worst = max(np.abs(lp - np.array(r.logprobs)).max() for r, lp in zip(results, forced))
    assert worst <= 1e-3, worst
    assert all(len(r.token_ids) == len(r.logprobs) == len(r.versions) for r in results)
    assert len({tuple(r.token_ids) for r in results}) > 1  # seeds differ -> samples differ


def test_greedy_matches_hf_and_prefix_resume(engine, tiny_model_dir):
    req = GenerationRequest("g", PROMPT, 40, temperature=0.0, stop_token_ids=())
    ours = engine.generate([req])[0]
    reference = HFEngine(tiny_model_dir).generate([req])[0]
    assert ours.token_ids == reference.token_ids
    assert np.abs(np.array(ours.logprobs) - reference.logprobs).max() < 1e-3
    partial = type(ours)("g", ours.token_ids[:13], ours.logprobs[:13], ours.versions[:13], False, "abort", 0)
    resumed = engine.generate([continuation(req, partial)])[0]
    assert resumed.token_ids == ours.token_ids and resumed.num_prefix_tokens == 13
    assert np.abs(np.array(resumed.logprobs) - ours.logprobs).max() < 1e-4


def test_stop_token_is_kept_and_reported(engine):
    greedy = engine.generate([GenerationRequest("s", PROMPT, 10, temperature=0.0, stop_token_ids=())])[0]
    stop_at = greedy.token_ids[4]
    res = engine.generate([GenerationRequest("s", PROMPT, 10, temperature=0.0, stop_token_ids=[stop_at])])[0]
    assert res.finish_reason == "stop" and res.token_ids[-1] == stop_at
    assert res.token_ids == greedy.token_ids[: greedy.token_ids.index(stop_at) + 1]
    mixed = engine.generate([GenerationRequest("z", PROMPT, 0), GenerationRequest("n", PROMPT, 3, stop_token_ids=())])
    assert mixed[0].token_ids == [] and mixed[0].finish_reason == "length" and len(mixed[1].token_ids) == 3


def test_update_weights_changes_outputs_and_versions(engine, trainer):
    req = GenerationRequest("w", PROMPT, 30, temperature=0.0, stop_token_ids=())
    before = engine.generate([req])[0]
    rng = np.random.default_rng(0)
    new = {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32) for k, v in trainer.get_weights_numpy().items()}
    start = time.perf_counter()
    engine.update_weights(new, version=1)
    assert time.perf_counter() - start < 5
    after = engine.generate([req])[0]
    assert after.token_ids != before.token_ids and set(after.versions) == {1} and engine.version == 1
    trainer.set_weights_numpy(new)
    forced = trainer.compute_logprobs([TrainSample(PROMPT, after.token_ids, after.logprobs, 0.0)])[0]
    assert np.abs(forced - np.array(after.logprobs)).max() <= 1e-3
