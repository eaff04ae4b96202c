"""A non-finite loss or gradient never reaches the optimizer; NaN weights are never written."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from bidirl.engines.torch_setup import init_process_group
from bidirl.engines.train_batch import TrainSample, make_microbatches
from bidirl.engines.trainer_config import NonFiniteStepError, NonFiniteWeightsError, TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer
from bidirl.runtime.placement import free_port

CFG = TrainerConfig(lr=1e-3, max_grad_norm=1.0)


def _samples(n: int, seed: int) -> list[TrainSample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        r = int(rng.integers(3, 10))
        out.append(TrainSample(list(rng.integers(7, 135, int(rng.integers(2, 6)))), list(rng.integers(7, 135, r)),
                               list(rng.normal(-4.0, 0.1, r)), float(rng.normal())))
    return out


def _poisoned(samples: list[TrainSample], index: int = 1) -> list[TrainSample]:
    """The same batch with one NaN advantage (what one NaN reward did to its group)."""
    out = list(samples)
    out[index] = dataclasses.replace(out[index], advantage=float("nan"))
    return out


def _params(tr: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.params.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _optimizer_state(tr: TorchTrainer) -> list[dict[str, torch.Tensor]]:
    return [copy.deepcopy(tr.optimizer.state[p]) for p in tr.params.values()]


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_nan_advantage_skips_the_step_bitwise(tiny_model_dir, max_grad_norm):
    cfg = dataclasses.replace(CFG, max_grad_norm=max_grad_norm)
    good1, good2 = make_microbatches(_samples(4, 1), 2), make_microbatches(_samples(4, 2), 2)
    bad = make_microbatches(_poisoned(_samples(4, 3)), 2)
    a = TorchTrainer(tiny_model_dir, cfg)
    first = a.train_step(good1)
    assert first["skipped"] == 0.0 and first["skipped_steps"] == 0
    weights, opt = _params(a), _optimizer_state(a)

    m = a.train_step(bad)
    assert m["skipped"] == 1.0 and m["skipped_steps"] == 1 and a.skipped_steps == 1
    assert not np.isfinite(m["grad_norm"]) or not np.isfinite(m["loss"])
    assert _same(_params(a), weights), "a skipped step changes no weight"
    after = _optimizer_state(a)
    for before_p, after_p in zip(opt, after, strict=True):
        assert before_p.keys() == after_p.keys() and all(torch.equal(before_p[k], after_p[k]) for k in before_p)
    assert all(p.grad is None for p in a.params.values())
    assert m["version"] == 2 == a.version, "the version still advances (the runtime counts steps)"

    # the next good step is bit for bit the one a trainer that never saw the bad batch takes
    a.train_step(good2)
    b = TorchTrainer(tiny_model_dir, cfg)
    b.train_step(good1)
    b.train_step(good2)
    assert _same(_params(a), _params(b))
    assert all(np.isfinite(w).all() for w in a.get_weights_numpy().values())


def test_stop_raises_naming_the_step_and_changes_nothing(tiny_model_dir):
    a = TorchTrainer(tiny_model_dir, dataclasses.replace(CFG, on_nonfinite="stop"))
    a.train_step(make_microbatches(_samples(4, 1), 2))
    weights = _params(a)
    with pytest.raises(NonFiniteStepError, match=r"step 1: non-finite .*on_nonfinite=stop") as info:
        a.train_step(make_microbatches(_poisoned(_samples(4, 3)), 2))
    assert "\n" not in str(info.value)
    assert a.version == 1 and a.skipped_steps == 0
    assert _same(_params(a), weights) and all(p.grad is None for p in a.params.values())


def test_on_nonfinite_is_a_checked_choice():
    with pytest.raises(ValueError, match="on_nonfinite"):
        TrainerConfig(on_nonfinite="ignore")
    from bidirl.runtime.config import ConfigError, load_config

    assert load_config(None, ["trainer.on_nonfinite=stop"]).trainer.on_nonfinite == "stop"
    with pytest.raises(ConfigError, match="trainer.on_nonfinite"):
        load_config(None, ["trainer.on_nonfinite=maybe"])


def test_checkpoint_refuses_nan_weights_and_keeps_the_good_one(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    a = TorchTrainer(tiny_model_dir, CFG)
    a.train_step(make_microbatches(_samples(4, 1), 2))
    a.train_step(make_microbatches(_poisoned(_samples(4, 3)), 2))  # skipped: counted in the checkpoint
    good = a.save_checkpoint(tmp_path / "ckpt")
    saved = load_file(str(good / "model.safetensors"))
    with torch.no_grad():
        a.params["lm_head.weight"][0, 0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match="NaN/inf"):
        a.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(NonFiniteWeightsError):
        a.save_checkpoint(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists(), "nothing written before the check"
    with pytest.raises(NonFiniteWeightsError):
        a.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    again = load_file(str(good / "model.safetensors"))
    assert all(torch.equal(saved[k], again[k]) for k in saved), "the good checkpoint is intact"
    b = TorchTrainer(tiny_model_dir, CFG)
    b.load_checkpoint(good)
    assert b.version == 2 and b.skipped_steps == 1


def _dp_worker(rank, world, port, model_dir, out_dir):
    import torch.distributed as dist

    group = init_process_group(rank, world, master_port=port)
    tr = TorchTrainer(model_dir, CFG, process_group=group)
    before = tr.get_weights_numpy()
    samples = _samples(4, 10 + rank)
    if rank == 0:  # only one rank sees the NaN: every rank must still skip
        samples = _poisoned(samples, 0)
    m = tr.train_step(make_microbatches(samples, 2))
    unchanged = all(np.array_equal(before[k], w) for k, w in tr.get_weights_numpy().items())
    np.savez(f"{out_dir}/rank{rank}.npz", skipped=m["skipped"], unchanged=unchanged, version=m["version"])
    dist.destroy_process_group()


def test_data_parallel_ranks_skip_together(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_dp_worker, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        out = np.load(tmp_path / f"rank{r}.npz")
        assert float(out["skipped"]) == 1.0 and bool(out["unchanged"]) and int(out["version"]) == 1, r
