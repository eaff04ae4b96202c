"""Build a tiny Qwen2-architecture model with a local character-level tokenizer.

Why: this machine may not download models, yet the real runtime (vLLM rollout, torch
training) must be exercised end to end. A randomly initialised ``Qwen2ForCausalLM`` saved as
an ordinary HF directory loads unchanged in ``AutoModelForCausalLM.from_pretrained`` and in
``vllm.LLM``; a character vocabulary keeps the tokenizer local and the vocabulary tiny (320 rows),
so a 2-layer model generates thousands of tokens per second on one core.

The chat template is deliberately simple and has no whitespace of its own::

    <|bos|><|user|>copy 4821<|assistant|>4821<|eos|>

Special tokens are matched whole by the tokenizer (added tokens); every other byte is one
token, so every ASCII character is one token and no text is unknown.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bidirl.engines.hf_io import quiet_hf_progress_bars

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS, UNK = SPECIAL_TOKENS[:4]
VOCAB_SIZE = 320
"""Embedding rows: 7 special tokens + 256 byte tokens, padded to a multiple of 64."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_MARKER = "bidirl_tiny.json"


def char_vocab() -> dict[str, int]:
    """Token -> id: special tokens first (ids 0..6), then one token per byte (id 7 + byte).

    Bytes are spelled the GPT-2 "byte-level" way (space is ``Ġ``, newline ``Ċ``), so any
    text encodes without an unknown token and ASCII characters are exactly one token each.
    """
    from tokenizers.pre_tokenizers import ByteLevel

    byte_chars = sorted(ByteLevel.alphabet(), key=_byte_of)
    tokens = SPECIAL_TOKENS + byte_chars
    return {tok: i for i, tok in enumerate(tokens)}


def _byte_of(char: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode for one character."""
    code = ord(char)
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def build_tokenizer(extra_special: Sequence[str] = (), chat_template: str = CHAT_TEMPLATE,
                    model_max_length: int = 512, named: dict[str, str] | None = None):
    """A ``PreTrainedTokenizerFast`` over :func:`char_vocab` with the chat template set.

    ``extra_special`` are added after the 7 special tokens (ids 263...: a vision-language
    model's image tokens); ``named`` gives some of them a name the tokenizer exposes as an
    attribute (``{"image_token": "<|image_pad|>"}``: ``tok.image_token``, ``tok.image_token_id``),
    which processors read.

    Why byte-level BPE with *no merges* rather than WordLevel: for ``model_type == "qwen2"``
    transformers 5's ``AutoTokenizer`` (and so vLLM) ignores the saved tokenizer class and
    rebuilds a ``Qwen2Tokenizer`` from the vocabulary and merges with Qwen2's own pipeline
    (regex split + byte-level). A WordLevel character vocabulary loses spaces and newlines
    in that rebuild; a merge-free byte-level BPE is character-level *and* survives it, so the
    tokenizer saved here, the one ``AutoTokenizer`` loads and vLLM's agree id for id.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    core = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*SPECIAL_TOKENS, *extra_special]])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                  additional_special_tokens=[*SPECIAL_TOKENS[4:], *extra_special],
                                  clean_up_tokenization_spaces=False, model_max_length=model_max_length,
                                  **({"extra_special_tokens": dict(named)} if named else {}))
    tok.chat_template = chat_template
    return tok


def _spec(layers: int, hidden: int, heads: int, kv_heads: int, seed: int, max_len: int) -> dict:
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "seed": seed, "max_len": max_len,
            "vocab_size": VOCAB_SIZE, "format": 1}


def tiny_config(layers: int, hidden: int, heads: int, kv_heads: int, max_len: int = 512):
    from transformers import Qwen2Config

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})")
    vocab = char_vocab()
    return Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=hidden // heads,
                       max_position_embeddings=max_len, rms_norm_eps=1e-6, rope_theta=10000.0,
                       tie_word_embeddings=False, use_sliding_window=False, bos_token_id=vocab[BOS],
                       eos_token_id=vocab[EOS], pad_token_id=vocab[PAD], torch_dtype="float32")


def build_tiny_model(out_dir: str | Path, layers: int = 2, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                     seed: int = 0, max_len: int = 512) -> Path:
    """Write a randomly initialised tiny Qwen2 model + tokenizer to ``out_dir``; return it.

    Idempotent: if ``out_dir`` already holds a model built with the same arguments it is
    reused untouched. The directory is written to a temporary sibling and renamed into place,
    so concurrent builders (tests, Ray workers) never see a half-written model.
    """
    out_dir = Path(out_dir)
    spec = _spec(layers, hidden, heads, kv_heads, seed, max_len)
    if built_as(out_dir, spec):
        return out_dir
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    quiet_hf_progress_bars()
    config = tiny_config(layers, hidden, heads, kv_heads, max_len)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    tok = build_tokenizer()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)

    def write(d: Path) -> None:
        model.save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)

    return write_model_dir(out_dir, spec, _MARKER, write)


def write_model_dir(out_dir: Path, spec: dict, marker_name: str, write: Callable[[Path], None]) -> Path:
    """``write(d)`` into a temporary sibling of ``out_dir``, mark it as built from ``spec``
    (:func:`built_as`) and rename it into place: concurrent builders (tests, Ray workers)
    never see a half-written model."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(tmp)
        (tmp / marker_name).write_text(json.dumps(spec, indent=1, sort_keys=True))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def built_as(out_dir: Path, spec: dict, marker_name: str = _MARKER) -> bool:
    """Whether ``out_dir`` holds weights built from ``spec`` (its marker file says so)."""
    marker = out_dir / marker_name
    if not (marker.is_file() and (out_dir / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(marker.read_text()) == spec
    except (OSError, json.JSONDecodeError):
        return False


def replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``, replacing an older build; safe if another process won."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old.{os.getpid()}")
        os.replace(dst, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(src, dst)
    except OSError:
        if not dst.exists():  # lost a race to another builder: theirs is equally good
            raise


def edit_json(path: Path, edit: Callable[[dict], object]) -> None:
    """Rewrite a JSON file after ``edit`` (in place) changes its object."""
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def encode_prompt(tokenizer, messages) -> list[int]:
    """Chat-template token ids for a prompt, ending with the assistant tag."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
