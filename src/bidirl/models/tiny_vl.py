"""Build a tiny SmolVLM-shaped (Idefics3) vision-language model with random weights, locally.

Why Idefics3: on this machine vLLM 0.32's Qwen-VL, Gemma 3, InternVL and LLaVA
implementations import transformers' torchvision-based image processors, and torchvision
cannot be installed beside CPU torch; Idefics3 (SmolVLM's architecture) runs its images
through transformers' PIL image processor (``Idefics3ImageProcessorPil``) in both the HF
forward and vLLM's engine.  So the CPU end-to-end path and the visual task's default model
are this directory, as the text path's is ``models/tiny.py``'s.

What it holds (the files a downloaded SmolVLM holds): ``config.json``
(``Idefics3ForConditionalGeneration``: a SigLIP-style vision tower, the pixel-shuffle
connector, a Llama text model), ``model.safetensors``, the tokenizer with Idefics3's image
tokens, ``preprocessor_config.json`` (the PIL image processor, no image splitting: one
``image_size`` tile per image) and ``processor_config.json`` / ``chat_template.jinja``.

The tokenizer is the text tiny model's character-level one (:mod:`bidirl.models.tiny`:
7 special tokens + 256 bytes) plus Idefics3's ``<fake_token_around_image>``, ``<image>``,
``<end_of_utterance>``, ``<global-img>`` and 36 ``<row_r_col_c>`` tokens: 303 tokens in
320 embedding rows.  The chat template is the tiny model's (``<|bos|><|user|>...<|assistant|>``)
and takes a message's content either as a string or as Idefics3's list of
``{"type": "image"}`` / ``{"type": "text", "text": ...}`` parts; each image part renders as
``<image>``, which the processor expands to :func:`tokens_per_image` tokens::

    <|bos|><|user|><fake_token_around_image><global-img><image>x16<fake_token_around_image>how many?<|assistant|>
"""

from __future__ import annotations

from pathlib import Path

from bidirl.engines.hf_io import quiet_hf_progress_bars
from bidirl.models.tiny import BOS, EOS, PAD, VOCAB_SIZE, build_tokenizer, built_as, edit_json, write_model_dir

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
ROW_COL_TOKENS = [f"<row_{r + 1}_col_{c + 1}>" for r in range(6) for c in range(6)]
VL_SPECIAL_TOKENS = [FAKE_IMAGE_TOKEN, IMAGE_TOKEN, END_OF_UTTERANCE, GLOBAL_IMAGE_TOKEN, *ROW_COL_TOKENS]



def parts_chat_template(image: str) -> str:
    """The tiny model's chat template taking a message's content as a string or as a list of
    ``{"type": "image"}`` / ``{"type": "text", "text": ...}`` parts, each image part rendered
    as ``image``."""
    return (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "<|{{ message['role'] }}|>"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}" + image
        + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )


CHAT_TEMPLATE = parts_chat_template(IMAGE_TOKEN)
_MARKER = "bidirl_tiny_vl.json"


def tokens_per_image(image_size: int = 64, patch_size: int = 8, scale_factor: int = 2) -> int:
    """``<image>`` tokens one image becomes: the vision tower's patches over the pixel shuffle's
    ``scale_factor**2`` (Idefics3's ``image_seq_len``), plus 3 around them (two
    ``<fake_token_around_image>`` and ``<global-img>``) since images are not split."""
    return (image_size // patch_size) ** 2 // scale_factor**2 + 3


def build_vl_tokenizer():
    """The tiny model's character-level tokenizer plus Idefics3's image tokens and the chat template."""
    tok = build_tokenizer(VL_SPECIAL_TOKENS, CHAT_TEMPLATE, model_max_length=1024)
    if len(tok) > VOCAB_SIZE:
        raise AssertionError(f"{len(tok)} tokens do not fit {VOCAB_SIZE} embedding rows")
    return tok


def _spec(**shape) -> dict:
    return {**shape, "vocab_size": VOCAB_SIZE, "format": 1}


def vl_config(tok, layers: int, hidden: int, heads: int, kv_heads: int, vision_hidden: int, vision_layers: int,
              vision_heads: int, image_size: int, patch_size: int, scale_factor: int, max_len: int):
    """The ``Idefics3Config``: a Llama text model of the tiny model's shape and a small SigLIP tower."""
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig

    if hidden % heads or heads % kv_heads or vision_hidden % vision_heads:
        raise ValueError("hidden sizes must divide by their heads, and heads by kv_heads")
    if image_size % (patch_size * scale_factor):
        raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size x scale_factor")
    ids = tok.convert_tokens_to_ids
    text = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=hidden // heads, max_position_embeddings=max_len, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                       bos_token_id=ids(BOS), eos_token_id=ids(EOS), pad_token_id=ids(PAD))
    vision = Idefics3VisionConfig(hidden_size=vision_hidden, intermediate_size=4 * vision_hidden,
                                  num_hidden_layers=vision_layers, num_attention_heads=vision_heads,
                                  image_size=image_size, patch_size=patch_size)
    return Idefics3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=scale_factor,
                          image_token_id=ids(IMAGE_TOKEN), pad_token_id=ids(PAD), tie_word_embeddings=False,
                          bos_token_id=ids(BOS), eos_token_id=ids(EOS))


def build_processor(tok, image_size: int, patch_size: int, scale_factor: int):
    """``Idefics3Processor`` over the PIL image processor: one ``image_size`` tile per image."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": image_size},
                                       max_image_size={"longest_edge": image_size})
    seq = (image_size // patch_size) ** 2 // scale_factor**2
    return Idefics3Processor(images, tok, image_seq_len=seq, chat_template=CHAT_TEMPLATE)


def build_tiny_vl_model(out_dir: str | Path, layers: int = 2, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                        vision_hidden: int = 64, vision_layers: int = 2, vision_heads: int = 2,
                        image_size: int = 64, patch_size: int = 8, scale_factor: int = 2, seed: int = 0,
                        max_len: int = 1024) -> Path:
    """Write a randomly initialised tiny Idefics3 model, tokenizer and processor to ``out_dir``.

    Idempotent like :func:`bidirl.models.tiny.build_tiny_model`: a directory built with the
    same arguments is reused untouched; a new one is written beside it and renamed into place.
    """
    out_dir = Path(out_dir)
    shape = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vision_hidden=vision_hidden,
                 vision_layers=vision_layers, vision_heads=vision_heads, image_size=image_size,
                 patch_size=patch_size, scale_factor=scale_factor, max_len=max_len)
    spec = _spec(seed=seed, **shape)
    if built_as(out_dir, spec, _MARKER):
        return out_dir
    import torch
    from transformers import GenerationConfig, Idefics3ForConditionalGeneration

    quiet_hf_progress_bars()
    tok = build_vl_tokenizer()
    config = vl_config(tok, **shape)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    ids = tok.convert_tokens_to_ids
    model.generation_config = GenerationConfig(bos_token_id=ids(BOS), eos_token_id=ids(EOS), pad_token_id=ids(PAD))
    processor = build_processor(tok, image_size, patch_size, scale_factor)

    def write(d: Path) -> None:
        model.save_pretrained(d, safe_serialization=True)
        processor.save_pretrained(d)
        _name_pil_classes(d)

    return write_model_dir(out_dir, spec, _MARKER, write)


def _name_pil_classes(d: Path) -> None:
    """Name the classes the directory must load with.  The fast tokenizer class itself, so
    ``AutoTokenizer`` loads the saved tokenizer as is (no model-type tokenizer rebuilt from the
    vocabulary); the PIL image processor, which transformers would otherwise reach only by
    falling back (with a warning) from the torchvision one it names by default."""
    edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
    edit_json(d / "processor_config.json",
              lambda c: c["image_processor"].update(image_processor_type="Idefics3ImageProcessorPil"))
