"""The locally built tiny model: HF round trip, tokenizer agreement, idempotence, warm start."""

from __future__ import annotations

import json

import numpy as np
import torch

from bidirl.algo.tasks import get_task
from bidirl.models.tiny import build_tiny_model, build_tokenizer, encode_prompt, load_tokenizer

TEXTS = ["copy 4821", "a b\n\n  c", "reverse 007\t!", "héllo ✓", "<|user|>x<|assistant|>y<|eos|>"]


def test_hf_round_trip(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
    logits = model(torch.tensor([[1, 5, 40, 41]])).logits
    assert logits.shape == (1, 4, model.config.vocab_size) and torch.isfinite(logits).all()


def test_saved_tokenizer_equals_built_one(tiny_model_dir):
    # AutoTokenizer rebuilds a Qwen2Tokenizer for model_type qwen2: ids must not change
    built, loaded = build_tokenizer(), load_tokenizer(tiny_model_dir)
    for text in TEXTS:
        ids = built(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids
        assert loaded.decode(ids) == text
    ascii_ids = loaded("copy 4821")["input_ids"]
    assert len(ascii_ids) == len("copy 4821")  # one token per character
    assert loaded.eos_token == "<|eos|>" and loaded.pad_token == "<|pad|>" and loaded.bos_token == "<|bos|>"


def test_chat_template(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    msgs = [{"role": "user", "content": "copy 12"}]
    ids = encode_prompt(tok, msgs)
    assert tok.decode(ids) == "<|bos|><|user|>copy 12<|assistant|>"
    assert ids[0] == tok.bos_token_id
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "12"}], tokenize=False)
    assert full == "<|bos|><|user|>copy 12<|assistant|>12<|eos|>"


def test_build_is_idempotent_and_rebuilds_on_change(tmp_path):
    out = build_tiny_model(tmp_path / "m", layers=1, hidden=64, heads=2, kv_heads=1)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "m", layers=1, hidden=64, heads=2, kv_heads=1) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(tmp_path / "m", layers=1, hidden=64, heads=2, kv_heads=1, seed=1)
    assert json.loads((out / "bidirl_tiny.json").read_text())["seed"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_warm_start_gives_partial_reward(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from bidirl.models.warm_start import warm_start, warm_start_report

    def mean_reward(model_dir):
        """Mean copy reward of one sampled response (temperature 1, 10 tokens) per test prompt."""
        tok = load_tokenizer(model_dir)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        rows, scores = get_task("copy").rows(48, seed=1, split="test"), []
        for i, row in enumerate(rows):
            ids = torch.tensor([encode_prompt(tok, row["prompt"])])
            torch.manual_seed(i)
            out = model.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=10)
            text = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
            scores.append(get_task("copy").compute_score("copy", text, row["reward_model"]["ground_truth"]))
        return float(np.mean(scores))

    out = warm_start(tiny_model_dir, tmp_path / "warm", tasks=("copy",))
    report = warm_start_report(out)
    assert report["final_loss"] < report["first_loss"] / 3
    reward = mean_reward(out)
    assert 0.15 < reward < 0.9, reward  # signal for GRPO, room to improve
    assert mean_reward(tiny_model_dir) < 0.1
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    warm_start(tiny_model_dir, out, tasks=("copy",))
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_warm_start_is_redone_when_its_tasks_rows_change(tiny_model_dir, tmp_path, monkeypatch):
    """The cache is keyed by the rows too: a task whose rows changed (a new range, a new
    template) gets a new warm start, not the old one from the cache."""
    import json

    import bidirl.models.warm_start as ws

    out = ws.warm_start(tiny_model_dir, tmp_path / "warm", tasks=("copy",), steps=2)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    spec = json.loads((out / "bidirl_warm_start.json").read_text())["spec"]
    assert spec["rows"] == ws.rows_fingerprint(("copy",), 0) != ws.rows_fingerprint(("reverse",), 0)
    monkeypatch.setattr(ws, "rows_fingerprint", lambda tasks, seed: "changed")
    ws.warm_start(tiny_model_dir, out, tasks=("copy",), steps=2)
    assert (out / "model.safetensors").stat().st_mtime_ns != stamp
