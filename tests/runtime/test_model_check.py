"""Model directories the run cannot use are refused in one line before anything starts.

The directories are built here without weights (``config.json`` and tokenizer files are all
the check reads): bidirl's tiny Qwen2 model with its ``vocab_size`` cut below the
tokenizer's, a BERT directory, vision-language ones, and shapes and dtypes vLLM or the
trainer cannot take.  One case goes through the CLI in a subprocess, which must exit 2 with
one bidirl line and never import Ray, vLLM or torch.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from bidirl.runtime.config import ConfigError  # noqa: E402
from bidirl.runtime.model_check import (  # noqa: E402
    check_model_dir,
    cpu_head_sizes,
    engine_architectures,
    tokenizer_size,
    trainer_model_types,
)


def _tiny_dir(path, hidden: int = 128, heads: int = 4, kv_heads: int = 2, **config):
    """bidirl's tiny Qwen2 model's config.json and tokenizer (no weights), ``config`` overriding."""
    from bidirl.models.tiny import build_tokenizer, tiny_config

    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(2, hidden, heads, kv_heads)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    data = json.loads((path / "config.json").read_text())
    data.update(config)
    for key in [k for k, v in config.items() if v is None]:
        del data[key]
    (path / "config.json").write_text(json.dumps(data))
    return path


def _config_dir(path, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _bert_dir(path):
    d = _config_dir(path, architectures=["BertForMaskedLM"], model_type="bert", hidden_size=768,
                    num_attention_heads=12, num_hidden_layers=12, intermediate_size=3072, vocab_size=30522,
                    max_position_embeddings=512, type_vocab_size=2, torch_dtype="float32")
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return d


def _refused(d, *parts, device: str = "cpu") -> str:
    with pytest.raises(ConfigError) as info:
        check_model_dir(d, device=device)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("model.path: "), msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def test_a_small_vocab_model_is_refused_through_the_cli_before_ray(tmp_path):
    d = _tiny_dir(tmp_path / "small-vocab", vocab_size=200)
    assert tokenizer_size(d) > 200
    script = ("import sys\nfrom bidirl.cli import main\n"
              f"rc = main(['train', '--run-dir', {str(tmp_path / 'run')!r}, 'model.path={d}', 'run.steps=1'])\n"
              "print(sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules))\nsys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"bidirl train: error: model.path: vocab_size 200 in {d}/config.json is smaller "
                               f"than the tokenizer's {tokenizer_size(d)} tokens")
    assert out.stdout.strip() == "[]", "nothing heavy was imported: no Ray, no vLLM, no torch"
    assert not (tmp_path / "run").exists()


def test_a_bert_directory_cannot_generate(tmp_path):
    _refused(_bert_dir(tmp_path / "bert"), "architecture BertForMaskedLM", "cannot generate",
             "only as a pooling model", "Qwen2ForCausalLM", "more")


@pytest.mark.parametrize("arch", ["Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                                  "Qwen3VLForConditionalGeneration", "LlavaForConditionalGeneration"])
def test_a_torchvision_vision_language_model_runs_on_gpus_only(tmp_path, arch):
    """vLLM's Qwen-VL and LLaVA import torchvision's image processors, absent beside CPU torch."""
    pytest.importorskip("vllm")
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    d = _config_dir(tmp_path / "vl", architectures=[arch], model_type="qwen2_vl", torch_dtype="bfloat16",
                    vision_config={"depth": 2}, text_config={"hidden_size": 1536, "num_attention_heads": 12,
                                                             "num_key_value_heads": 2})
    _refused(d, f"architecture {arch}", "torchvision", "cluster.device=cuda", "model.kind=vl")
    check_model_dir(d, device="cuda")


def test_the_tiny_idefics3_model_passes(tiny_vl_dir):
    check_model_dir(tiny_vl_dir)


def test_a_vision_language_model_needs_an_image_text_to_text_class(tmp_path):
    d = _tiny_dir(tmp_path / "m", vision_config={"depth": 2})  # Qwen2ForCausalLM with a vision_config
    _refused(d, "vision-language", "AutoModelForImageTextToText", "Idefics3ForConditionalGeneration")


def test_the_tiny_model_and_its_real_shapes_pass(tmp_path):
    check_model_dir(_tiny_dir(tmp_path / "ok"))
    check_model_dir(None)  # the tiny model bidirl builds itself
    # A transformers causal LM vLLM has no own class for: vLLM's Transformers backend may run it.
    check_model_dir(_tiny_dir(tmp_path / "neo", architectures=["GPTNeoForCausalLM"], model_type="gpt_neo"))


@pytest.mark.parametrize(("change", "parts"), [
    (dict(architectures=["NoSuchForCausalLM"]), ["architecture NoSuchForCausalLM", "no text-generation model"]),
    (dict(architectures=["MPTForCausalLM"]), ["vLLM supported it until version"]),
    (dict(model_type="no_such_type"), ["model_type 'no_such_type'", "AutoModelForCausalLM", "qwen2"]),
    (dict(model_type=None), ["has no model_type"]),
    (dict(torch_dtype="float64", dtype=None), ["torch_dtype 'float64'", "float32, bfloat16, float16"]),
    (dict(quantization_config={"quant_method": "fp8"}), ["fp8 checkpoint", "unquantized"]),
    (dict(hidden_size=130, head_dim=None), ["hidden_size 130", "not divisible by num_attention_heads 4"]),
    (dict(num_key_value_heads=3), ["num_attention_heads 4", "not a multiple of num_key_value_heads 3"]),
])
def test_each_problem_is_one_line(tmp_path, change, parts):
    _refused(_tiny_dir(tmp_path / "m", **change), *parts)


def test_a_head_size_vllms_cpu_attention_lacks_is_refused_on_cpu_only(tmp_path):
    d = _tiny_dir(tmp_path / "hd16", hidden=64)  # 4 heads of 16
    msg = _refused(d, "attention head size 16", "vLLM's CPU attention", "cluster.device=cuda")
    assert "32, 64" in msg
    check_model_dir(d, device="cuda")


def test_a_missing_or_broken_config_is_one_line(tmp_path):
    _refused(tmp_path, "config.json is missing")
    (tmp_path / "config.json").write_text("{not json")
    _refused(tmp_path, "not JSON")


def test_a_broken_tokenizer_is_one_line(tmp_path):
    d = _tiny_dir(tmp_path / "m")
    (d / "tokenizer.json").write_text("{broken")
    _refused(d, "cannot read the tokenizer")


def test_the_tables_are_read_without_importing_vllm_or_transformers_models():
    engine = engine_architectures()
    causal, vision = trainer_model_types()
    assert engine is not None and "Qwen2ForCausalLM" in engine.generation and "LlamaForCausalLM" in engine.generation
    assert "Qwen2VLForConditionalGeneration" in engine.multimodal and "BertForMaskedLM" in engine.pooling
    assert causal["qwen2"] == "Qwen2ForCausalLM" and "Idefics3ForConditionalGeneration" in vision
    assert 32 in cpu_head_sizes() and 16 not in cpu_head_sizes()
    script = ("import sys\nfrom bidirl.runtime import model_check as m\n"
              "m.engine_architectures(), m.trainer_model_types(), m.cpu_head_sizes()\n"
              "print(sorted(k for k in sys.modules if k.startswith(('vllm', 'torch', 'transformers'))))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


@pytest.mark.vllm
def test_the_source_reading_agrees_with_the_imported_registries():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from vllm.model_executor.models import registry
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    engine = engine_architectures()
    assert set(registry._TEXT_GENERATION_MODELS) <= engine.generation
    assert set(registry._MULTIMODAL_MODELS) <= engine.multimodal
    assert set(registry._EMBEDDING_MODELS) - engine.generation - engine.multimodal <= engine.pooling
    assert trainer_model_types()[0] == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert cpu_head_sizes() == tuple(CPUAttentionBackend.get_supported_head_sizes())
