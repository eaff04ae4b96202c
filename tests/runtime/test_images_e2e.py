"""End to end on CPU with images in the prompt: ``bidirl train data.task=shapes model.kind=vl``.

One run (Ray, two vLLM engines, the tiny Idefics3 model warm started on the shapes task)
checked for many things, as ``test_train_e2e.py`` does for text: the audit, validation on
image prompts, the checkpoint; then resumed for two more steps (the store's buffered
groups come back with their images); then exported, and the export loads back with
``AutoModelForImageTextToText`` and ``AutoProcessor``.
"""

from __future__ import annotations

import json

import pytest
import yaml
from runtime_cli_helpers import assert_run_sound, run_cli

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ARGS = ["data.task=shapes", "model.kind=vl", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=16", "trainer.micro_batch_size=8", "run.val_every=2", "data.val_max_samples=8",
        "scheduler.policy=bidirl", "scheduler.staleness=1", "run.checkpoint_every=2"]


def test_images_train_validate_resume_and_export(tmp_path, real_runtime_available):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *ARGS, "run.steps=4")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "load it with AutoModelForImageTextToText" in out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"] and summary["groups_trained"] == 16
    val = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if "val/score/mean" in ln]
    assert len(val) >= 2 and summary["val_score"] == val[-1]["val/score/mean"]
    samples = [json.loads(ln) for ln in (run / "samples.jsonl").read_text().splitlines()]
    assert any(s["kind"] == "val" and s["prompt"].count("<image>") == 1 for s in samples), \
        "the prompt as vLLM got it: one placeholder per image"
    scenario = yaml.safe_load((run / "scenario.yaml").read_text())["workload"]  # the pictures, as trained
    assert (scenario["images_per_prompt"], scenario["image_pixels"]) == (1, 64 * 64) and scenario["image_bytes"] > 0
    state = json.loads((run / "checkpoints" / "step_4" / "state.json").read_text())
    assert all(len(g["images"]) == 1 and len(g["train_prompt_ids"]) > len(g["prompt_ids"])
               for g in state["store"]["groups"])

    out = run_cli("train", "--resume", str(run), "run.steps=6")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from" in out.stderr
    assert_run_sound(run, 6)

    export = tmp_path / "export"
    out = run_cli("export", str(run), str(export))
    assert out.returncode == 0, out.stderr[-2000:]
    model = AutoModelForImageTextToText.from_pretrained(str(export), dtype=torch.float32)
    proc = AutoProcessor.from_pretrained(str(export))
    assert model.config.model_type == "idefics3" and proc.image_processor is not None
