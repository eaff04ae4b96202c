"""The rollout engine (``RolloutRole``: vLLM's in-process engine, step by step) against HF.

The HF model on the same weights is the reference: vLLM's behaviour log-probs must equal
its teacher-forced log-probs, greedy responses its argmaxes; an abort followed by a resume
from the prefix must reproduce the uninterrupted response; a weight update with requests in
flight must tag later tokens with the new version, each token computed by one version only.
One engine for the whole module (each start costs seconds); the weight-update test runs last
and puts the original weights back.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("vllm")

from bidirl.engines.hf_reference import load_reference, score_tokens  # noqa: E402
from bidirl.runtime.messages import ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = pytest.mark.vllm
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]  # <|bos|><|user|>copy 4821<|assistant|>


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return load_reference(tiny_model_dir)


@pytest.fixture(scope="module")
def role(tiny_model_dir, reference):
    r = RolloutRole(tiny_model_dir, max_model_len=512, kv_cache_bytes=64 << 20)
    yield r
    r.release()


def _finish(role):
    """Step until nothing is live; every finished response, in (group, index) order."""
    done = []
    while role.running:
        done += role.run(10.0, stop_on_finish=False)["finished"]
    return sorted(done, key=lambda r: (r.group_id, r.index))


def _step_until(role, n_tokens):
    """Let the replica generate until the one live response has ``n_tokens``, then pause it.

    The caller unpauses (``role.unpause()``) after its out-of-band call.
    """
    while True:
        out = role.poll(0.002)
        assert not out["finished"], "the response finished before the interruption point"
        (progress,) = role.snapshot()
        if len(progress.token_ids) >= n_tokens:
            role.pause()
            (progress,) = role.snapshot()
            return progress


def _weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


def test_sampled_logprobs_match_hf(role, reference):
    role.submit([ResponseRequest(0, i, PROMPT, 48, temperature=1.0, seed=i) for i in range(16)])
    results = _finish(role)
    assert [(r.group_id, r.index) for r in results] == [(0, i) for i in range(16)]
    for r in results:
        assert r.finished and r.finish_reason in ("stop", "length") and 1 <= len(r.token_ids) <= 48
        assert len(r.token_ids) == len(r.logprobs) == len(r.versions) and set(r.versions) == {0}
        forced, _ = score_tokens(reference, PROMPT, r.token_ids)
        assert np.abs(forced - np.array(r.logprobs)).max() <= 1e-3
    assert len({tuple(r.token_ids) for r in results}) > 1  # seeds differ -> samples differ


def test_greedy_matches_hf_and_abort_resume_is_exact(role, reference):
    role.submit([ResponseRequest(1, 0, PROMPT, 300, temperature=0.0)])
    (full,) = _finish(role)
    assert full.finished and len(full.token_ids) == 300
    forced, argmax = score_tokens(reference, PROMPT, full.token_ids)
    assert full.token_ids == argmax  # greedy: every token is the reference's argmax
    assert np.abs(forced - np.array(full.logprobs)).max() <= 1e-3

    role.submit([ResponseRequest(2, 0, PROMPT, 300, temperature=0.0)])
    progress = _step_until(role, 40)
    (partial,) = role.abort_all()  # a reclaim
    role.unpause()
    assert role.running == 0 and not partial.finished and partial.finish_reason is None
    assert partial.token_ids == progress.token_ids, "a snapshot does not interrupt"
    assert 40 <= len(partial.token_ids) < 300
    assert partial.token_ids == full.token_ids[: len(partial.token_ids)]
    resume = partial.as_request()
    assert resume.prefix_ids == partial.token_ids and resume.max_new_tokens == 300
    role.submit([resume])
    (resumed,) = _finish(role)
    assert (resumed.group_id, resumed.index) == (2, 0) and resumed.finished
    assert resumed.token_ids == full.token_ids
    assert np.abs(np.array(resumed.logprobs) - np.array(full.logprobs)).max() < 1e-4
    assert len(resumed.versions) == 300


def test_the_replica_generates_on_its_own_and_an_abort_stops_it(role):
    """The replica generates on its own thread while the caller only polls; an abort stops it."""
    role.submit([ResponseRequest(7, i, PROMPT, 300, temperature=1.0, seed=i) for i in range(8)])
    steps: list[float] = []
    finished: list = []
    while sum(len(p.token_ids) for p in role.snapshot()) < 8 * 20:
        out = role.poll(0.01)
        steps += [s for _, _, s in out["measurements"]]
        finished += out["finished"]
    handed_back = role.abort_all()
    steps += [s for _, _, s in role.poll(0.0)["measurements"]]
    assert sorted(r.index for r in finished + handed_back) == list(range(8)) and role.running == 0
    assert all(p.token_ids for p in handed_back)
    assert len(steps) >= 20, "decode steps ran while the caller only polled"
    assert role.poll(0.0)["running"] == 0 and not role.snapshot()


def test_nothing_left_to_generate_is_refused(role):
    with pytest.raises(ValueError, match="nothing left"):
        role.submit([ResponseRequest(3, 0, PROMPT, 2, prefix_ids=[7, 8], prefix_logprobs=[0.0, 0.0],
                                     prefix_versions=[0, 0])])
    assert role.running == 0


class _AgainEnv:
    """Three model turns, each answered "try again": a trajectory of model and environment turns."""

    def reset(self, row):
        self.turn = 0
        return list(row["prompt"])

    def step(self, text):
        self.turn += 1
        return ([], 1.0, True) if self.turn == 3 else ([{"role": "user", "content": "try again"}], 0.0, False)


def _trajectory(role, tok, interrupt_turn: int | None):
    """One greedy trajectory through a real engine, the hub driving it as the rollout driver
    does; on ``interrupt_turn`` a reclaim stops the turn a few tokens in and it resumes from
    its partial prefix."""
    from bidirl.algo.episode import EpisodeLimits
    from bidirl.runtime.trajectories import TrajectoryHub

    hub = TrajectoryHub(_AgainEnv, tok, EpisodeLimits(3, 4096, 10.0), turn_tokens=20, max_context=512,
                        temperature=0.0)
    try:
        hub.start(9, 0, {"prompt": [{"role": "user", "content": "copy 4821"}]}, seed=1, fallback_prompt=PROMPT)
        turn = 0
        while True:
            reqs = hub.take_requests()
            done = hub.take_finished()
            if done:
                return done[0]
            if not reqs:
                time.sleep(0.001)
                continue
            (req,) = reqs
            role.submit(reqs)
            if turn == interrupt_turn:
                _step_until(role, len(req.prefix_ids) + 5)
                (partial,) = role.abort_all()  # a reclaim mid-turn
                role.unpause()
                assert len(req.prefix_ids) < len(partial.token_ids) < len(req.prefix_ids) + 20
                role.submit([partial.as_request()])  # resumed (here: on the same engine)
            (res,) = _finish(role)
            hub.turn_done(res)
            turn += 1
    finally:
        hub.close()


def test_a_trajectory_reclaimed_mid_turn_resumes_exactly_and_scores_as_hf(role, reference, tiny_model_dir):
    from bidirl.models.tiny import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    whole = _trajectory(role, tok, None)
    resumed = _trajectory(role, tok, 1)
    assert whole.outcome == "done" and whole.turns == 3 and whole.env_reward == 1.0
    assert resumed.token_ids == whole.token_ids and resumed.loss_mask == whole.loss_mask
    assert np.abs(np.array(resumed.logprobs) - np.array(whole.logprobs)).max() < 1e-4
    mask = np.array(whole.loss_mask, dtype=bool)
    assert mask.sum() == 3 * 20 and (~mask).sum() > 0  # three capped turns, the environment's between
    # the behaviour log-probs of the model's tokens, with the environment's tokens in the
    # context, are the HF model's teacher-forced ones over the whole trajectory
    forced, argmax = score_tokens(reference, whole.prompt_ids, whole.token_ids)
    assert np.abs(forced[mask] - np.array(whole.logprobs)[mask]).max() <= 1e-3
    assert np.array_equal(np.array(argmax)[mask], np.array(whole.token_ids)[mask])  # greedy


def test_update_weights_in_flight_tags_versions_exactly(role, reference, tiny_model_dir):
    original = _weights(reference)
    rng = np.random.default_rng(0)
    new = {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32) for k, v in original.items()}
    new_reference = load_reference(tiny_model_dir, new)

    role.submit([ResponseRequest(4, 0, PROMPT, 300, temperature=1.0, seed=3)])
    _step_until(role, 30)
    role.update_weights(new, version=1)
    role.unpause()
    assert role.version == 1 and role.running == 1
    (result,) = _finish(role)
    assert result.finished
    v, lp = np.array(result.versions), np.array(result.logprobs)
    assert (v == 0).sum() >= 30 and (v == 1).sum() >= 1 and np.all(np.diff(v) >= 0)
    old_forced, _ = score_tokens(reference, PROMPT, result.token_ids)
    new_forced, _ = score_tokens(new_reference, PROMPT, result.token_ids)
    # each token's log-prob is that of the weights its version names (no stale KV cache)
    assert np.abs(old_forced[v == 0] - lp[v == 0]).max() <= 1e-3
    assert np.abs(new_forced[v == 1] - lp[v == 1]).max() <= 1e-3

    # a fresh request after the update: all new version, greedy follows the new weights
    role.submit([ResponseRequest(5, 0, PROMPT, 30, temperature=0.0)])
    (after,) = _finish(role)
    _, old_argmax = score_tokens(reference, PROMPT, after.token_ids)
    forced, new_argmax = score_tokens(new_reference, PROMPT, after.token_ids)
    assert set(after.versions) == {1} and after.token_ids == new_argmax != old_argmax
    assert np.abs(forced - np.array(after.logprobs)).max() <= 1e-3

    role.set_weights(original, 0)  # leave the module's engine as it was
    role.submit([ResponseRequest(6, 0, PROMPT, 30, temperature=0.0)])
    (restored,) = _finish(role)
    assert set(restored.versions) == {0}
    assert restored.token_ids == score_tokens(reference, PROMPT, restored.token_ids)[1]
