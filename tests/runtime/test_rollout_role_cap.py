"""A replica with fewer slots than requests (vLLM's ``max_num_seqs``): what its stage models see.

Its own engine, in its own module: releasing an engine tears down vLLM's process-wide
parallel state, which another module's engine still alive would lose.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from bidirl.runtime.messages import PrefillBurst, ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = pytest.mark.vllm
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]  # <|bos|><|user|>copy 4821<|assistant|>


def test_requests_beyond_max_num_seqs_wait_outside_both_models(tiny_model_dir):
    """With more requests than slots, the waiting ones are not counted: decode steps report
    at most max_num_seqs running, and a prefill burst ends once the slots are full (before,
    a waiting request kept the whole wait as one 'prefill', hundreds of ms for 12 tokens)."""
    r = RolloutRole(tiny_model_dir, max_num_seqs=2, max_model_len=512, kv_cache_bytes=64 << 20)
    try:
        r.submit([ResponseRequest(1, i, PROMPT, 24, temperature=1.0, seed=i) for i in range(6)])
        decode, prefill, done = [], [], []
        while len(done) < 6:
            out = r.poll(0.05)
            decode += out["measurements"]
            prefill += out["prefills"]
            done += out["finished"]
        assert decode and max(batch for batch, _, _ in decode) <= 2
        assert prefill and max(tokens for tokens, *_ in prefill) <= 2 * len(PROMPT) + 24
        assert sum(tokens for tokens, *_ in prefill) >= 6 * len(PROMPT)  # every request, once
        # each burst: its steps, the decode work they carried (at most the slots), their time
        for _, steps, batch, _, secs, beyond in prefill:
            assert steps >= 1 and 0 <= batch <= 2 * steps and 0 <= beyond <= secs
    finally:
        r.release()


def test_a_prefill_after_an_abort_is_measured_whole(tiny_model_dir):
    """A reclaim's ``abort_all`` cuts a prefill burst short; the next requests' bursts are
    measured from scratch, in the full form (a burst reset to a shorter record once killed
    the generating thread, and the driver waited on it for ever)."""
    r = RolloutRole(tiny_model_dir, max_num_seqs=2, max_model_len=512, kv_cache_bytes=64 << 20)
    try:
        r.submit([ResponseRequest(1, i, PROMPT, 24, temperature=1.0, seed=i) for i in range(4)])
        r.poll(0.05)
        r.abort_all()
        r.submit([ResponseRequest(2, i, PROMPT, 8, temperature=1.0, seed=i) for i in range(3)])
        prefill, done = [], []
        while len(done) < 3:
            out = r.poll(0.05)
            prefill += out["prefills"]
            done += out["finished"]
        assert prefill and all(len(b) == len(PrefillBurst._fields) for b in prefill)
    finally:
        r.release()
