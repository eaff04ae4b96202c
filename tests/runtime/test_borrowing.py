"""Borrowing changes where work runs, never what is learned or generated.

* Trainer-on-RollPool: the primary trainer alone, or the primary plus an auxiliary
  trainer on another device (another Ray actor) computing a chunk of the micro-batches,
  give bitwise-identical weights after several steps (chunks merge in chunk order).
* Rollouter-on-TrainPool: a replica reclaimed mid-generation hands back partial prefixes;
  resumed on another replica, every response completes exactly once with a contiguous
  token sequence and per-token versions.
* Faults: the actor of a device lent as an auxiliary trainer is killed mid-step; its chunk
  is redone by the primary, the device restarts, nothing is lost.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from runtime_cli_helpers import SMALL, run_script

pytestmark = [pytest.mark.ray]


def _batches(steps: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        mbs = []
        for _ in range(4):  # 4 micro-batches of 3 samples
            mb = []
            for _ in range(3):
                n = rng.randint(2, 9)
                mb.append({"prompt_ids": [1, 5, 6 + rng.randint(0, 9)],
                           "response_ids": [7 + rng.randint(0, 60) for _ in range(n)],
                           "behaviour_logprobs": [-rng.random() * 3 for _ in range(n)],
                           "advantage": rng.uniform(-1.5, 1.5)})
            mbs.append(mb)
        out.append(mbs)
    return out


def test_trainer_on_rollpool_is_bitwise_identical(tiny_model_dir, ray_local):
    import numpy as np

    from bidirl.algo.aggregation import StepTotals
    from bidirl.engines.trainer_config import TrainerConfig, trainer_wire
    from bidirl.runtime.worker import worker_class

    cls = worker_class()
    cfg = trainer_wire(TrainerConfig(lr=1e-3), device="cpu", seed=0)
    alone, primary, aux = (cls.remote(d, "train" if d < 2 else "rollout") for d in range(3))
    ray_local.get([w.host.remote("train", model_dir=tiny_model_dir, config=cfg) for w in (alone, primary)]
                  + [aux.host.remote("aux_train", model_dir=tiny_model_dir, config=cfg)])
    for step, mbs in enumerate(_batches(4)):
        total = StepTotals.of(len(s["response_ids"]) for mb in mbs for s in mb)
        # Alone: the primary computes every micro-batch.
        own = alone.call.options(num_returns=2).remote("train", "compute_chunk_ref", mbs, total)[0]
        ray_local.get(alone.call.remote("train", "apply_refs", [[own]], 1))
        # Borrowed: the aux adopts the primary's weights and computes the last two micro-batches.
        w = primary.call.remote("train", "weights")
        ray_local.get(aux.call.remote("aux_train", "set_weights", w, step))
        first = primary.call.options(num_returns=2).remote("train", "compute_chunk_ref", mbs[:2], total)[0]
        second = aux.call.options(num_returns=2).remote("aux_train", "compute_chunk_ref", mbs[2:], total)[0]
        _, c_grad = ray_local.get(primary.call.remote("train", "apply_refs", [[first, second]], 1))
        assert len(c_grad) == 1  # the one remote chunk was fetched, and timed, once
    wa = ray_local.get(alone.call.remote("train", "weights"))
    wb = ray_local.get(primary.call.remote("train", "weights"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert np.array_equal(wa[k], wb[k]), f"{k} differs"
    w0 = ray_local.get(aux.call.remote("aux_train", "weights"))
    changed = any(not np.array_equal(w0[k], wa[k]) for k in wa)
    assert changed, "the updates must actually change the weights"


@pytest.mark.vllm
def test_reclaimed_replica_hands_back_prefixes_that_resume_exactly_once(tiny_model_dir):
    from bidirl.runtime.group_store import GroupStore
    from bidirl.runtime.rollout_role import RolloutRole

    borrowed = RolloutRole(tiny_model_dir, max_model_len=128, kv_cache_bytes=64 << 20)
    primary = RolloutRole(tiny_model_dir, max_model_len=128, kv_cache_bytes=64 << 20)
    primary.version = 3  # the primary replicas already hold a newer version
    borrowed.version = 2
    store = GroupStore(n=4, max_new_tokens=24, temperature=1.0, seed=0)
    for g in range(3):
        store.add(g, f"u{g}", [1, 5, 10 + g, 6], "copy", "1")
    borrowed.submit([r for g in range(3) for r in store.requests_for(g)])
    while not all(p.token_ids for p in borrowed.snapshot()):  # it generates on its own
        store.absorb_finished(borrowed.poll(0.001)["finished"])
    borrowed.pause()
    store.absorb_finished(borrowed.poll(0.0)["finished"])
    partials = borrowed.abort_all()  # the reclaim
    assert not any(p.finished for p in partials)
    assert partials and all(p.token_ids for p in partials)
    affected = store.absorb_partials(partials)
    assert borrowed.running == 0
    prefixes = {(p.group_id, p.index): list(p.token_ids) for p in partials}
    primary.submit([r for g in affected for r in store.requests_for(g)])
    finished = []
    while primary.running:
        finished += primary.run(1.0)["finished"]
    done = store.absorb_finished(finished)
    assert sorted(done) == [0, 1, 2]
    for g in range(3):
        rec = store.groups[g]
        assert sorted(rec.done) == [0, 1, 2, 3] and not rec.partial
        for i, r in rec.done.items():
            pre = prefixes.get((g, i), [])
            assert r.token_ids[:len(pre)] == pre, "the resumed response continues its prefix"
            assert len(r.token_ids) == len(r.logprobs) == len(r.versions) <= 24
            assert r.versions == sorted(r.versions) and set(r.versions) <= {2, 3}
            if pre:
                assert r.versions[:len(pre)] == [2] * len(pre)
        assert store.versions(g)[0] == 2, "staleness counts from the oldest token"


@pytest.mark.vllm
@pytest.mark.slow
def test_killing_a_lent_device_mid_step_loses_nothing(tmp_path):
    run = tmp_path / "run"
    script = str(Path(__file__).with_name("faulty_train.py"))
    out = run_script(script, "1", "--run-dir", str(run), *SMALL, "run.steps=8",
                     "scheduler.policy=bidirl-opportunistic", "trainer.micro_batch_size=1", "rollout.max_new_tokens=16")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "died; redoing its work" in out.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["lost_devices"], "the fault was injected"
    assert s["audit"]["ok"] and s["audit"]["groups_trained"] == 8 * 4
    assert s["borrows"]["train_on_roll"] >= 1 and s["borrows"]["roll_on_train"] >= 1
    # A reclaim waits for at most the call in progress: one decode step or one micro-batch.
    for w in s["reclaim_waits"]:
        assert w["wait_s"] <= w["last_work_s"] + 0.5, w
