"""Build a Qwen2.5-VL-shaped vision-language model with random weights, locally.

Why: Qwen2.5-VL is what vision-language GRPO runs train (veRL's geo3k recipe), and a GPU
run has to be exercised on its architecture without downloading it.  On this CPU machine
vLLM cannot serve it (its Qwen-VL code imports torchvision's image processors, see
``runtime/model_check.py``), so the CPU end-to-end path keeps ``models/tiny_vl.py``'s
Idefics3 model; what runs here on this directory is the trainer side (the PIL image
processor, the 3-D rotary positions: ``engines/vision_inputs.py``) and the data path.

What it holds (the files a downloaded Qwen2.5-VL holds): ``config.json``
(``Qwen2_5_VLForConditionalGeneration``: the windowed-attention vision tower and its patch
merger, a Qwen2 text model with multimodal rotary sections), ``model.safetensors``, the
tokenizer, ``preprocessor_config.json`` / ``processor_config.json`` (the PIL image
processor ``Qwen2VLImageProcessorPil``: 14-pixel patches, 2 x 2 merged into one token,
images resized to between ``min_pixels`` and ``max_pixels``) and ``chat_template.jinja``.

The tokenizer is the text tiny model's character-level one (:mod:`bidirl.models.tiny`:
7 special tokens + 256 bytes) plus Qwen's ``<|vision_start|>``, ``<|vision_end|>``,
``<|image_pad|>`` and ``<|video_pad|>`` (ids 263-266, ``config.json``'s
``vision_start_token_id`` ... ``video_token_id``).  The chat template is the tiny model's,
taking a message's content as a string or as a list of parts (``tiny_vl.parts_chat_template``);
an image part renders as Qwen's ``<|vision_start|><|image_pad|><|vision_end|>``, and the
processor expands ``<|image_pad|>`` to the image's tokens (its patch grid over 4)::

    <|bos|><|user|><|vision_start|><|image_pad|>x16<|vision_end|>How many circles?<|assistant|>

The processor ``AutoProcessor`` loads: ``Qwen2_5_VLProcessor`` where torchvision is installed
(a GPU machine).  Without torchvision that class can be neither built nor loaded (it always
loads a video processor, and transformers' video processors need torchvision), so the
directory names transformers' ``PaddleOCRVLProcessor`` instead: an image processor and a
tokenizer, no video, and Qwen2-VL's image-token rule (``<|image_pad|>`` times the grid's
patches over ``merge_size**2``): the same ids and pixels for images.  vLLM loads
``Qwen2_5_VLProcessor`` itself whatever the directory names.

:data:`QWEN2_5_VL_3B` gives Qwen2.5-VL-3B-Instruct's text and vision shape (3.75B
parameters; the vocabulary rows too, though the tokenizer stays this one).
"""

from __future__ import annotations

from pathlib import Path

from bidirl.engines.hf_io import quiet_hf_progress_bars
from bidirl.models.tiny import BOS, EOS, PAD, VOCAB_SIZE, build_tokenizer, built_as, edit_json, write_model_dir
from bidirl.models.tiny_vl import parts_chat_template

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
QWEN_VL_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
CHAT_TEMPLATE = parts_chat_template(VISION_START + IMAGE_PAD + VISION_END)
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE, WINDOW_SIZE = 14, 2, 2, 112
"""Qwen2.5-VL's vision geometry (every size of it keeps these)."""
_MARKER = "bidirl_tiny_qwen_vl.json"

QWEN2_5_VL_3B = dict(layers=36, hidden=2048, intermediate=11008, heads=16, kv_heads=2, vision_depth=32,
                     vision_hidden=1280, vision_intermediate=3420, vision_heads=16, vocab_size=151936,
                     tie_word_embeddings=True, rope_theta=1000000.0, max_len=128000, min_pixels=56 * 56,
                     max_pixels=28 * 28 * 16384)
"""Qwen/Qwen2.5-VL-3B-Instruct's config.json and preprocessor_config.json, as
:func:`build_tiny_qwen_vl_model` arguments (``dtype="bfloat16"`` halves the 15 GB of float32)."""


def build_qwen_vl_tokenizer():
    """The tiny model's character-level tokenizer plus Qwen-VL's vision tokens and the chat template."""
    tok = build_tokenizer(QWEN_VL_TOKENS, CHAT_TEMPLATE, model_max_length=1024,
                          named={"image_token": IMAGE_PAD, "video_token": VIDEO_PAD,
                                 "vision_bos_token": VISION_START, "vision_eos_token": VISION_END})
    if len(tok) > VOCAB_SIZE:
        raise AssertionError(f"{len(tok)} tokens do not fit {VOCAB_SIZE} embedding rows")
    return tok


def mrope_section(head_dim: int) -> list[int]:
    """The rotary frequencies per position axis (temporal, height, width): Qwen2.5-VL's
    [16, 24, 24] of a 128-wide head, scaled to ``head_dim`` (a multiple of 16)."""
    if head_dim % 16:
        raise ValueError(f"the text model's head size ({head_dim}) must be a multiple of 16 (3-D rotary sections)")
    half = head_dim // 2
    return [half // 4, 3 * half // 8, 3 * half // 8]


def full_attention_blocks(depth: int) -> list[int]:
    """The vision blocks that attend over the whole image (Qwen2.5-VL: every 8th; the others
    attend within 112-pixel windows); the last one at least."""
    return [i for i in range(depth) if i % 8 == 7] or [depth - 1]


def qwen_vl_config(tok, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int | None,
                   vision_depth: int, vision_hidden: int, vision_heads: int, vision_intermediate: int | None,
                   vocab_size: int, tie_word_embeddings: bool, rope_theta: float, max_len: int):
    """The ``Qwen2_5_VLConfig`` of that shape, with ``tok``'s special and vision token ids."""
    from transformers import Qwen2_5_VLConfig

    if hidden % heads or heads % kv_heads or vision_hidden % vision_heads:
        raise ValueError("hidden sizes must divide by their heads, and heads by kv_heads")
    if vocab_size < len(tok):
        raise ValueError(f"vocab_size ({vocab_size}) is below the tokenizer's {len(tok)} tokens")
    ids = tok.convert_tokens_to_ids
    special = dict(bos_token_id=ids(BOS), eos_token_id=ids(EOS), pad_token_id=ids(PAD))
    text = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=max_len, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False,
                tie_word_embeddings=tie_word_embeddings, **special,
                rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                 "mrope_section": mrope_section(hidden // heads)})
    vision = dict(depth=vision_depth, hidden_size=vision_hidden, num_heads=vision_heads,
                  intermediate_size=vision_intermediate or 4 * vision_hidden, out_hidden_size=hidden,
                  patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                  window_size=WINDOW_SIZE, fullatt_block_indexes=full_attention_blocks(vision_depth),
                  hidden_act="silu", tokens_per_second=2)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids(IMAGE_PAD),
                            video_token_id=ids(VIDEO_PAD), vision_start_token_id=ids(VISION_START),
                            vision_end_token_id=ids(VISION_END), tie_word_embeddings=tie_word_embeddings, **special)


def processor_class_name() -> str:
    """The processor the directory names: Qwen's own where it can load (see the module doc)."""
    from transformers.utils import is_torchvision_available

    return "Qwen2_5_VLProcessor" if is_torchvision_available() else "PaddleOCRVLProcessor"


def build_qwen_vl_processor(tok, min_pixels: int, max_pixels: int):
    """The processor over the PIL image processor (:func:`processor_class_name`'s class)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    if processor_class_name() == "Qwen2_5_VLProcessor":
        from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

        videos = Qwen2VLVideoProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
        return Qwen2_5_VLProcessor(images, tok, videos, chat_template=CHAT_TEMPLATE)
    from transformers.models.paddleocr_vl.processing_paddleocr_vl import PaddleOCRVLProcessor

    return PaddleOCRVLProcessor(images, tok, chat_template=CHAT_TEMPLATE)


def build_tiny_qwen_vl_model(out_dir: str | Path, layers: int = 2, hidden: int = 128, heads: int = 4,
                             kv_heads: int = 2, intermediate: int | None = None, vision_depth: int = 2,
                             vision_hidden: int = 64, vision_heads: int = 2, vision_intermediate: int | None = None,
                             vocab_size: int = VOCAB_SIZE, tie_word_embeddings: bool = False,
                             rope_theta: float = 10000.0, max_len: int = 1024, min_pixels: int = 112 * 112,
                             max_pixels: int = 224 * 224, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a randomly initialised Qwen2.5-VL-shaped model, tokenizer and processor to ``out_dir``.

    The defaults are CPU-sized (2 layers of hidden 128, a 2-block vision tower of 64; a
    64 x 64 image becomes 112 x 112: 16 image tokens); ``**QWEN2_5_VL_3B`` is the real 3B
    shape.  ``intermediate`` / ``vision_intermediate`` default to 4 x the hidden size.
    Idempotent like :func:`bidirl.models.tiny.build_tiny_model`: a directory built with the
    same arguments (and the same processor class) is reused untouched.
    """
    out_dir = Path(out_dir)
    shape = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
                 vision_depth=vision_depth, vision_hidden=vision_hidden, vision_heads=vision_heads,
                 vision_intermediate=vision_intermediate, vocab_size=vocab_size,
                 tie_word_embeddings=tie_word_embeddings, rope_theta=rope_theta, max_len=max_len)
    spec = {**shape, "min_pixels": min_pixels, "max_pixels": max_pixels, "seed": seed, "dtype": dtype,
            "processor": processor_class_name(), "format": 1}
    if built_as(out_dir, spec, _MARKER):
        return out_dir
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    quiet_hf_progress_bars()
    tok = build_qwen_vl_tokenizer()
    config = qwen_vl_config(tok, **shape)
    processor = build_qwen_vl_processor(tok, min_pixels, max_pixels)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(getattr(torch, dtype))
    ids = tok.convert_tokens_to_ids
    model.generation_config = GenerationConfig(bos_token_id=ids(BOS), eos_token_id=ids(EOS), pad_token_id=ids(PAD))

    def write(d: Path) -> None:
        model.save_pretrained(d, safe_serialization=True)
        processor.save_pretrained(d)
        processor.image_processor.save_pretrained(d)  # preprocessor_config.json, as a downloaded one has
        _name_pil_classes(d)

    return write_model_dir(out_dir, spec, _MARKER, write)


def _name_pil_classes(d: Path) -> None:
    """The saved tokenizer class itself (loaded as is, not rebuilt as a ``Qwen2Tokenizer`` from
    the vocabulary) and the PIL image processor, which the saved configs name by its
    torchvision twin (``Qwen2VLImageProcessor``)."""
    pil = {"image_processor_type": "Qwen2VLImageProcessorPil"}
    edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
    edit_json(d / "processor_config.json", lambda c: c["image_processor"].update(pil))
    edit_json(d / "preprocessor_config.json", lambda c: c.update(pil))
