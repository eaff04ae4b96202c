"""LoRA in the trainer (``engines/lora.py``): only the adapters train, are merged bitwise
across chunks, are checkpointed and exported in PEFT's layout; a replica's merge is PEFT's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bidirl.engines.lora import AdapterMerge, LoraSettings, read_adapter, unmatched_targets
from bidirl.engines.train_batch import TrainSample, make_microbatches, step_totals
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.engines.trainer_torch import TorchTrainer

pytest.importorskip("peft")

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"))
CFG = TrainerConfig(lr=1e-2, max_grad_norm=1.0)


def _samples(n=8, seed=0) -> list[TrainSample]:
    """Random prompts and responses, their behaviour log-probs a little off the policy's."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        r = int(rng.integers(3, 16))
        out.append(TrainSample(list(rng.integers(7, 135, int(rng.integers(2, 9)))), list(rng.integers(7, 135, r)),
                               list(rng.normal(-5.0, 0.1, r)), float(rng.normal())))
    return out


def _trained(model_dir, steps=2, **kw) -> TorchTrainer:
    tr = TorchTrainer(model_dir, CFG, lora=LORA, **kw)
    for s in range(steps):
        tr.train_step(make_microbatches(_samples(seed=s), 4))
    return tr


def test_only_the_adapters_train_and_are_the_weights(tiny_model_dir):
    from peft import get_peft_model_state_dict

    tr = TorchTrainer(tiny_model_dir, CFG, lora=LORA)
    base = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" not in n}
    assert set(tr.weights) == set(get_peft_model_state_dict(tr.model))  # PEFT's saved names
    assert set(tr.params) == set(tr.weights) and all(".lora_A." in n or ".lora_B." in n for n in tr.weights)
    assert len(tr.weights) == 2 * 7 * tr.model.config.num_hidden_layers
    assert sum(len(g["params"]) for g in tr.optimizer.param_groups) == len(tr.weights)
    b0 = {n: p.detach().clone() for n, p in tr.weights.items() if "lora_B" in n}
    assert all(not v.any() for v in b0.values())  # B starts at zero: the adapted model is the base
    tr.train_step(make_microbatches(_samples(), 4))
    assert all(torch.equal(p, base[n]) for n, p in tr.model.named_parameters() if "lora_" not in n)
    assert any(tr.weights[n].detach().abs().sum() > 0 for n in b0)
    assert set(tr.get_weights_numpy()) == set(tr.weights)


def test_chunked_adapter_gradients_merge_bitwise(tiny_model_dir):
    """The ordered merge (micro-batches on a primary and an auxiliary) is one trainer's step, bit for bit."""
    mbs = make_microbatches(_samples(8, seed=3), 2)
    one = _trained(tiny_model_dir, steps=1)
    start = one.get_weights_numpy()
    one.train_step(mbs)
    primary_first = _trained(tiny_model_dir, steps=1)  # the same first step: the same AdamW moments
    aux = TorchTrainer(tiny_model_dir, CFG, lora=LORA)
    aux.set_weights_numpy(start, version=primary_first.version)
    total = step_totals(mbs)
    chunks = [primary_first.compute_chunk_grads(mbs[:1], total), aux.compute_chunk_grads(mbs[1:], total)]
    assert set(chunks[1].grads[0]) == set(one.weights)  # only the adapters' gradients cross
    primary_first.apply_grads(chunks)
    assert all(torch.equal(p, primary_first.weights[n]) for n, p in one.weights.items())


def test_checkpoint_is_a_peft_adapter_directory_and_resumes_exactly(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tr = _trained(tiny_model_dir)
    tr.save_checkpoint(tmp_path / "trainer", tmp_path / "model")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {f.name for f in (tmp_path / "model").iterdir()}
    assert set(read_adapter(tmp_path / "model")) == set(tr.weights)
    back = TorchTrainer(tiny_model_dir, CFG, lora=LORA)
    back.load_checkpoint(tmp_path / "trainer", tmp_path / "model")
    assert back.version == tr.version
    assert all(torch.equal(p, back.weights[n]) for n, p in tr.weights.items())
    nxt = make_microbatches(_samples(seed=9), 4)
    tr.train_step(nxt), back.train_step(nxt)  # the optimizer state came back too
    assert all(torch.equal(p, back.weights[n]) for n, p in tr.weights.items())

    ids = torch.tensor([[1, 5, 106, 118, 119, 128, 39, 59, 6, 40, 41]])
    with torch.no_grad():
        want = tr.model(input_ids=ids).logits
        tr.save_pretrained(tmp_path / "adapter")
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                               str(tmp_path / "adapter"))
        assert torch.equal(peft_model(input_ids=ids).logits, want)
        tr.save_pretrained(tmp_path / "merged", merged=True)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-4)
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
    assert tr.model.peft_config  # the trainer's own model kept its adapters (the merge was on a copy)


def test_the_replicas_merge_is_peft_merge_bit_for_bit(tiny_model_dir):
    tr = _trained(tiny_model_dir)
    merged = AdapterMerge(tiny_model_dir, LORA.scale).merged(tr.get_weights_numpy())
    import copy

    want = copy.deepcopy(tr.model).merge_and_unload().state_dict()
    assert set(merged) <= set(want)
    assert all(torch.equal(v, want[k]) for k, v in merged.items())
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           AdapterMerge(tiny_model_dir, LORA.scale).base["model.layers.0.self_attn.q_proj.weight"])


def test_targets_are_checked_against_the_model_directory(tiny_model_dir):
    assert unmatched_targets(tiny_model_dir, LORA.target_modules)[0] == []
    assert unmatched_targets(tiny_model_dir, ("all-linear",))[0] == []
    bad, ends = unmatched_targets(tiny_model_dir, ("q_proj", "qkv_proj"))
    assert bad == ["qkv_proj"] and "q_proj" in ends


def test_all_linear_adapts_every_projection_but_the_head(tiny_model_dir):
    tr = TorchTrainer(tiny_model_dir, CFG, lora=LoraSettings(2, 4.0, ("all-linear",)))
    assert len(tr.weights) == 2 * 7 * tr.model.config.num_hidden_layers
    assert not any("lm_head" in n for n in tr.weights)
