"""A model directory checked before anything starts: can the rollout engine and the trainer run it?

Why: without this a model the run cannot use is found out by a worker, after Ray and the
engines have started: a ``vocab_size`` smaller than the tokenizer's died mid-run with an
``IndexError`` inside vLLM, a BERT directory 22 s in with vLLM's "does not support
generation", a vision-language one 11 s in with transformers' list of 400 model types.
:func:`check_model_dir` reads ``config.json`` (and the tokenizer's size) and raises a one-line
``ConfigError`` (exit status 2) for, in this order:

1. a vision-language architecture vLLM has no multimodal model of, or transformers no
   image-text-to-text class of (the trainer loads ``AutoModelForImageTextToText``), or, on a
   CPU without torchvision, one whose vLLM implementation needs torchvision's image
   processors (Qwen-VL, Gemma 3, InternVL, LLaVA: they run on GPUs; Idefics3 / SmolVLM runs);
2. an architecture vLLM does not generate with (a pooling model such as
   ``BertForMaskedLM``, one vLLM dropped, one it does not know), listing what it does;
3. a ``model_type`` transformers' ``AutoModelForCausalLM`` (the trainer) has no class for;
4. attention heads the engine cannot run: ``hidden_size`` not divisible by
   ``num_attention_heads``, query heads not a multiple of key-value heads, or (on a CPU) a
   head size vLLM's CPU attention lacks;
5. weights in a dtype the run cannot train (``torch_dtype`` not float32/bfloat16/float16,
   or a quantized checkpoint);
6. ``vocab_size`` below the tokenizer's size (token ids past the embedding).

What vLLM and transformers support is read from their installed sources (``ast``, no import:
importing vLLM's model registry takes 5-6 s and pulls in torch; reading it takes ~40 ms),
so the check takes well under a second and stays right when either package is upgraded.
Where a source no longer has the expected shape, the modules are imported instead.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bidirl.engines.lora import unmatched_targets
from bidirl.runtime.config import ConfigError

__all__ = ["EngineArchitectures", "check_model_dir", "cpu_head_sizes", "engine_architectures",
           "tokenizer_size", "trainer_model_types"]

TORCHVISION_VL_PREFIXES = ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL", "Gemma3ForConditional", "InternVL", "Llava")
"""Vision-language architectures whose vLLM 0.32 implementation imports transformers'
torchvision image processors: they cannot run where torchvision is not installed (CPU torch)."""
TRAINABLE_DTYPES = ("float32", "bfloat16", "float16")
# Shown first (those vLLM has) when listing what runs; the rest are counted.
COMMON_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM",
                        "MistralForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM",
                        "GPT2LMHeadModel", "OlmoForCausalLM", "DeepseekV3ForCausalLM", "GraniteForCausalLM")
_POOLING_TABLES = ("_EMBEDDING_MODELS", "_LATE_INTERACTION_MODELS", "_REWARD_MODELS",
                   "_TOKEN_CLASSIFICATION_MODELS", "_SEQUENCE_CLASSIFICATION_MODELS")


@dataclass(frozen=True)
class EngineArchitectures:
    """vLLM's model registry by what it does with each architecture."""

    generation: frozenset[str]
    multimodal: frozenset[str]
    pooling: frozenset[str]
    retired: dict[str, str]
    """Architecture -> the last vLLM version that ran it."""


def _assignments(path: Path) -> dict[str, ast.expr]:
    """Module-level ``NAME = <expr>`` of a source file, by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.targets[0].id: node.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)}


def _dict_keys(node: ast.expr | None) -> dict[str, Any]:
    """A dict literal's string keys with their values where literal (``**spread`` entries skipped)."""
    if not isinstance(node, ast.Dict):
        raise ValueError("not a dict literal")
    out = {}
    for k, v in zip(node.keys, node.values, strict=True):
        if isinstance(k, ast.Constant) and isinstance(k.value, str):
            try:
                out[k.value] = ast.literal_eval(v)
            except ValueError:
                out[k.value] = None
    return out


def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    if spec is None or spec.origin is None:
        raise ImportError(f"{package} is not installed")
    return Path(spec.origin).parent / relative


@functools.cache
def engine_architectures() -> EngineArchitectures | None:
    """vLLM's architectures (read from ``vllm/model_executor/models/registry.py``); None
    without vLLM."""
    try:
        tables = _vllm_tables_from_source()
    except (OSError, SyntaxError, ValueError, KeyError):
        try:
            registry = importlib.import_module("vllm.model_executor.models.registry")
            tables = {name: dict(getattr(registry, name)) for name in
                      ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS",
                       "_PREVIOUSLY_SUPPORTED_MODELS", *_POOLING_TABLES)}
        except (ImportError, AttributeError):
            return None
    except ImportError:
        return None
    transformers_backed = tables["_TRANSFORMERS_SUPPORTED_MODELS"]
    generation = set(tables["_TEXT_GENERATION_MODELS"])
    multimodal = set(tables["_MULTIMODAL_MODELS"])
    for arch, target in transformers_backed.items():  # (module, class): which backend class runs it
        cls = target[1] if isinstance(target, tuple | list) and len(target) == 2 else ""
        (multimodal if "MultiModal" in cls else generation).add(arch)
    pooling = set().union(*(tables[t] for t in _POOLING_TABLES)) - generation - multimodal
    retired = {k: str(v) for k, v in tables["_PREVIOUSLY_SUPPORTED_MODELS"].items()}
    return EngineArchitectures(frozenset(generation), frozenset(multimodal), frozenset(pooling), retired)


def _vllm_tables_from_source() -> dict[str, dict[str, Any]]:
    found = _assignments(_package_file("vllm", "model_executor/models/registry.py"))
    return {name: _dict_keys(found[name]) for name in
            ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS",
             "_PREVIOUSLY_SUPPORTED_MODELS", *_POOLING_TABLES)}


@functools.cache
def cpu_head_sizes() -> tuple[int, ...] | None:
    """The head sizes vLLM's CPU attention runs (``CPUAttentionBackend.get_supported_head_sizes``);
    None when they cannot be read (the check is then left to vLLM)."""
    try:
        tree = ast.parse(_package_file("vllm", "v1/attention/backends/cpu_attn.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
                for stmt in ast.walk(node):
                    if isinstance(stmt, ast.Return) and stmt.value is not None:
                        return tuple(int(x) for x in ast.literal_eval(stmt.value))
    except (OSError, SyntaxError, ValueError, TypeError, ImportError):
        pass
    try:
        backend = importlib.import_module("vllm.v1.attention.backends.cpu_attn").CPUAttentionBackend
        return tuple(backend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return None


@functools.cache
def trainer_model_types() -> tuple[dict[str, str], frozenset[str]]:
    """(model_type -> class that ``AutoModelForCausalLM`` builds, the class names of transformers'
    image-text-to-text and multimodal models), from ``transformers/models/auto/modeling_auto.py``."""
    try:
        found = _assignments(_package_file("transformers", "models/auto/modeling_auto.py"))
        causal = dict(_ordered_pairs(found["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"]))
        tables = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
                  "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES")
        vision = {cls for name in tables if name in found for _, cls in _ordered_pairs(found[name])}
    except (OSError, SyntaxError, ValueError, KeyError, ImportError):
        auto = importlib.import_module("transformers.models.auto.modeling_auto")
        causal = dict(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        vision = set(getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", {}).values())
    return causal, frozenset(vision)


def _ordered_pairs(node: ast.expr) -> list[tuple[str, str]]:
    """The literal ``(key, "Class")`` pairs of ``OrderedDict([...])`` (spreads and tuples of classes
    skipped)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List)):
        raise ValueError("not OrderedDict([...])")
    pairs = []
    for elt in node.args[0].elts:
        if isinstance(elt, ast.Tuple) and len(elt.elts) == 2 and all(isinstance(e, ast.Constant) for e in elt.elts):
            key, cls = elt.elts[0].value, elt.elts[1].value
            if isinstance(key, str) and isinstance(cls, str):
                pairs.append((key, cls))
    return pairs


def tokenizer_size(model_dir: str | Path) -> int:
    """The number of token ids the model's tokenizer can produce (its largest id + 1).

    Read from ``tokenizer.json`` (the vocabulary and the added tokens) where there is one;
    otherwise the tokenizer is loaded (``len(AutoTokenizer...)``).
    """
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = (data.get("model") or {}).get("vocab") or {}
        ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]  # Unigram: a list
        ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t.get("id"), int)]
        return max(ids, default=-1) + 1
    from transformers import AutoTokenizer  # lazy: a directory without tokenizer.json only

    return len(AutoTokenizer.from_pretrained(str(model_dir)))


def _some(names, first=COMMON_ARCHITECTURES, limit: int = 8) -> str:
    """A short list: the well-known names among ``names`` first, then how many more."""
    names = set(names)
    shown = [n for n in first if n in names][:limit] or sorted(names)[:limit]
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


def check_model_dir(model_dir: str | Path | None, *, device: str = "cpu", field: str = "model.path") -> None:
    """``ConfigError`` (one line) for a model directory the run cannot use; see the module doc.

    ``model_dir=None`` is the tiny model bidirl builds itself: nothing to check here.
    ``device`` is ``cluster.device`` (the head-size check is a CPU one).
    """
    if model_dir is None:
        return
    d = Path(model_dir)
    path = d / "config.json"
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{field}: {path} is {'missing' if isinstance(e, OSError) else 'not JSON'}; "
                          "a Hugging Face model directory has a config.json") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{field}: {path} holds a {type(hf).__name__}, not a JSON object")
    _check_architecture(hf, path, field, device)
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf  # a vision-language model's LM
    _check_heads(text, path, field, device)
    _check_dtype(hf, path, field)
    _check_vocab(text, d, path, field)  # last: the only one that may load the tokenizer


def _check_vision_language(archs: list[str], named: str, path: Path, field: str, vision, engine,
                           device: str) -> None:
    both = (vision & engine.multimodal) if engine else vision
    some = _some(both, first=("Idefics3ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"))
    if not any(a in vision for a in archs):
        raise ConfigError(f"{field}: {named} in {path} is a vision-language model transformers has no "
                          f"image-text-to-text class for (the trainer loads AutoModelForImageTextToText); use "
                          f"e.g. {some}")
    if engine and not any(a in engine.multimodal for a in archs):
        raise ConfigError(f"{field}: {named} in {path} is a vision-language model vLLM cannot generate with; use "
                          f"e.g. {some}")
    if device == "cpu" and any(a.startswith(TORCHVISION_VL_PREFIXES) for a in archs) \
            and importlib.util.find_spec("torchvision") is None:
        raise ConfigError(f"{field}: {named} in {path} is a vision-language model whose vLLM implementation needs "
                          "torchvision's image processors, and torchvision is not installed (its PyPI builds are "
                          "CUDA builds, which do not run beside CPU torch); run it with cluster.device=cuda, or on a "
                          "CPU use an Idefics3 (SmolVLM) model such as model.kind=vl builds")


def _check_architecture(hf: dict, path: Path, field: str, device: str = "cpu") -> None:
    archs = [a for a in hf.get("architectures") or [] if isinstance(a, str)]
    model_type = hf.get("model_type")
    engine = engine_architectures()
    causal, vision = trainer_model_types()
    arch = archs[0] if archs else None
    named = f"architecture {arch}" if arch else f"model_type {model_type!r}"
    if any(a in vision or (engine and a in engine.multimodal) for a in archs) or "vision_config" in hf:
        _check_vision_language(archs, named, path, field, vision, engine, device)
        return
    if engine and arch and not any(a in engine.generation for a in archs):
        if arch in engine.pooling:
            why = "vLLM runs it only as a pooling model (embeddings, classification), not for generation"
        elif arch in engine.retired:
            why = f"vLLM supported it until version {engine.retired[arch]}, not in the one installed"
        elif arch in set(causal.values()):
            why = None  # a transformers causal LM vLLM has no own class for: its Transformers backend may run it
        else:
            why = "vLLM has no text-generation model of that architecture"
        if why:
            raise ConfigError(f"{field}: {named} in {path} cannot generate: {why}; bidirl trains causal LMs vLLM "
                              f"generates with, e.g. {_some(engine.generation)}")
    if not isinstance(model_type, str):
        raise ConfigError(f"{field}: {path} has no model_type; a Hugging Face config.json names one (qwen2, llama...)")
    if model_type not in causal:
        raise ConfigError(f"{field}: model_type {model_type!r} in {path} has no causal-LM class in transformers "
                          f"(the trainer loads AutoModelForCausalLM); it has one for e.g. "
                          f"{_some(causal, first=('qwen3', 'qwen2', 'llama', 'mistral', 'gemma3_text', 'phi3'))}")


def _check_vocab(hf: dict, d: Path, path: Path, field: str) -> None:
    vocab = hf.get("vocab_size")
    if not isinstance(vocab, int):
        return  # an architecture that keeps it elsewhere: vLLM decides
    try:
        size = tokenizer_size(d)
    except Exception as e:  # noqa: BLE001 - any failure to read the tokenizer is the user's directory's
        raise ConfigError(f"{field}: cannot read the tokenizer in {d}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}") from None
    if vocab < size:
        raise ConfigError(f"{field}: vocab_size {vocab} in {path} is smaller than the tokenizer's {size} tokens: "
                          f"token ids {vocab}..{size - 1} have no embedding row; use the tokenizer the model was "
                          f"trained with, or a config.json with vocab_size >= {size}")


def _check_heads(hf: dict, path: Path, field: str, device: str) -> None:
    try:
        heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError):
        return  # an architecture this check does not know: vLLM decides
    if heads <= 0 or kv_heads <= 0:
        raise ConfigError(f"{field}: num_attention_heads {heads} / num_key_value_heads {kv_heads} in {path}: "
                          "both must be at least 1")
    if hf.get("head_dim"):
        head_dim, where = int(hf["head_dim"]), f"head_dim {hf['head_dim']}"
    elif hidden % heads:
        raise ConfigError(f"{field}: hidden_size {hidden} in {path} is not divisible by num_attention_heads "
                          f"{heads}, and there is no head_dim: the attention heads have no whole size")
    else:
        head_dim, where = hidden // heads, f"hidden_size {hidden} / num_attention_heads {heads}"
    if heads % kv_heads:
        raise ConfigError(f"{field}: num_attention_heads {heads} in {path} is not a multiple of num_key_value_heads "
                          f"{kv_heads}: grouped-query attention needs whole groups")
    sizes = cpu_head_sizes() if device == "cpu" else None
    if sizes and head_dim not in sizes:
        raise ConfigError(f"{field}: attention head size {head_dim} ({where} in {path}) is not one vLLM's CPU "
                          f"attention runs ({', '.join(map(str, sizes))}); use a model with one of them, "
                          "or cluster.device=cuda")


def _check_dtype(hf: dict, path: Path, field: str) -> None:
    quant = hf.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "quantized") if isinstance(quant, dict) else "quantized"
        raise ConfigError(f"{field}: {path} is a {method} checkpoint (quantization_config); the trainer updates "
                          f"full-precision weights: use the unquantized model ({'/'.join(TRAINABLE_DTYPES)})")
    dtype = hf.get("torch_dtype", hf.get("dtype"))
    if dtype not in (None, "auto", *TRAINABLE_DTYPES):
        raise ConfigError(f"{field}: torch_dtype {dtype!r} in {path} is not one the run can train or generate "
                          f"in; allowed: {', '.join(TRAINABLE_DTYPES)}")


def check_lora_targets(cfg, model_dir: str | Path) -> None:
    """``ConfigError`` (one line) when ``model.lora_target_modules`` names a layer the model
    does not have: PEFT would say so only inside the trainer's worker, after Ray started."""
    if not cfg.model.lora_rank:
        return
    if cfg.trainer.strategy == "fsdp2" and cfg.cluster.train_devices > 1:
        raise ConfigError("trainer.strategy: fsdp2 with model.lora_rank > 0 is not supported: the adapters are "
                          "megabytes and the frozen base is not trained, so nothing worth sharding; use "
                          "trainer.strategy=ddp")
    bad, ends = unmatched_targets(model_dir, tuple(cfg.model.lora_target_modules))
    if bad:
        raise ConfigError(f"model.lora_target_modules: {', '.join(bad)} name(s) no layer of {model_dir}; its "
                          f"layers' names end in {_some(ends, first=(), limit=16)}")
