"""Images in the prompt: their tokens and the vision encoder's prefill cost, priced from profiles.

A vision-language model turns an image of ``P`` pixels (after its processor's resize) into
``P / patch^2`` patches that run through its vision tower, then merges ``merge x merge``
patches into one language-model token::

    image tokens  = P / (patch * merge)^2                (448 x 448, Qwen3-VL: 196; Qwen2.5-VL: 256)
    tower FLOPs   = patches * 2 * (tower params - mergers * (1 - 1/merge^2))     (the mergers run per token)
                  + patches^2 * 4 * hidden * full-attention layers               (attention inside the image)
    prefill cost  = images * (tower FLOPs / tp / (peak * efficiency) + image bytes / host bandwidth)

per prompt, at the efficiency the text prefill prior uses.  Window attention (Qwen2.5-VL's
other 28 layers) and the patch embedding's convolution are left out: both are a few percent.
The language model prefills the image tokens as prompt tokens (``workload.prompt_tokens``
counts them).  Pure: profiles in, seconds and counts out.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.perf.profiles import HardwareProfile, ModelProfile


@dataclass(frozen=True)
class ImageLoad:
    """The images of one prompt: how many, their pixels after the processor's resize, and the
    encoded bytes of each (what a rollout request carries to the device's host)."""

    images: int = 0
    pixels: int = 448 * 448
    bytes_each: int = 0


def image_tokens(m: ModelProfile, pixels: float) -> float:
    """Language-model tokens one image of ``pixels`` becomes (0 for a model without a tower)."""
    if not m.vision_patch:
        return 0.0
    return pixels / (m.vision_patch * m.vision_merge) ** 2


def tower_flops(m: ModelProfile, pixels: float) -> float:
    """Forward FLOPs of the vision tower on one image (module docstring)."""
    if not m.vision_patch:
        return 0.0
    patches = pixels / m.vision_patch**2
    per_patch = m.vision_params - m.vision_merger_params * (1 - 1 / m.vision_merge**2)
    return patches * 2 * per_patch + patches**2 * 4 * m.vision_hidden * m.vision_attention_layers


def vision_prefill_s(hw: HardwareProfile, m: ModelProfile, tp: int, load: ImageLoad) -> float:
    """Seconds the vision encoder adds to one prompt's prefill on a replica of ``tp`` devices."""
    if not load.images or not m.vision_patch:
        return 0.0
    flops = hw.peak_tflops * 1e12 * max(hw.train_mfu, 0.3)  # as the text prefill prior
    per_image = tower_flops(m, load.pixels) / tp / flops + load.bytes_each / (hw.host_gbps * 1e9)
    return load.images * per_image
