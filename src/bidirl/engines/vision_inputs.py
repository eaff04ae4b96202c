"""A vision-language model's image inputs in the trainer: pixels from the images' bytes.

Samples carry their prompt's images encoded (PNG, JPEG...: KBs, not pixel tensors), and the
trainer runs the model's own image processor on them (``AutoImageProcessor``: the PIL one
here, where torchvision cannot be installed; the one vLLM runs elsewhere).  The processor is
deterministic, so a primary and an auxiliary trainer build identical pixels from the same
bytes and the ordered merge of their gradients stays bitwise equal to one trainer's.

What the forward is given besides the ids (:meth:`VisionInputs.forward_kwargs`):

- the processor's outputs for the batch's images, in sample order (``pixel_values`` and,
  per model, ``pixel_attention_mask`` (Idefics3 / SmolVLM) or ``image_grid_thw`` (Qwen-VL));
  a model scatters the images' features into its image tokens in order, so samples without
  images are skipped;
- Qwen-VL's 3-D rotary positions (temporal, height, width: ``model.get_rope_index``) where
  the model has them; other models (Idefics3) use plain positions, which a right-padded
  batch gets by default.

:func:`vision_parameter_names` names the vision tower's parameters (``model.freeze_vision_tower``).
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import torch

_VISION_PREFIXES = ("vision_model", "vision_tower", "visual")
"""The vision tower's module name in Idefics3 / SmolVLM, LLaVA-style models and Qwen-VL."""


def vision_parameter_names(names) -> list[str]:
    """The parameters of the vision tower among ``names`` (its connector and the text model excluded)."""
    return [n for n in names if any(part in _VISION_PREFIXES for part in n.split("."))]


def decode(images: tuple[bytes, ...]) -> list:
    from PIL import Image  # lazy: a text run never decodes an image

    return [Image.open(io.BytesIO(b)).convert("RGB") for b in images]


class VisionInputs:
    """The image processor of one model directory, loaded at the first batch with images."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = str(model_dir)
        self._processor = None

    @property
    def processor(self):
        if self._processor is None:
            from transformers import AutoImageProcessor

            self._processor = AutoImageProcessor.from_pretrained(self.model_dir)
        return self._processor

    def pixel_inputs(self, images: list[tuple[bytes, ...]], device: str) -> dict[str, torch.Tensor]:
        """The processor's outputs for every sample's images, in order; empty without images."""
        nested = [decode(tuple(x)) for x in images if x]
        if not nested:
            return {}
        out = self.processor(images=nested, return_tensors="pt")
        return {k: v.to(device) for k, v in out.items() if isinstance(v, torch.Tensor)}

    def forward_kwargs(self, model, input_ids_B_L: torch.Tensor, attention_mask_B_L: torch.Tensor,
                       images: list[tuple[bytes, ...]], device: str) -> dict[str, Any]:
        """What ``model``'s forward takes besides the ids and the mask: pixel inputs and, for a
        model with 3-D rotary positions, its ``position_ids``."""
        pixels = self.pixel_inputs(images, device)
        if not pixels:
            return {}
        rope = rope_index_fn(model)
        if rope is not None:
            pixels["position_ids"] = rope(input_ids_B_L, pixels.get("image_grid_thw"), attention_mask_B_L)
        return pixels


def rope_index_fn(model):
    """``(input_ids, image_grid_thw, attention_mask) -> position_ids`` (3 x B x L) for a model
    with Qwen-VL's multimodal rotary positions (``get_rope_index``), else None.

    Computed here, not left to the forward: transformers' forward builds them only when it is
    also given ``mm_token_type_ids`` (its processor's output, which the trainer's ids do not
    come with) and silently falls back to plain positions otherwise.  The image tokens are
    found by ``config.image_token_id``."""
    inner = getattr(model, "model", model)
    fn = getattr(inner, "get_rope_index", None)
    if fn is None:
        return None
    takes_types = "mm_token_type_ids" in inspect.signature(fn).parameters
    image_token = model.config.image_token_id

    def positions(input_ids, image_grid_thw, attention_mask):
        kwargs = {"image_grid_thw": image_grid_thw, "attention_mask": attention_mask}
        if takes_types:
            kwargs["mm_token_type_ids"] = (input_ids == image_token).int()
        out = fn(input_ids, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return positions
