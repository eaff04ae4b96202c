"""LoRA: low-rank adapters trained on a frozen base model, and what a replica does with them.

With ``model.lora_rank > 0`` the trainer wraps its model with PEFT: every target linear
layer ``W0`` (``model.lora_target_modules``) gains two adapters, ``A`` (rank x in) and ``B``
(out x rank, zero at the start), and computes ``x W0^T + scale * (x A^T) B^T`` with
``scale = lora_alpha / lora_rank``.  Only ``A`` and ``B`` train: they alone have gradients
and AdamW state, they alone are checkpointed, and they alone cross to auxiliary trainers
and to replicas.  Why: a weight sync then carries the adapters, not the model (rank 16:
0.36 MB for the default tiny model against 2.3 MB; 40 MB for a Qwen3-0.6B shape against
2.4 GB in fp32: docs/algorithm.md, "LoRA").

Names: an adapter tensor is named as PEFT saves it (``base_model.model.<module>.lora_A.weight``),
on the wire and in ``adapter_model.safetensors`` alike, so a checkpoint's ``model/`` is a PEFT
adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) that
``peft.PeftModel.from_pretrained(base, dir)`` loads.

The replica (:class:`AdapterMerge`, used by ``runtime/rollout_role.py``) keeps the base
weights it loaded and merges each adapter it receives, ``W = W0 + (B @ A) * scale`` in fp32
(PEFT's own merge, so the merged weights are ``merge_and_unload``'s, bit for bit), then
loads the whole set into vLLM as a full sync would.  Why not vLLM's LoRA (``enable_lora``,
``LoRARequest``): vLLM 0.32 serves it on a CPU and its log-probs agree with PEFT's
(5e-7), but its decode ran 3-6x slower on the tiny model (4,096 tokens: 14-25 s against
3.3-4.5 s), where a merge costs one small matmul per layer per sync.

Torch and PEFT load inside the functions that use them: the driver checks the targets
against a model directory's tensor names (:func:`unmatched_targets`) without either.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ALL_LINEAR = "all-linear"
"""PEFT's name for every linear layer but the output head (veRL's default target)."""
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraSettings:
    """``model.lora_rank``, ``lora_alpha`` and ``lora_target_modules`` (rank > 0: LoRA is on)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def wire(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules)}

    @classmethod
    def from_wire(cls, wire: dict[str, Any] | None) -> LoraSettings | None:
        if not wire:
            return None
        return cls(int(wire["rank"]), float(wire["alpha"]), tuple(wire["target_modules"]))


def lora_settings(model_cfg) -> LoraSettings | None:
    """The train config's ``model`` section's LoRA fields; None when ``lora_rank`` is 0."""
    if not model_cfg.lora_rank:
        return None
    return LoraSettings(model_cfg.lora_rank, model_cfg.lora_alpha, tuple(model_cfg.lora_target_modules))


# -- the trainer's side --------------------------------------------------------------------------
def with_lora(model, settings: LoraSettings):
    """``model`` (its weights frozen) with fresh adapters on the target layers: PEFT's model.

    Dropout is 0: a random mask would make an auxiliary trainer's gradient differ from the
    primary's and the trainer's log-probs from the replica's."""
    from peft import LoraConfig, get_peft_model

    targets = ALL_LINEAR if settings.target_modules == (ALL_LINEAR,) else list(settings.target_modules)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=targets, lora_dropout=0.0,
                        bias="none")
    return get_peft_model(model, config)


def adapter_parameters(model) -> dict[str, Any]:
    """The adapters' parameters by the names PEFT saves them under (the adapter's own name dropped)."""
    tag = f".{model.active_adapter}."
    return {name.replace(tag, "."): p for name, p in model.named_parameters() if p.requires_grad}


def save_adapter(model, out_dir: Path) -> Path:
    """``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT's adapter directory)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    return out_dir


def is_adapter_dir(model_dir: str | Path) -> bool:
    return (Path(model_dir) / ADAPTER_CONFIG).is_file()


def read_adapter(model_dir: str | Path) -> dict[str, np.ndarray]:
    """An adapter directory's tensors, by their saved names."""
    from safetensors.numpy import load_file

    return load_file(str(Path(model_dir) / ADAPTER_WEIGHTS))


def write_merged(model, out_dir: Path, base_dir: Path) -> Path:
    """A full Hugging Face model directory of ``model`` (PEFT's) with its adapters merged in."""
    from bidirl.engines.hf_io import write_model_dir  # lazy: hf_io is the trainer's, beside this module

    merged = copy.deepcopy(model).merge_and_unload()
    return write_model_dir(merged, out_dir, base_dir)


def export_merged(adapter_dir: Path, out_dir: Path) -> Path:
    """``bidirl export --merged``: the adapter directory's base model with the adapters merged
    in, as a full Hugging Face model directory (the base's tokenizer files with it)."""
    import torch
    from peft import PeftModel

    from bidirl.engines.hf_io import auto_model_class, quiet_hf_progress_bars, write_model_dir  # lazy: as above

    quiet_hf_progress_bars()
    base_dir = Path(json.loads((adapter_dir / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{adapter_dir / ADAPTER_CONFIG}: its base model {base_dir} is not a model directory "
                                "any more; the merge needs the model the run trained on")
    base = auto_model_class(base_dir).from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    return write_model_dir(merged, out_dir, base_dir)


# -- the replica's side ---------------------------------------------------------------------------
def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return [model_dir / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(model_dir.glob("*.safetensors"))


def adapter_pairs(adapter: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Base weight name -> (A, B) of the adapters on it."""
    out: dict[str, tuple[Any, Any]] = {}
    for name in adapter:
        if name.endswith(".lora_A.weight"):
            module = name[: -len(".lora_A.weight")]
            key = (module[len(_PREFIX):] if module.startswith(_PREFIX) else module) + ".weight"
            out[key] = (adapter[name], adapter[f"{module}.lora_B.weight"])
    return out


class AdapterMerge:
    """A replica's base weights (as its model directory stores them) and the merge of each
    adapter it is sent; the merged set is what goes into vLLM."""

    def __init__(self, model_dir: str | Path, scale: float) -> None:
        from safetensors.torch import load_file

        self.scale = scale
        self.base: dict[str, Any] = {}
        for f in _weight_files(Path(model_dir)):
            self.base.update(load_file(str(f)))

    def merged(self, adapter: dict[str, np.ndarray]) -> dict[str, Any]:
        """Every base weight, those with adapters as ``W0 + (B @ A) * scale`` in fp32."""
        import torch

        out = dict(self.base)
        for key, (a, b) in adapter_pairs(adapter).items():
            if key not in self.base:
                raise KeyError(f"an adapter on {key}, which the replica's model directory does not hold")
            delta = _cpu_f32(b) @ _cpu_f32(a)
            out[key] = self.base[key].to(torch.float32) + delta * self.scale
        return out


def _cpu_f32(x):
    """An adapter tensor as a CPU fp32 tensor: a numpy array (Ray's object store) or a tensor
    (a collective's buckets, on CUDA there)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float32)
    return torch.as_tensor(np.array(x, np.float32))


# -- the driver's check ---------------------------------------------------------------------------
def unmatched_targets(model_dir: str | Path, targets: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the targets that name no layer of ``model_dir``, the names its layers end in), read
    from its safetensors headers: a typo fails before any worker starts, not inside one.
    A target matches a module whose dotted name is it or ends with ``.`` + it (PEFT's rule)."""
    from safetensors import safe_open

    modules = set()
    for f in _weight_files(Path(model_dir)):
        with safe_open(str(f), "np") as st:
            modules |= {k.rsplit(".", 1)[0] for k in st.keys() if k.endswith(".weight")}
    ends = sorted({m.rsplit(".", 1)[-1] for m in modules})
    if tuple(targets) == (ALL_LINEAR,):
        return [], ends
    return [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)], ends
