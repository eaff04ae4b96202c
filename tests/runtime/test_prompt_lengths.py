"""Prompt lengths are measured from the data, with the run's tokenizer, before any worker.

A Qwen2-shaped model directory with a learned BPE and a ChatML template (``chatml_model``)
and veRL-layout rows of ~150-250 tokens: the measured lengths agree with a tokenization
that skips the chat template machinery, vLLM's ``max_model_len`` covers the longest prompt
plus the new tokens, and over-long rows are dropped and counted or rejected by name.
No Ray, no vLLM.
"""

from __future__ import annotations

import json
import shutil
import statistics

import pytest
from chatml_model import build_chatml_model, chatml_text, verl_rows
from runtime_cli_helpers import run_cli

pytest.importorskip("transformers")

from bidirl.algo.data import DataError, load_dataset, save_dataset  # noqa: E402
from bidirl.models.tiny import build_tokenizer, encode_prompt, load_tokenizer  # noqa: E402
from bidirl.runtime.config import ConfigError, help_text, load_config  # noqa: E402
from bidirl.runtime.prepare import fit_prompts, model_context, prompt_token_lengths  # noqa: E402
from bidirl.runtime.run_spec import build_spec  # noqa: E402

N = 300


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    model_dir, core = build_chatml_model(tmp_path_factory.mktemp("model") / "qwen2-chatml")
    return str(model_dir), core, load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    raw = verl_rows(N)
    path = save_dataset(raw, tmp_path_factory.mktemp("data") / "train.parquet")
    return path, raw, load_dataset(path)


def _cfg(path, *overrides):
    return load_config(None, [f"data.files={path}", *overrides])


def _direct(core, raw) -> list[int]:
    """Token counts from the trained BPE itself on the ChatML text written out by hand."""
    return [len(core.encode(chatml_text(r["prompt"])).ids) for r in raw]


def test_lengths_are_those_of_a_direct_tokenization(chatml, data):
    model_dir, core, tok = chatml
    path, raw, rows = data
    lengths = prompt_token_lengths(tok, rows)
    assert lengths == _direct(core, raw)
    assert lengths == [len(encode_prompt(tok, r.messages)) for r in rows], "the run's own encoding"
    assert 140 <= min(lengths) and max(lengths) <= 260, "the rows are ~150-250 tokens"
    kept, fit = fit_prompts(_cfg(path), rows, tok, model_dir)
    assert kept == rows and fit.filtered == 0 and fit.kept == N
    assert fit.longest == max(lengths) and fit.mean == pytest.approx(statistics.fmean(lengths))


def test_max_model_len_covers_the_longest_prompt_and_the_new_tokens(chatml, data):
    model_dir, core, tok = chatml
    path, raw, rows = data
    cfg = _cfg(path, "rollout.max_new_tokens=48")
    _, fit = fit_prompts(cfg, rows, tok, model_dir)
    longest = max(_direct(core, raw))
    assert fit.max_model_len == longest + 48
    # the mapping-length bug capped this at 2*4 + max_new_tokens + 64
    assert fit.max_model_len > 2 * 4 + 48 + 64
    spec = build_spec(cfg, 10, fit.mean)
    assert spec.prompt_tokens == round(statistics.fmean(_direct(core, raw)))


def test_overlong_rows_are_filtered_and_counted(chatml, data):
    model_dir, core, tok = chatml
    path, raw, rows = data
    lengths = _direct(core, raw)
    limit = int(statistics.median(lengths))
    cfg = _cfg(path, f"data.max_prompt_length={limit}", "data.filter_overlong_prompts=true",
               "rollout.max_new_tokens=16")
    kept, fit = fit_prompts(cfg, rows, tok, model_dir)
    over = [i for i, n in enumerate(lengths) if n > limit]
    assert 0 < len(over) < N
    assert fit.filtered == len(over) and fit.kept == len(kept) == N - len(over)
    assert [r.index for r in kept] == [i for i in range(N) if i not in set(over)], "file order, ids kept"
    kept_lengths = [lengths[r.index] for r in kept]
    assert max(kept_lengths) <= limit
    assert fit.max_model_len == max(kept_lengths) + 16
    assert fit.mean == pytest.approx(statistics.fmean(kept_lengths))


def test_overlong_rows_are_rejected_naming_the_first(chatml, data):
    model_dir, core, tok = chatml
    path, raw, rows = data
    lengths = _direct(core, raw)
    limit = sorted(lengths)[-5]  # a few rows are longer
    over = [i for i, n in enumerate(lengths) if n > limit]
    first = over[0]
    with pytest.raises(DataError) as e:
        fit_prompts(_cfg(path, f"data.max_prompt_length={limit}"), rows, tok, model_dir)
    msg = str(e.value)
    assert str(path) in msg and f"row {first}:" in msg and f"{lengths[first]} tokens" in msg
    assert f"data.max_prompt_length={limit}" in msg and f"{len(over)} of 300" in msg
    assert "data.filter_overlong_prompts=true" in msg and "\n" not in msg


def test_every_row_over_the_limit_is_an_error_even_when_filtering(chatml, data):
    model_dir, _, tok = chatml
    path, _, rows = data
    with pytest.raises(DataError, match="all 300 prompts"):
        fit_prompts(_cfg(path, "data.max_prompt_length=20", "data.filter_overlong_prompts=true"),
                    rows, tok, model_dir)


def test_a_context_longer_than_the_model_allows_fails_before_start_up(chatml, data, tmp_path):
    model_dir, core, tok = chatml
    path, raw, rows = data
    small = tmp_path / "small"
    shutil.copytree(model_dir, small)
    hf = json.loads((small / "config.json").read_text())
    hf["max_position_embeddings"] = 256
    (small / "config.json").write_text(json.dumps(hf))
    assert model_context(small) == 256 and model_context(model_dir) == 1024
    with pytest.raises(ConfigError) as e:
        fit_prompts(_cfg(path, "rollout.max_new_tokens=64"), rows, tok, small)
    longest = max(_direct(core, raw))
    assert f"{longest + 64} tokens" in str(e.value) and "context of 256" in str(e.value)
    assert f"data.max_prompt_length<={256 - 64}" in str(e.value)
    # following the advice works
    kept, fit = fit_prompts(_cfg(path, "rollout.max_new_tokens=64", "data.max_prompt_length=192",
                                 "data.filter_overlong_prompts=true"), rows, tok, small)
    assert fit.max_model_len <= 256 and fit.filtered > 0


def test_rope_scaling_extends_the_context(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}))
    assert model_context(tmp_path) == 16384
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 2048}}))
    assert model_context(tmp_path) == 2048
    (tmp_path / "config.json").write_text("{}")
    assert model_context(tmp_path) is None and model_context(tmp_path / "missing") is None


def test_the_tiny_models_char_tokenizer_is_measured_exactly():
    from bidirl.algo.data import validate_row

    tok = build_tokenizer()
    rows = [validate_row({"prompt": "copy " + "7" * k, "data_source": "copy",
                          "reward_model": {"ground_truth": "7" * k}}, "<mem>", k) for k in range(1, 40)]
    # <|bos|><|user|>copy 77..7<|assistant|>: three special tokens, one per character
    assert prompt_token_lengths(tok, rows) == [3 + len("copy ") + k for k in range(1, 40)]


def test_a_tokenizer_without_batch_rendering_falls_back_to_the_runs_encoding(chatml, data):
    _, core, tok = chatml
    _, raw, rows = data

    class OneAtATime:
        def apply_chat_template(self, conversation, **kw):
            if conversation and isinstance(conversation[0], list):
                raise TypeError("no batches")
            return tok.apply_chat_template(conversation, **kw)

    assert prompt_token_lengths(OneAtATime(), rows[:20]) == _direct(core, raw[:20])


def test_config_fields_have_veRL_names_defaults_and_checks(tmp_path):
    cfg = load_config()
    assert cfg.data.max_prompt_length == 512 and cfg.data.filter_overlong_prompts is False
    with pytest.raises(ConfigError, match="data.max_prompt_length"):
        load_config(None, ["data.max_prompt_length=0"])
    text = help_text()
    assert "data.max_prompt_length" in text and "data.filter_overlong_prompts" in text


def test_cli_rejects_an_overlong_prompt_in_one_line_before_any_worker(chatml, data, tmp_path):
    model_dir, core, _ = chatml
    path, raw, _ = data
    out = run_cli("train", "--run-dir", str(tmp_path / "run"), f"model.path={model_dir}",
                  f"data.files={path}", "data.max_prompt_length=100", timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("bidirl train: error:")]
    assert len(err) == 1 and "row 0:" in err[0] and f"{_direct(core, raw[:1])[0]} tokens" in err[0]
    assert "data.max_prompt_length=100" in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_validation_prompts_follow_the_same_rule_and_count_towards_the_context(chatml, data):
    model_dir, core, tok = chatml
    path, raw, rows = data
    lengths = _direct(core, raw)
    train, val = rows[:200], rows[200:]
    limit = max(lengths[:200])
    val_over = [r.index for r in val if lengths[r.index] > limit]
    cfg = _cfg(path, f"data.max_prompt_length={limit}", "data.filter_overlong_prompts=true",
               "rollout.max_new_tokens=16")
    _, fit = fit_prompts(cfg, train, tok, model_dir, val_rows=val)
    assert fit.val_filtered == len(val_over) and len(fit.val_rows) == 100 - len(val_over)
    assert fit.longest == limit and fit.max_model_len == limit + 16
    if val_over:  # without filtering, an over-long validation row is an error naming it
        with pytest.raises(DataError, match=f"row {val_over[0]}: validation prompt is"):
            fit_prompts(_cfg(path, f"data.max_prompt_length={limit}"), train, tok, model_dir, val_rows=val)
    # validation rows may all be filtered away: training still has its prompts
    shortest = min(lengths[:200])
    kept_train = [r for r in train if lengths[r.index] == shortest]
    long_val = [r for r in val if lengths[r.index] > shortest]
    cfg = _cfg(path, f"data.max_prompt_length={shortest}", "data.filter_overlong_prompts=true")
    _, fit = fit_prompts(cfg, kept_train, tok, model_dir, val_rows=long_val)
    assert fit.val_rows == () and fit.val_filtered == len(long_val) > 0
