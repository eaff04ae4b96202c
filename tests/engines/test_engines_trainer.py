"""TorchTrainer: micro-batch equivalence, bitwise chunk merging, checkpoints, DP=2 == DP=1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bidirl.engines.torch_setup import init_process_group
from bidirl.engines.train_batch import TrainSample, make_microbatches, step_totals
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer
from bidirl.runtime.placement import free_port

CFG = TrainerConfig(lr=1e-3, max_grad_norm=1.0, kl_coef=0.05)
# Adam's first step is lr * g / (|g| + eps): for elements whose micro-batch contributions
# nearly cancel, a 1e-8 rounding difference in g flips the update by up to lr. A larger eps
# makes the update Lipschitz in g (change <= lr * dg / eps), so "same gradient up to float
# rounding" shows as "same weights within 1e-6" in the DP test.
CFG_DP = TrainerConfig(lr=1e-3, max_grad_norm=1.0, kl_coef=0.05, adam_eps=1e-4)


def _samples(model_dir, n=8, seed=0) -> list[TrainSample]:
    """Random prompts/responses with behaviour log-probs slightly off-policy (ratios != 1)."""
    rng = np.random.default_rng(seed)
    raw = []
    for _ in range(n):
        r = int(rng.integers(3, 20))
        raw.append(TrainSample(list(rng.integers(7, 135, int(rng.integers(2, 9)))), list(rng.integers(7, 135, r)),
                               [0.0] * r, float(rng.normal())))
    base = TorchTrainer(model_dir, TrainerConfig()).compute_logprobs(raw)
    return [
        TrainSample(s.prompt_ids, s.response_ids, list(lp + rng.normal(0, 0.1, lp.shape)), s.advantage,
                    ref_logprobs=list(lp + rng.normal(0, 0.1, lp.shape)))
        for s, lp in zip(raw, base)
    ]


def _same_params(a: TorchTrainer, b: TorchTrainer) -> bool:
    return all(torch.equal(p, b.params[n]) for n, p in a.params.items())


def test_logprobs_do_not_depend_on_batch_composition(tiny_model_dir):
    samples = _samples(tiny_model_dir, 6)
    tr = TorchTrainer(tiny_model_dir)
    together = tr.compute_logprobs(samples, micro_batch_size=6)
    alone = tr.compute_logprobs(samples, micro_batch_size=1)
    for a, b in zip(together, alone):
        assert a.shape == b.shape and np.allclose(a, b, atol=1e-5)


def test_microbatch_size_does_not_change_the_gradient(tiny_model_dir):
    samples = _samples(tiny_model_dir, 8)
    tr = TorchTrainer(tiny_model_dir, CFG)
    sums = []
    for size in (1, 3, 8):
        mbs = make_microbatches(samples, size)
        chunk = tr.compute_chunk_grads(mbs, per_microbatch=False)
        sums.append(chunk.grads[0])
        assert chunk.metrics["tokens"] == pytest.approx(1.0)
    for other in sums[1:]:
        for name, g in sums[0].items():
            assert np.allclose(g, other[name], rtol=1e-4, atol=1e-7), name


def test_chunked_gradients_merge_bitwise(tiny_model_dir):
    samples = _samples(tiny_model_dir, 8)
    mbs = make_microbatches(samples, 2)  # 4 micro-batches
    primary = TorchTrainer(tiny_model_dir, CFG)
    primary.train_step(mbs)

    # same step, micro-batches 0-1 on the primary and 2-3 on an "auxiliary" trainer
    fresh, aux = TorchTrainer(tiny_model_dir, CFG), TorchTrainer(tiny_model_dir, CFG)
    total = step_totals(mbs)
    chunk0 = fresh.compute_chunk_grads(mbs[:2], total)
    chunk1 = aux.compute_chunk_grads(mbs[2:], total)
    assert [len(c.grads) for c in (chunk0, chunk1)] == [2, 2]
    assert all(g.dtype == np.float32 and g.ndim == 1 for g in chunk0.grads[0].values())
    metrics = fresh.apply_grads([chunk0, chunk1])
    assert _same_params(primary, fresh)
    assert metrics["version"] == 1 == primary.version

    # a different partition (1 + 3) gives the same bits too
    other, aux2 = TorchTrainer(tiny_model_dir, CFG), TorchTrainer(tiny_model_dir, CFG)
    other.apply_grads([other.compute_chunk_grads(mbs[:1], total), aux2.compute_chunk_grads(mbs[1:], total)])
    assert _same_params(primary, other)


def test_weights_numpy_round_trip(tiny_model_dir):
    a = TorchTrainer(tiny_model_dir, CFG)
    a.train_step(make_microbatches(_samples(tiny_model_dir, 4), 2))
    weights = a.get_weights_numpy()
    assert "model.embed_tokens.weight" in weights and "lm_head.weight" in weights
    assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in weights.values())
    b = TorchTrainer(tiny_model_dir, CFG)
    b.set_weights_numpy(weights, version=a.version)
    assert _same_params(a, b) and b.version == 1
    a.train_step(make_microbatches(_samples(tiny_model_dir, 2, seed=1), 2))
    assert not np.array_equal(weights["lm_head.weight"], a.get_weights_numpy()["lm_head.weight"])  # a copy


def test_checkpoint_resume_is_exact(tiny_model_dir, tmp_path):
    step1 = make_microbatches(_samples(tiny_model_dir, 4, seed=1), 2)
    step2 = make_microbatches(_samples(tiny_model_dir, 4, seed=2), 2)
    a = TorchTrainer(tiny_model_dir, CFG)
    a.train_step(step1)
    a.save_checkpoint(tmp_path / "ckpt")
    a.train_step(step2)

    b = TorchTrainer(tiny_model_dir, CFG)
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.version == 1
    b.train_step(step2)
    assert _same_params(a, b)


def test_checkpoint_loaded_with_other_optimizer_settings_trains_with_the_new_ones(tiny_model_dir, tmp_path):
    """A resume may change trainer.lr and the other AdamW settings: the loaded optimizer state
    keeps its moments, the config's settings (not the saved param group's) drive the next step."""
    import dataclasses

    step1 = make_microbatches(_samples(tiny_model_dir, 4, seed=1), 2)
    step2 = make_microbatches(_samples(tiny_model_dir, 4, seed=2), 2)
    a = TorchTrainer(tiny_model_dir, CFG)
    a.train_step(step1)
    a.save_checkpoint(tmp_path / "ckpt")

    new = dataclasses.replace(CFG, lr=CFG.lr / 10, betas=(0.8, 0.99), weight_decay=0.01, adam_eps=1e-6)
    b = TorchTrainer(tiny_model_dir, new)
    b.load_checkpoint(tmp_path / "ckpt")
    (group,) = b.optimizer.param_groups
    assert (group["lr"], group["betas"], group["weight_decay"], group["eps"]) == (new.lr, (0.8, 0.99), 0.01, 1e-6)
    moments = {k: v["exp_avg"].clone() for k, v in zip(b.params, b.optimizer.state.values())}
    assert any(bool(m.abs().sum() > 0) for m in moments.values()), "the saved moments are loaded"
    b.train_step(step2)
    assert b.optimizer.param_groups[0]["lr"] == new.lr_at(1) == new.lr
    a.train_step(step2)
    assert not _same_params(a, b), "the new settings moved the weights differently"


def test_save_pretrained_loads_as_hf(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    a = TorchTrainer(tiny_model_dir, CFG)
    a.train_step(make_microbatches(_samples(tiny_model_dir, 2), 2))
    out = a.save_pretrained(tmp_path / "hf")
    assert (out / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert torch.equal(model.lm_head.weight, a.model.lm_head.weight)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"TrainerConfig.lr: must be in \(0, 1\), got 0"):
        TrainerConfig(lr=0)
    with pytest.raises(ValueError, match="clip_eps_low"):
        TrainerConfig(clip_eps_low=1.5)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        TrainSample([1], [2, 3], [0.0], 1.0)


def _dp_worker(rank, world, port, model_dir, out_dir):
    import torch.distributed as dist

    group = init_process_group(rank, world, master_port=port)
    samples = _samples(model_dir, 8)
    mine = samples[rank::world]  # uneven token counts per rank on purpose
    tr = TorchTrainer(model_dir, CFG_DP, process_group=group)
    metrics = tr.train_step(make_microbatches(mine, 2))
    np.savez(f"{out_dir}/rank{rank}.npz", **tr.get_weights_numpy(), __loss=np.float64(metrics["loss"]))
    dist.destroy_process_group()


def test_data_parallel_two_ranks_equals_one(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp

    samples = _samples(tiny_model_dir, 8)
    single = TorchTrainer(tiny_model_dir, CFG_DP)
    single_metrics = single.train_step(make_microbatches(samples, 2))
    mp.spawn(_dp_worker, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    expected = single.get_weights_numpy()
    for name, w in expected.items():
        assert np.array_equal(ranks[0][name], ranks[1][name]), name  # ranks stay in sync
        assert np.allclose(ranks[0][name], w, rtol=0, atol=1e-6), name
    assert float(ranks[0]["__loss"]) == pytest.approx(single_metrics["loss"], rel=1e-5)


def _dp_empty_rank_worker(rank, world, port, model_dir, out_dir):
    import torch.distributed as dist

    group = init_process_group(rank, world, master_port=port)
    mbs = make_microbatches(_samples(model_dir, 8), 2)
    tr = TorchTrainer(model_dir, CFG_DP, process_group=group)
    # The step's plan gave rank 1 nothing (an auxiliary took its share): it adds zero.
    chunks = [tr.compute_chunk_grads(mbs, step_totals(mbs))] if rank == 0 else []
    tr.apply_grads(chunks)
    np.savez(f"{out_dir}/rank{rank}.npz", **tr.get_weights_numpy())
    dist.destroy_process_group()


def test_a_data_parallel_rank_without_micro_batches_adds_zero(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp

    mbs = make_microbatches(_samples(tiny_model_dir, 8), 2)
    single = TorchTrainer(tiny_model_dir, CFG_DP)
    single.apply_grads([single.compute_chunk_grads(mbs, step_totals(mbs))])
    mp.spawn(_dp_empty_rank_worker, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2,
             join=True)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for name, w in single.get_weights_numpy().items():
        assert np.array_equal(ranks[0][name], ranks[1][name]), name
        assert np.allclose(ranks[0][name], w, rtol=0, atol=1e-6), name
    with pytest.raises(ValueError, match="at least one gradient chunk"):  # alone, nothing is a bug
        single.apply_grads([])


def test_flat_sample_list_uses_configured_micro_batches(tiny_model_dir):
    samples = _samples(tiny_model_dir, 6)
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=2)
    a, b = TorchTrainer(tiny_model_dir, cfg), TorchTrainer(tiny_model_dir, cfg)
    a.train_step(samples)
    b.train_step(make_microbatches(samples, 2))
    assert _same_params(a, b)


def test_stale_chunks_are_refused(tiny_model_dir):
    samples = _samples(tiny_model_dir, 2)
    tr = TorchTrainer(tiny_model_dir, CFG)
    chunk = tr.compute_chunk_grads([samples])
    tr.train_step([samples])
    with pytest.raises(ValueError, match="version"):
        tr.apply_grads([chunk])


def test_trainer_role_builds_the_trainer_from_the_train_config(tiny_model_dir):
    from bidirl.engines.trainer_config import trainer_wire
    from bidirl.runtime.config import load_config
    from bidirl.runtime.trainer_role import TrainerRole

    cfg = load_config(None, ["trainer.lr=2e-3"])
    role = TrainerRole(str(tiny_model_dir), trainer_wire(cfg.trainer, "cpu", 0), threads=1)
    assert role.trainer.config == cfg.trainer and role.trainer.device == "cpu"
    assert role.trainer.optimizer.param_groups[0]["lr"] == 2e-3


def test_lr_schedules_warm_up_then_decay():
    c = TrainerConfig(lr=1e-3, lr_warmup_steps=4, lr_schedule="cosine", lr_min_ratio=0.1, lr_decay_steps=14)
    lrs = [c.lr_at(s) for s in range(16)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert lrs[14] == pytest.approx(1e-4) and lrs[15] == pytest.approx(1e-4)  # stays at the floor
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    lin = TrainerConfig(lr=1e-3, lr_schedule="linear", lr_decay_steps=10)
    assert [lin.lr_at(s) for s in (0, 5, 10)] == pytest.approx([1e-3, 5e-4, 0.0])
    assert TrainerConfig(lr=1e-3).lr_at(10_000) == 1e-3
    with pytest.raises(ValueError, match="lr_decay_steps"):
        TrainerConfig(lr_schedule="cosine").lr_at(0)


def test_the_schedule_and_entropy_are_reported_and_survive_a_resume(tiny_model_dir, tmp_path):
    import math

    from bidirl.engines.trainer_config import from_wire, trainer_wire

    cfg, _, _, _ = from_wire(trainer_wire(TrainerConfig(lr=1e-3, lr_warmup_steps=3, lr_schedule="linear"),
                                       "cpu", 0, steps=6))
    assert cfg.lr_decay_steps == 6
    t = TorchTrainer(tiny_model_dir, cfg)
    batch = _samples(tiny_model_dir, n=4)
    m = [t.train_step(batch) for _ in range(2)]
    assert [x["lr"] for x in m] == pytest.approx([1e-3 / 3, 2e-3 / 3])
    vocab = t.model.config.vocab_size
    assert 0 < m[0]["entropy"] <= math.log(vocab) + 1e-6
    t.save_checkpoint(tmp_path / "ck")
    t2 = TorchTrainer(tiny_model_dir, cfg)
    t2.load_checkpoint(tmp_path / "ck")
    after = [t2.train_step(batch)["lr"] for _ in range(3)]
    assert after == pytest.approx([cfg.lr_at(s) for s in (2, 3, 4)]) and after[0] == pytest.approx(1e-3)


def test_kl_reference_is_the_initial_policy_when_samples_carry_none(tiny_model_dir):
    """kl_coef > 0 with no reference log-probs in the samples: the trainer's frozen copy of the
    model directory is the reference, so at the initial weights the k3 term (and its
    gradient) vanishes, and once the weights moved it does not."""
    raw = [TrainSample(s.prompt_ids, s.response_ids, s.behaviour_logprobs, s.advantage)
           for s in _samples(tiny_model_dir, 6)]
    mbs = make_microbatches(raw, 3)
    plain = TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3)).compute_chunk_grads(mbs, per_microbatch=False)
    kl_trainer = TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3, kl_coef=0.5))
    with_kl = kl_trainer.compute_chunk_grads(mbs, per_microbatch=False)
    for name, g in plain.grads[0].items():
        assert np.allclose(g, with_kl.grads[0][name], rtol=1e-4, atol=1e-7), name
    kl_trainer.train_step(mbs)  # the policy moves away from the reference
    moved_plain = TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3))
    moved_plain.set_weights_numpy(kl_trainer.get_weights_numpy(), kl_trainer.version)
    a = moved_plain.compute_chunk_grads(mbs, per_microbatch=False).grads[0]
    b = kl_trainer.compute_chunk_grads(mbs, per_microbatch=False).grads[0]
    assert any(not np.allclose(a[n], b[n], rtol=1e-4, atol=1e-7) for n in a)


def test_reference_kl_is_the_summed_penalty_against_the_initial_weights(tiny_model_dir):
    """``algorithm.use_kl_in_reward``'s per-response KL: with behaviour log-probs equal to the
    reference's it is 0; shifted by ``d`` on every token it is ``n d`` (k1), ``n |d|`` (abs)
    and ``n d^2 / 2`` (mse), ``n`` the response's tokens; without the option, no reference."""
    from bidirl.algo.algorithm_config import AlgorithmConfig

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3), algorithm=AlgorithmConfig(use_kl_in_reward=True))
    assert trainer.ref_model is None, "loaded on first use: only rank 0 is asked"
    raw = _samples(tiny_model_dir, 5)
    ref = TorchTrainer(tiny_model_dir, TrainerConfig()).compute_logprobs(raw)
    trainer.train_step(make_microbatches(raw, 5))  # the trained copy moves; the reference must not
    d = -0.25

    def shifted(shift):
        return make_microbatches([TrainSample(s.prompt_ids, s.response_ids, list(lp + shift), s.advantage)
                                  for s, lp in zip(raw, ref)], 2)

    n = np.array([len(s.response_ids) for s in raw], dtype=np.float64)
    assert np.allclose(trainer.reference_kl(shifted(0.0), "kl"), 0.0, atol=1e-4)
    assert np.allclose(trainer.reference_kl(shifted(d), "k1"), n * d, atol=1e-4)
    assert np.allclose(trainer.reference_kl(shifted(d), "abs"), n * abs(d), atol=1e-4)
    assert np.allclose(trainer.reference_kl(shifted(d), "mse"), n * d * d / 2, atol=1e-4)
    assert np.allclose(trainer.reference_kl(shifted(d), "k3"), trainer.reference_kl(shifted(d), "low_var_kl"))
    with pytest.raises(RuntimeError, match="use_kl_in_reward is off"):
        TorchTrainer(tiny_model_dir, TrainerConfig()).reference_kl(shifted(0.0), "kl")
