"""Model directories of real architectures built locally (``bidirl.models``, ``bidirl make-model``).

The full shapes are the real ones (checked by parameter count, on the meta device); the small
ones keep the architecture, the tying and the head grouping.  Each directory loads in
``AutoModelForCausalLM`` and ``AutoTokenizer`` as a downloaded one does; the tokenizer that
loads is the one built (id for id) and renders the architecture's chat template.  A trainer
on the tied model checkpoints, resumes exactly and writes a model directory (the
"Some tensors share memory" crash), and a model vLLM's CPU attention cannot run is refused
before anything starts.  No vLLM, no Ray.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from bidirl.models.make import build_tokenizer, hf_config, shape_of  # noqa: E402
from bidirl.runtime.config import ConfigError, load_config  # noqa: E402
from bidirl.runtime.prepare import check_model_shape  # noqa: E402

TEXTS = ["What is 1234 + 5678? Think step by step.", "copy 48213\n\n  done", "héllo ✓ wörld", "don't  stop!"]


@pytest.mark.parametrize("arch,params", [("qwen2.5-0.5b", 494_032_768), ("llama-3.1-8b", 8_030_261_248)])
def test_full_shapes_are_the_real_ones(arch, params):
    from transformers import AutoModelForCausalLM

    shape = shape_of(arch)
    config = hf_config(shape, build_tokenizer(shape.model_type))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == params


def test_qwen_directory_loads_as_a_downloaded_one(qwen_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in qwen_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(str(qwen_dir))
    cfg = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM" and cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads) == (14, 2, 32)
    tok = AutoTokenizer.from_pretrained(str(qwen_dir))
    assert type(tok).__name__ == "Qwen2Tokenizer" and tok.eos_token == "<|im_end|>"
    assert cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and cfg.pad_token_id is not None
    built = build_tokenizer("qwen2")
    for text in TEXTS:
        assert tok(text)["input_ids"] == built(text)["input_ids"] and tok.decode(tok(text)["input_ids"]) == text
    assert len(tok("the answer is")["input_ids"]) == 3, "learned merges: whole words are one token"
    text = tok.apply_chat_template([{"role": "user", "content": "copy 7"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n<|im_start|>user\ncopy 7<|im_end|>\n<|im_start|>assistant\n")
    gen = json.loads((qwen_dir / "generation_config.json").read_text())
    assert cfg.eos_token_id in gen["eos_token_id"]


def test_llama_directory_loads_as_a_downloaded_one(llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(llama_dir))
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and not cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 2, 32)
    tok = AutoTokenizer.from_pretrained(str(llama_dir))
    built = build_tokenizer("llama")
    for text in TEXTS:
        assert tok(text)["input_ids"] == built(text)["input_ids"]
    assert tok("hi")["input_ids"][0] == tok.bos_token_id, "Llama's tokenizer adds <|begin_of_text|>"
    text = tok.apply_chat_template([{"role": "user", "content": " copy 7 "}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\ncopy 7<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tok.convert_tokens_to_ids("<|eot_id|>") in cfg.eos_token_id


def test_shape_overrides_and_refusals():
    s = shape_of("qwen2.5-0.5b", small=True, hidden_size=896)
    assert (s.num_attention_heads, s.head_dim, s.tie_word_embeddings) == (14, 64, True)
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        shape_of("qwen2.5-0.5b", small=True, num_key_value_heads=3)
    with pytest.raises(ValueError, match="arch: 'gpt2' not known"):
        shape_of("gpt2")


def test_make_model_cli(tmp_path, capsys):
    from bidirl.cli import main

    out = tmp_path / "m"
    assert main(["make-model", str(out), "--arch", "llama-3.1-8b", "--small", "--layers", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert "llama-3.1-8b-shaped model" in capsys.readouterr().err
    assert main(["make-model", str(out), "--small"]) == 2, "an existing directory is not overwritten"
    assert main(["make-model", str(tmp_path / "x"), "--small", "--kv-heads", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("bidirl make-model: error: ") for e in err)
    assert not (tmp_path / "x").exists()


def test_tied_model_checkpoints_resumes_exactly_and_loads_back(qwen_dir, tmp_path):
    """The checkpoint used to die with "Some tensors share memory" (lm_head = embed_tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bidirl.engines.train_batch import TrainSample, make_microbatches
    from bidirl.engines.trainer_config import TrainerConfig
    from bidirl.engines.trainer_torch import TorchTrainer

    def batch(seed):
        g = torch.Generator().manual_seed(seed)
        return make_microbatches([TrainSample(prompt_ids=torch.randint(5, 4000, (40,), generator=g).tolist(),
                                              response_ids=torch.randint(5, 4000, (6,), generator=g).tolist(),
                                              behaviour_logprobs=[-8.0] * 6, advantage=1.0 if i % 2 else -1.0)
                                  for i in range(4)], 2)

    cfg = TrainerConfig(lr=1e-3)
    a = TorchTrainer(qwen_dir, cfg)
    assert "lm_head.weight" not in a.params, "tied: one parameter, named as the embedding"
    a.train_step(batch(1))
    a.save_checkpoint(tmp_path / "ckpt" / "trainer", tmp_path / "ckpt" / "model")
    a.train_step(batch(2))
    b = TorchTrainer(qwen_dir, cfg)
    b.load_checkpoint(tmp_path / "ckpt" / "trainer", tmp_path / "ckpt" / "model")
    assert b.version == 1
    b.train_step(batch(2))
    assert all(torch.equal(p, b.params[k]) for k, p in a.params.items()), "resume is exact"
    assert b.model.lm_head.weight.data_ptr() == b.model.model.embed_tokens.weight.data_ptr(), "still tied"

    model_dir = tmp_path / "ckpt" / "model"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in model_dir.iterdir()}
    assert not (model_dir / "optimizer.pt").exists()
    back = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert back.config.tie_word_embeddings and torch.equal(back.lm_head.weight, back.model.embed_tokens.weight)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert tok.chat_template == AutoTokenizer.from_pretrained(str(qwen_dir)).chat_template


def _model_with_head_dim_16(tmp_path, qwen_dir):
    d = tmp_path / "hd16"
    d.mkdir()
    cfg = json.loads((qwen_dir / "config.json").read_text())
    cfg.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_head_size_vllm_cpu_lacks_is_refused_before_anything_starts(tmp_path, qwen_dir):
    d = _model_with_head_dim_16(tmp_path, qwen_dir)
    with pytest.raises(ConfigError) as e:
        check_model_shape(load_config(None, [f"model.path={d}"]))
    msg = str(e.value)
    assert msg.startswith("model.path: attention head size 16 (hidden_size 64 / num_attention_heads 4 in ")
    assert "32, 64" in msg and "\n" not in msg
    check_model_shape(load_config(None, [f"model.path={d}", "cluster.device=cuda"]))
    check_model_shape(load_config(None, [f"model.path={qwen_dir}"]))
    with pytest.raises(ConfigError, match="^model.tiny_hidden: attention head size 16"):
        check_model_shape(load_config(None, ["model.tiny_hidden=64"]))
    with pytest.raises(ConfigError, match="^model.tiny_hidden: must be a multiple of 4"):
        check_model_shape(load_config(None, ["model.tiny_hidden=66"]))
    check_model_shape(load_config(None, []))


def test_train_refuses_the_head_size_in_one_line_exit_2(tmp_path, qwen_dir):
    import subprocess
    import sys

    d = _model_with_head_dim_16(tmp_path, qwen_dir)
    out = subprocess.run([sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(tmp_path / "run"),
                          f"model.path={d}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bidirl train: error: model.path: attention head size 16")
