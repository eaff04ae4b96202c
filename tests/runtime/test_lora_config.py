"""LoRA's config fields: defaults (off), veRL's names, bad values refused naming the field,
what the workers are sent, and targets checked against the model before any worker starts."""

from __future__ import annotations

import pytest

from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.launch import worker_settings


def test_lora_is_off_by_default_and_nothing_about_it_is_sent():
    cfg = load_config(None, [])
    assert cfg.model.lora_rank == 0
    rollout, trainer = worker_settings(cfg, "/models/m", 90)
    assert "lora_scale" not in rollout and "lora" not in trainer


def test_the_fields_and_veRLs_names_reach_both_sides():
    from bidirl.engines.lora import LoraSettings

    cfg = load_config(None, ["model.lora_rank=16", "model.lora_alpha=64", "model.lora_target_modules=q_proj,v_proj"])
    rollout, trainer = worker_settings(cfg, "/models/m", 90)
    assert rollout["lora_scale"] == 4.0
    assert LoraSettings.from_wire(trainer["lora"]) == LoraSettings(16, 64.0, ("q_proj", "v_proj"))
    verl = load_config(None, ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                              "actor_rollout_ref.model.target_modules=all-linear"])
    assert (verl.model.lora_rank, verl.model.lora_alpha, verl.model.lora_target_modules) == (8, 16.0, ["all-linear"])


@pytest.mark.parametrize("override, field", [
    ("model.lora_rank=-1", "model.lora_rank"),
    ("model.lora_rank=4.5", "model.lora_rank"),
    ("model.lora_alpha=0", "model.lora_alpha"),
    ("model.lora_target_modules=[]", "model.lora_target_modules"),
    ("model.lora_target_modules=all-linear,q_proj", "model.lora_target_modules"),
])
def test_bad_values_fail_in_one_line_naming_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.lora_rank=8", override])
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_a_target_the_model_lacks_is_named_before_any_worker(tiny_model_dir):
    from bidirl.runtime.model_check import check_lora_targets

    check_lora_targets(load_config(None, ["model.lora_rank=8"]), tiny_model_dir)
    with pytest.raises(ConfigError, match=r"^model.lora_target_modules: c_attn name\(s\) no layer .* q_proj"):
        check_lora_targets(load_config(None, ["model.lora_rank=8", "model.lora_target_modules=q_proj,c_attn"]),
                           tiny_model_dir)
    with pytest.raises(ConfigError, match=r"^trainer.strategy: fsdp2 with model.lora_rank > 0 .*strategy=ddp$"):
        check_lora_targets(load_config(None, ["model.lora_rank=8", "trainer.strategy=fsdp2",
                                              "cluster.train_devices=2"]), tiny_model_dir)


def test_an_adapter_checkpoint_resumes_and_exports_as_adapters_or_merged(tiny_model_dir, tmp_path, capsys):
    """A LoRA run's checkpoint holds an adapter directory: it is a usable checkpoint, ``bidirl
    export`` copies it, ``--merged`` writes a full model directory of base + adapters."""
    import shutil

    import torch
    from test_resume_files import PPS, _checkpoint, _run_dir
    from transformers import AutoModelForCausalLM

    from bidirl.cli import main
    from bidirl.engines.lora import LoraSettings
    from bidirl.engines.trainer_torch import TorchTrainer
    from bidirl.runtime.checkpoint_integrity import write_manifest
    from bidirl.runtime.checkpoints import select_checkpoint

    tr = TorchTrainer(tiny_model_dir, lora=LoraSettings(4, 8.0, ("q_proj", "v_proj")))
    with torch.no_grad():
        for name, p in tr.weights.items():
            p.add_(0.1 if "lora_B" in name else 0.0)
    run = _run_dir(tmp_path, 4)
    ck = _checkpoint(run, 4)
    shutil.rmtree(ck / "model")
    tr.save_pretrained(ck / "model")
    write_manifest(ck)
    assert select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)[0] == ck

    assert main(["export", str(run), str(tmp_path / "adapter")]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {f.name for f in (tmp_path / "adapter").iterdir()}
    assert main(["export", "--merged", str(run), str(tmp_path / "merged")]) == 0
    ids = torch.tensor([[1, 5, 106, 118, 119, 6]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(input_ids=ids).logits
        assert torch.allclose(got, tr.model(input_ids=ids).logits, atol=1e-4)
    capsys.readouterr()
    (tmp_path / "full").mkdir()
    full = _run_dir(tmp_path / "full", 4, checkpoints=(4,))
    write_manifest(full / "checkpoints" / "step_4")
    assert main(["export", "--merged", str(full), str(tmp_path / "x")]) == 2
    assert "holds full weights already" in capsys.readouterr().err
