"""Hugging Face model directories of real architectures, built locally with random weights.

Why: a machine that may not download still has to run what users run: a Qwen2.5-0.5B-
shaped directory (``Qwen2ForCausalLM``, tied embeddings, 14 query / 2 key-value heads, a
byte-level BPE tokenizer with learned merges, Qwen's ChatML template, ``<|im_end|>`` as
end of turn) or a Llama-3-shaped one (``LlamaForCausalLM``, untied, 4:1 grouped-query
heads, Llama 3's header template ending turns with ``<|eot_id|>``).  Each directory holds
what a downloaded one holds (``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` with the chat
template) and loads unchanged in ``AutoModelForCausalLM``, ``AutoTokenizer`` and
``vllm.LLM``.

The shapes are the real ones (:data:`ARCHS`); ``small=True`` (``bidirl make-model
--small``) keeps each architecture's head layout at head_dim 32 with a smaller hidden size,
2 layers and the tokenizer's own vocabulary, so a CPU trains it in seconds per step.  Any
field can be overridden.  The tokenizer is trained on a built-in corpus (English words,
digits, arithmetic): its merges are real BPE merges, its vocabulary small.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bidirl.engines.hf_io import quiet_hf_progress_bars

__all__ = ["ARCHS", "ModelShape", "make_model", "shape_of", "SMALL"]


@dataclass(frozen=True)
class ModelShape:
    arch: str
    model_type: str
    """``qwen2`` or ``llama``: the HF architecture."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int | None
    """Embedding rows; None: the tokenizer's vocabulary rounded up to a multiple of 64."""
    tie_word_embeddings: bool
    rope_theta: float
    max_position_embeddings: int
    rms_norm_eps: float


ARCHS: dict[str, ModelShape] = {
    # config.json of Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", "qwen2", hidden_size=896, intermediate_size=4864,
                               num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                               vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                               max_position_embeddings=32768, rms_norm_eps=1e-6),
    # config.json of meta-llama/Llama-3.1-8B-Instruct (untied), without its RoPE scaling
    "llama-3.1-8b": ModelShape("llama-3.1-8b", "llama", hidden_size=4096, intermediate_size=14336,
                               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                               max_position_embeddings=131072, rms_norm_eps=1e-5),
}

SMALL: dict[str, dict] = {
    # 14 / 2 heads of 32: hidden 448
    "qwen2.5-0.5b": dict(hidden_size=448, intermediate_size=1216, num_hidden_layers=2, head_dim=32,
                         vocab_size=None, max_position_embeddings=4096),
    # 8 / 2 heads of 32 (Llama's 4:1 grouping): hidden 256
    "llama-3.1-8b": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=32, vocab_size=None, max_position_embeddings=4096),
}
"""What ``small=True`` changes: fast on a CPU, the same architecture, tying and head grouping."""


def shape_of(arch: str, small: bool = False, **overrides) -> ModelShape:
    """The shape of ``arch`` (a key of :data:`ARCHS`), made small and/or overridden."""
    if arch not in ARCHS:
        raise ValueError(f"arch: {arch!r} not known; one of {', '.join(ARCHS)}")
    shape = ARCHS[arch]
    if small:
        shape = replace(shape, **SMALL[arch])
    unknown = set(overrides) - set(asdict(shape))
    if unknown:
        raise ValueError(f"unknown shape field(s): {sorted(unknown)}")
    shape = replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    if "hidden_size" in overrides and "head_dim" not in overrides and shape.model_type == "qwen2":
        shape = replace(shape, head_dim=shape.hidden_size // shape.num_attention_heads)
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise ValueError(f"num_attention_heads ({shape.num_attention_heads}) must be a multiple of "
                         f"num_key_value_heads ({shape.num_key_value_heads})")
    if shape.model_type == "qwen2" and shape.hidden_size != shape.num_attention_heads * shape.head_dim:
        raise ValueError(f"qwen2: hidden_size ({shape.hidden_size}) must be num_attention_heads "
                         f"({shape.num_attention_heads}) x head_dim ({shape.head_dim})")
    return shape


# -- tokenizers -------------------------------------------------------------------------------
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TEMPLATE = (  # Qwen2.5's template without tool calls
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') or (message['role'] == 'system' and not loop.first) "
    "or (message['role'] == 'assistant') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA_TEMPLATE = (  # Llama 3's header template without its date preamble and tool calls
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no "
    "way could people my than first water been call who oil its now find long down day did get come made may part "
    "answer question copy reverse add sum total result step think final repeat digit assistant user system please "
    "careful number numbers solve problem compute value equals plus minus times given following show work box"
).split()


def corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """The built-in training text: sentences of common and made-up words, numbers and arithmetic."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ou", "ai")]
    made_up = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    lines = []
    for i in range(n):
        words = [w if rng.random() < 0.6 else rng.choice(made_up)
                 for w in rng.choices(_WORDS, k=rng.randint(6, 24))]
        if i % 3 == 0:
            words[0] = words[0].capitalize()
        a, b = rng.randint(0, 99999), rng.randint(0, 9999)
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ":", ","]) +
                     rng.choice([f" {a} + {b} = {a + b}", f" The answer is {a}.", f"\n#### {b}", f" ({a})", ""]))
    return lines


def byte_level_bpe(regex: str, special: list[str], vocab_target: int, seed: int = 0, texts=None):
    """A byte-level BPE ``tokenizers.Tokenizer`` (GPT-2 / Qwen / Llama 3 style) trained here on
    ``texts`` (default: :func:`corpus`), splitting words by ``regex``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    core = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(corpus(seed=seed) if texts is None else texts, trainers.BpeTrainer(
        vocab_size=vocab_target, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return core


def build_tokenizer(model_type: str, seed: int = 0, vocab_target: int = 4096):
    """A ``PreTrainedTokenizerFast`` of the architecture's kind, with its chat template."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if model_type == "qwen2":
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        core = byte_level_bpe(PRETOKENIZE_REGEX, QWEN_SPECIAL, vocab_target, seed)
        tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      additional_special_tokens=QWEN_SPECIAL, clean_up_tokenization_spaces=False,
                                      model_max_length=131072, errors="replace", split_special_tokens=False)
        tok.chat_template = QWEN_TEMPLATE
        return tok
    core = byte_level_bpe(LLAMA3_REGEX, LLAMA_SPECIAL, vocab_target, seed)
    bos = core.token_to_id("<|begin_of_text|>")
    core.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                  additional_special_tokens=LLAMA_SPECIAL, clean_up_tokenization_spaces=False,
                                  model_max_length=131072)
    tok.chat_template = LLAMA_TEMPLATE
    return tok


# -- configs and directories -------------------------------------------------------------------
def hf_config(shape: ModelShape, tok):
    """The ``transformers`` config of ``shape`` with ``tok``'s special token ids."""
    ids = tok.convert_tokens_to_ids
    vocab = shape.vocab_size or -(-len(tok) // 64) * 64
    if vocab < len(tok):
        raise ValueError(f"vocab_size ({vocab}) is below the tokenizer's {len(tok)} tokens")
    common = dict(vocab_size=vocab, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                  num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
                  num_key_value_heads=shape.num_key_value_heads, max_position_embeddings=shape.max_position_embeddings,
                  rms_norm_eps=shape.rms_norm_eps, tie_word_embeddings=shape.tie_word_embeddings,
                  rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                  hidden_act="silu", initializer_range=0.02)
    if shape.model_type == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common, use_sliding_window=False, sliding_window=shape.max_position_embeddings,
                           max_window_layers=shape.num_hidden_layers, attention_dropout=0.0,
                           bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                           pad_token_id=ids("<|endoftext|>"))
    from transformers import LlamaConfig

    return LlamaConfig(**common, head_dim=shape.head_dim, attention_bias=False, mlp_bias=False,
                       bos_token_id=ids("<|begin_of_text|>"), eos_token_id=[ids("<|end_of_text|>"), ids("<|eot_id|>")])


def generation_config(shape: ModelShape, tok):
    from transformers import GenerationConfig

    ids = tok.convert_tokens_to_ids
    if shape.model_type == "qwen2":  # as Qwen2.5-Instruct's, without its sampling defaults
        return GenerationConfig(bos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"),
                                eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")])
    return GenerationConfig(bos_token_id=ids("<|begin_of_text|>"),
                            eos_token_id=[ids("<|end_of_text|>"), ids("<|eot_id|>")])


def make_model(out_dir: str | Path, arch: str = "qwen2.5-0.5b", *, small: bool = False, seed: int = 0,
               dtype: str = "float32", overwrite: bool = False, **overrides) -> Path:
    """Write a randomly initialised ``arch`` model directory to ``out_dir``; return it.

    ``overrides`` are :class:`ModelShape` fields (``hidden_size=448``, ``num_hidden_layers=4``).
    Written to a temporary sibling and renamed into place: never half-written.  An existing
    non-empty ``out_dir`` is an error unless ``overwrite``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    quiet_hf_progress_bars()
    shape = shape_of(arch, small, **overrides)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty (give another directory, or overwrite)")
    tok = build_tokenizer(shape.model_type, seed)
    config = hf_config(shape, tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config = generation_config(shape, tok)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _set_tokenizer_class(tmp, "Qwen2Tokenizer" if shape.model_type == "qwen2" else "PreTrainedTokenizerFast")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _set_tokenizer_class(d: Path, name: str) -> None:
    """``tokenizer_config.json`` names the tokenizer class as a downloaded directory does."""
    p = d / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["tokenizer_class"] = name
    p.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
