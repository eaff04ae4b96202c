"""Hugging Face model directories on disk, and the one switch for Hugging Face's progress bars.

What the trainer writes (a checkpoint's ``model/``, ``save_pretrained``) is a complete
model directory that ``AutoModelForCausalLM``, ``AutoTokenizer`` and ``vllm.LLM`` load as
is, and never one with NaN or inf in it.  This module is torch-free at import (torch,
transformers and safetensors load inside the functions that use them), so the model
builders and the device worker import it at no cost.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bidirl.engines.trainer_config import NonFiniteWeightsError

__all__ = ["TOKENIZER_FILES", "auto_model_class", "check_finite", "is_vision_language", "load_weights",
           "quiet_hf_progress_bars", "write_model_dir"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "processor_config.json", "preprocessor_config.json")
"""What a model directory holds beside the weights and configs for ``AutoTokenizer``,
``AutoProcessor`` (a vision-language model's image processor) and vLLM."""


def is_vision_language(model_dir: str | Path) -> bool:
    """Whether ``model_dir``'s ``config.json`` describes a vision-language model (a ``vision_config``)."""
    try:
        return "vision_config" in json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False


def auto_model_class(model_dir: str | Path):
    """``AutoModelForImageTextToText`` for a vision-language directory, else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(model_dir) else AutoModelForCausalLM


def quiet_hf_progress_bars() -> None:
    """Hugging Face's progress bars off in this process from now on (idempotent).

    The one place bidirl silences them (a loading bar per model, a saving bar per
    checkpoint).  ``HF_HUB_DISABLE_PROGRESS_BARS`` covers a ``huggingface_hub`` or
    ``transformers`` imported later, and the processes this one starts; one imported
    already has read it, so its own switch is flipped too.  Called by the processes that
    load or save models: each device worker, and the model builders (the tiny model, the
    warm start, ``make_model``) in the process that calls them.
    """
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # huggingface_hub's as well
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def check_finite(weights: dict[str, Any], where: Path, version: int) -> None:
    """Refuse (``NonFiniteWeightsError``) to write ``where`` from weights with NaN or inf."""
    import torch

    bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise NonFiniteWeightsError(
            f"refusing to write {where}: {len(bad)} weight tensor(s) hold NaN/inf at version "
            f"{version} (first: {bad[0]}); the last checkpoint written stays the good one")


def write_model_dir(model, out_dir: Path, base_dir: Path, state_dict: dict | None = None) -> Path:
    """``model``'s weights (or ``state_dict``, by the same names) and configs (safetensors; a
    tied head stored once, as ``transformers`` stores it) and ``base_dir``'s tokenizer files
    and chat template."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, state_dict=state_dict)  # safetensors; drops the tied copy (lm_head) itself
    for f in base_dir.iterdir():
        if f.is_file() and (f.name in TOKENIZER_FILES or f.name.startswith("tokenizer")):
            shutil.copy2(f, out_dir / f.name)
    return out_dir


def load_weights(model, model_dir: Path, device: str) -> None:
    """Overwrite ``model``'s weights with ``model_dir``'s.

    A model directory is read back by ``transformers`` (the writer: tied weights and any
    renaming on save are undone alike); a bare ``model.safetensors`` (checkpoints before
    model directories) by safetensors, shared tensors allowed."""
    import torch

    with torch.no_grad():
        if (model_dir / "config.json").is_file():
            saved = auto_model_class(model_dir).from_pretrained(str(model_dir), dtype=torch.float32)
            model.load_state_dict(saved.state_dict())
            del saved
        else:
            from safetensors.torch import load_model

            load_model(model, str(model_dir / "model.safetensors"), device=device)
