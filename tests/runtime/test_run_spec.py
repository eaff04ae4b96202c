"""The controller's spec of a real run describes the model that runs: ``model.path``'s
config.json (not the tiny model's profile), weights at ``model.dtype``; and the calibrated
scenario of such a run names that model by its fields, so it loads without the directory."""

from __future__ import annotations

import json

import pytest

from bidirl.controller.estimates import Estimates
from bidirl.core.typed_config import build
from bidirl.perf.profile_spec import ModelSpec, model_profile
from bidirl.perf.profiles import MODELS
from bidirl.runtime.calibrated_scenario import model_entry
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.run_spec import build_spec

# Qwen2.5-0.5B-Instruct's config.json, the fields a profile reads
QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "Qwen2.5-0.5B-Instruct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN_05B))
    return d


def test_a_model_directory_gives_the_spec_its_own_sizes(model_dir):
    spec = build_spec(load_config(None, [f"model.path={model_dir}"]), steps=4, prompt_tokens=30)
    m = spec.model_profile
    assert spec.model == m.name == "Qwen2.5-0.5B-Instruct"
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab) == (24, 896, 14, 2, 64, 151936)
    assert 4.9e8 < m.params < 5.0e8, m.params  # 494M, counted from the shapes
    assert m.bytes_per_param == 4, "the run's weights are model.dtype's (float32 by default)"
    assert spec.profiles()[1] is m
    bf16 = build_spec(load_config(None, [f"model.path={model_dir}", "model.dtype=bfloat16"]), 4, 30)
    assert bf16.model_profile.bytes_per_param == 2


def test_the_tiny_model_and_the_device_keep_their_catalogue_profiles():
    spec = build_spec(load_config(None, []), steps=4, prompt_tokens=30)
    assert (spec.model, spec.model_profile, spec.hardware) == ("tiny-qwen2", None, "cpu-core")
    assert spec.profiles()[1] is MODELS["tiny-qwen2"]
    assert build_spec(load_config(None, ["cluster.device=cuda"]), 4, 30).hardware == "H100-80GB"


def test_the_priors_follow_the_model(model_dir):
    tiny = Estimates(build_spec(load_config(None, []), 4, 30))
    big = Estimates(build_spec(load_config(None, [f"model.path={model_dir}"]), 4, 30))
    for stage in ("decode", "prefill", "train_micro"):
        x = [8.0] * len(tiny.models[stage].theta)
        assert big.models[stage].predict(x) > tiny.models[stage].predict(x), stage


def test_the_scenario_names_the_model_by_its_fields(model_dir):
    spec = build_spec(load_config(None, [f"model.path={model_dir}"]), 4, 30)
    entry = model_entry(spec)
    assert isinstance(entry, dict) and entry["layers"] == 24 and entry["name"] == "Qwen2.5-0.5B-Instruct"
    assert model_profile(build(ModelSpec, entry, "model", ConfigError), ConfigError) == spec.model_profile
    assert model_entry(build_spec(load_config(None, []), 4, 30)) == "tiny-qwen2"


def test_a_model_directory_without_sizes_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ConfigError, match="model.path"):
        build_spec(load_config(None, [f"model.path={tmp_path}"]), 4, 30)
