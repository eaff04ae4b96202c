"""``trainer.strategy=fsdp2`` over two gloo ranks on the CPU: it trains as DDP does, takes
auxiliaries' gradients bit for bit, resumes from its sharded checkpoint exactly, exports a
whole HF directory, and fits a memory budget DDP does not.

The two ranks are spawned once for the module (``sharded_runs``); each test reads what
they wrote.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from test_engines_trainer import CFG_DP, _samples

from bidirl.engines.torch_setup import init_process_group
from bidirl.engines.train_batch import make_microbatches, step_totals
from bidirl.engines.trainer_torch import TorchTrainer
from bidirl.runtime.placement import free_port

STEPS = 20
FSDP = dataclasses.replace(CFG_DP, strategy="fsdp2")


def _batch(model_dir, step, rank, world=2):
    """Step ``step``'s micro-batches of rank ``rank`` (uneven token counts per rank)."""
    return make_microbatches(_samples(model_dir, 8, seed=step)[rank::world], 2)


def _ranks(rank, world, port, model_dir, out):
    import torch.distributed as dist

    group = init_process_group(rank, world, master_port=port)
    ddp, fsdp = TorchTrainer(model_dir, CFG_DP, process_group=group), TorchTrainer(model_dir, FSDP, process_group=group)
    assert fsdp.sharded is not None and ddp.sharded is None
    losses = {"ddp": [], "fsdp2": []}
    for step in range(STEPS):
        mbs = _batch(model_dir, step, rank)
        losses["ddp"].append(ddp.train_step(mbs)["loss"])
        losses["fsdp2"].append(fsdp.train_step(mbs)["loss"])
    fsdp.save_checkpoint(f"{out}/ckpt/trainer", f"{out}/ckpt/model")
    after = fsdp.train_step(_batch(model_dir, STEPS, rank))["loss"]
    resumed, twin = (TorchTrainer(model_dir, FSDP, process_group=group) for _ in range(2))
    for tr in (resumed, twin):
        tr.load_checkpoint(f"{out}/ckpt/trainer", f"{out}/ckpt/model")
    again = resumed.train_step(_batch(model_dir, STEPS, rank))["loss"]
    twin.train_step(_batch(model_dir, STEPS, rank))
    # Exactness with an auxiliary: a full-copy trainer (no group) computes micro-batches 1
    # and 2 of a step; each rank folds micro-batch i if i % 2 == rank, whoever computed it.
    aux = TorchTrainer(model_dir, FSDP)
    aux.set_weights_numpy(resumed.get_weights_numpy(), resumed.version)
    mbs = make_microbatches(_samples(model_dir, 8, seed=99), 2)
    totals = step_totals(mbs)
    alone = [resumed.compute_chunk_grads([mbs[i]], totals) for i in range(len(mbs))]
    helped = [aux.compute_chunk_grads([mbs[i]], totals) if i in (1, 2) else alone[i] for i in range(len(mbs))]
    same_grads = all(np.array_equal(a, b) for i in (1, 2) for a, b in zip(alone[i].grads[0].values(),
                                                                          helped[i].grads[0].values()))
    resumed.apply_grads([c for i, c in enumerate(alone) if i % 2 == rank])
    twin.apply_grads([c for i, c in enumerate(helped) if i % 2 == rank])
    np.savez(f"{out}/rank{rank}.npz", **{f"w.{k}": v for k, v in twin.get_weights_numpy().items()},
             **{f"alone.{k}": v for k, v in resumed.get_weights_numpy().items()})
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({**losses, "after": after, "again": again, "same_grads": same_grads}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_runs(tiny_model_dir, tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("sharded")
    mp.spawn(_ranks, args=(2, free_port(), str(tiny_model_dir), str(out)), nprocs=2, join=True)
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_fsdp2_trains_to_ddp_losses(sharded_runs):
    _, ranks = sharded_runs
    ddp, fsdp = np.array(ranks[0]["ddp"]), np.array(ranks[0]["fsdp2"])
    assert len(fsdp) == STEPS and ranks[1]["fsdp2"] == ranks[0]["fsdp2"]  # the ranks report one loss
    assert np.abs(ddp - fsdp).max() <= 1e-4, np.abs(ddp - fsdp)
    assert ddp[0] == fsdp[0]  # step 0: the same weights and micro-batches, the same forward


def test_sharded_checkpoint_resumes_the_next_step_exactly(sharded_runs):
    _, ranks = sharded_runs
    for r in ranks:
        assert r["again"] == r["after"]


def test_sharded_checkpoint_files_and_export(sharded_runs, tmp_path):
    from transformers import AutoModelForCausalLM

    from bidirl.engines.sharding import optimizer_files

    out, _ = sharded_runs
    files, problem = optimizer_files(out / "ckpt" / "trainer")
    assert problem is None and [f.name for f in files] == ["optimizer.shard-0-of-2.pt", "optimizer.shard-1-of-2.pt"]
    assert json.loads((out / "ckpt" / "trainer" / "trainer_state.json").read_text())["version"] == STEPS
    model = AutoModelForCausalLM.from_pretrained(str(out / "ckpt" / "model"))  # one whole HF directory
    # A full-copy trainer resumes the sharded checkpoint (rows concatenated back).
    whole = TorchTrainer(out / "ckpt" / "model", CFG_DP)
    whole.load_checkpoint(out / "ckpt" / "trainer", out / "ckpt" / "model")
    assert whole.version == STEPS
    exp_avg = whole.optimizer.state_dict()["state"][0]["exp_avg"]
    assert exp_avg.shape == next(iter(whole.params.values())).shape
    for name, p in model.named_parameters():
        assert torch.equal(p, whole.weights[name]), name
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "optimizer.shard-1-of-2.pt").write_bytes(b"")
    assert "missing" in optimizer_files(tmp_path / "trainer")[1]


def test_auxiliary_gradients_fold_bitwise_into_the_shards(sharded_runs):
    out, ranks = sharded_runs
    assert all(r["same_grads"] for r in ranks)  # an auxiliary's g_i is a primary rank's, bit for bit
    for r in range(2):
        w = np.load(out / f"rank{r}.npz")
        names = [k[2:] for k in w.files if k.startswith("w.")]
        differ = [n for n in names if not np.array_equal(w[f"w.{n}"], w[f"alone.{n}"])]
        assert not differ, differ[:3]
    r0, r1 = np.load(out / "rank0.npz"), np.load(out / "rank1.npz")
    assert all(np.array_equal(r0[k], r1[k]) for k in r0.files)  # the gathered weights agree


def test_a_budget_ddp_exceeds_and_fsdp2_fits(tiny_model_dir, sharded_runs):
    from bidirl.perf.profile_spec import ModelSpec, model_profile
    from bidirl.planner.memory import GIB, trainer_state_bytes
    from bidirl.runtime.config import ConfigError, load_config
    from bidirl.runtime.run_spec import check_trainer_memory

    params = model_profile(ModelSpec(config=str(tiny_model_dir)), ConfigError, "model.path").params
    ddp, fsdp = (sum(trainer_state_bytes(params, s, 2).values()) for s in ("ddp", "fsdp2"))
    assert fsdp < ddp
    budget = (ddp + fsdp) / 2 / GIB
    base = ["cluster.train_devices=2", f"cluster.device_memory_gib={budget}"]
    with pytest.raises(ConfigError) as e:
        check_trainer_memory(load_config(None, [*base, "trainer.strategy=ddp"]), str(tiny_model_dir))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cluster.device_memory_gib=") and "trainer.strategy=fsdp2" in msg
    check_trainer_memory(load_config(None, [*base, "trainer.strategy=fsdp2"]), str(tiny_model_dir))
    with pytest.raises(ConfigError, match="more cluster.train_devices"):  # fsdp2 has a floor too
        check_trainer_memory(load_config(None, [*base[:1], "trainer.strategy=fsdp2",
                                                f"cluster.device_memory_gib={fsdp / 4 / GIB}"]), str(tiny_model_dir))
    assert sharded_runs[1][0]["fsdp2"]  # and fsdp2 trained this model over two ranks (the fixture)


def test_strategy_is_checked_by_the_config():
    from bidirl.runtime.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="trainer.strategy.*ddp.*fsdp2"):
        load_config(None, ["trainer.strategy=zero3"])


def test_activation_checkpointing_and_bf16_compute_the_step(tiny_model_dir):
    mbs = make_microbatches(_samples(tiny_model_dir, 6), 2)
    plain = TorchTrainer(tiny_model_dir, CFG_DP).compute_chunk_grads(mbs)
    ckpt = TorchTrainer(tiny_model_dir, dataclasses.replace(CFG_DP, activation_checkpointing=True))
    recomputed = ckpt.compute_chunk_grads(mbs)
    for name, g in plain.grads[0].items():
        assert np.allclose(g, recomputed.grads[0][name], rtol=0, atol=1e-6), name
    bf16 = TorchTrainer(tiny_model_dir, dataclasses.replace(CFG_DP, mixed_precision="bf16"))
    metrics = bf16.train_step(mbs)
    assert np.isfinite(metrics["loss"]) and bf16.weights["lm_head.weight"].dtype == torch.float32
    assert metrics["loss"] == pytest.approx(plain.metrics["loss"], rel=0.05)  # bf16 matmuls, same loss
