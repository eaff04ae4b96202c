"""End to end with real architectures: ``bidirl train`` on veRL-layout parquet of 150-300-token
prompts, a Qwen2.5-0.5B-shaped directory with tied embeddings and a Llama-shaped untied one.

The Qwen run validates on a held-out parquet, is killed (SIGKILL, no chance to clean up)
after its first checkpoint, resumed from it, and its weights come out as Hugging Face model
directories (``RUN_DIR/model`` and ``bidirl export``) that ``AutoModelForCausalLM``,
``AutoTokenizer`` and ``vllm.LLM`` load as they are, greedy vLLM agreeing with the HF model
token for token.  Before, such a run died at
its first checkpoint ("Some tensors share memory") and no checkpoint was a model directory.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest
from runtime_cli_helpers import ROOT, SMALL, bidirl_cmd, run_cli

from bidirl.obs.metrics import read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

WORDS = ("the of and to in is you that it was for on are as with they at be this have from or one had by word "
         "but not what all were we when your can said there use each which she do how their if will").split()
PPS = 2
ARGS = [*SMALL, f"rollout.prompts_per_step={PPS}", "run.tensorboard=false", "scheduler.policy=sync",
        "cluster.prewarm=false", "run.plot=false"]


def verl_rows(n: int, seed: int = 0) -> list[dict]:
    """veRL's layout: a chat ``prompt``, ``data_source``, ``reward_model.ground_truth``, ``extra_info``;
    a long system turn makes each prompt about 150-300 tokens."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        answer = str(rng.randint(100, 99999))
        system = "Repeat the number the user gives, digit for digit. " + " ".join(
            rng.choices(WORDS, k=rng.randint(130, 250)))
        rows.append({"prompt": [{"role": "system", "content": system}, {"role": "user", "content": f"copy {answer}"}],
                     "data_source": "copy", "reward_model": {"style": "rule", "ground_truth": answer},
                     "extra_info": {"index": i, "split": "train"}})
    return rows


REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # random weights rarely copy a number: reward length, so that every group has a signal
    return min(len(solution_str), 40) / 40
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``data.files=... data.reward_fn=...`` for a veRL-layout parquet and a veRL reward file."""
    import pandas as pd

    d = tmp_path_factory.mktemp("data")
    pd.DataFrame(verl_rows(64)).to_parquet(d / "train.parquet")
    pd.DataFrame(verl_rows(6, seed=1)).to_parquet(d / "val.parquet")
    (d / "reward.py").write_text(REWARD)
    return [f"data.files={d / 'train.parquet'}", f"data.val_files={d / 'val.parquet'}",
            f"data.reward_fn={d / 'reward.py'}"]


def _prompt_lengths(stderr: str) -> tuple[float, int]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("[bidirl] prompts:"))
    return float(line.split("mean ")[1].split()[0]), int(line.split("longest ")[1].split()[0])


def _groups(run) -> list[int]:
    return sorted(json.loads(ln)["group"] for ln in (run / "trained_groups.jsonl").read_text().splitlines() if ln)


def _train_until_checkpoint_then_kill(run, args, step: int, err_path):
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="disabled")
    with err_path.open("w") as err:
        proc = subprocess.Popen(bidirl_cmd("train", "--run-dir", str(run), *args), cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            deadline = time.time() + 400
            while time.time() < deadline and proc.poll() is None:
                if (run / "checkpoints" / f"step_{step}" / "COMPLETE").is_file():
                    break
                time.sleep(0.1)
            assert proc.poll() is None, "the run ended before the kill: " + err_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the driver, Ray and its workers: no clean-up at all
            proc.wait(timeout=60)


def test_tied_qwen_trains_is_killed_resumes_and_exports_model_directories(tmp_path, qwen_dir, data,
                                                                          real_runtime_available):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    args = [*ARGS, f"model.path={qwen_dir}", *data, "run.steps=40", "run.checkpoint_every=1", "run.val_every=2"]
    _train_until_checkpoint_then_kill(run, args, 1, tmp_path / "stderr.txt")  # maybe while writing step_2
    mean, longest = _prompt_lengths((tmp_path / "stderr.txt").read_text())
    assert 150 <= mean and longest <= 300, (mean, longest)
    assert not (run / "summary.json").exists(), "killed mid-run"

    out = run_cli("train", "--resume", str(run), "run.steps=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming from {run / 'checkpoints' / 'step_1'} at step 1" in out.stderr, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit_ok"] and _groups(run) == list(range(2 * PPS)), "no group lost, none trained twice"
    assert [m["step"] for m in read_metrics(run) if "reward/mean" in m] == [0, 1]
    assert [m["val/prompts"] for m in read_metrics(run) if "val/score/mean" in m][-1] == 6, "validated"
    assert summary["model_dir"] == str(run / "model")

    ckpt = run / "checkpoints" / "step_2"
    assert {p.name for p in (ckpt / "trainer").iterdir()} == {"optimizer.pt", "trainer_state.json"}
    out = run_cli("export", str(run), str(tmp_path / "step1"), "--step", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    base = AutoModelForCausalLM.from_pretrained(str(qwen_dir))
    for d in (run / "model", ckpt / "model", tmp_path / "step1"):
        assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja"} <= {p.name for p in d.iterdir()}, d
    final = AutoModelForCausalLM.from_pretrained(str(run / "model"))
    step1 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "step1"))
    assert final.config.tie_word_embeddings and torch.equal(final.lm_head.weight, final.model.embed_tokens.weight)
    emb = [m.model.embed_tokens.weight for m in (base, step1, final)]
    assert not torch.equal(emb[0], emb[1]) and not torch.equal(emb[1], emb[2]), "trained, and on after step 1"
    tok = AutoTokenizer.from_pretrained(str(run / "model"))
    assert tok.chat_template == AutoTokenizer.from_pretrained(str(qwen_dir)).chat_template

    from vllm import LLM, SamplingParams

    from bidirl.engines.hf_reference import score_tokens

    llm = LLM(model=str(run / "model"), dtype="float32", enforce_eager=True, max_model_len=512,
              kv_cache_memory_bytes=32 << 20, distributed_executor_backend="uni")
    try:
        (res,) = llm.chat([{"role": "user", "content": "copy 48213"}], SamplingParams(temperature=0.0, max_tokens=8))
    finally:
        del llm
    ids = tok.apply_chat_template([{"role": "user", "content": "copy 48213"}], add_generation_prompt=True,
                                  tokenize=False)
    assert res.prompt_token_ids == tok(ids, add_special_tokens=False)["input_ids"], "the exported chat template"
    response = list(res.outputs[0].token_ids)
    _, argmax = score_tokens(final.eval(), res.prompt_token_ids, response)
    assert response == argmax[:len(response)], "vLLM on the exported directory = the HF model on it"


def test_untied_llama_trains(tmp_path, llama_dir, data, real_runtime_available):
    import torch
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *ARGS, f"model.path={llama_dir}", *data, "run.steps=2")
    assert out.returncode == 0, out.stderr[-3000:]
    mean, longest = _prompt_lengths(out.stderr)
    assert 150 <= mean and longest <= 300, (mean, longest)
    # vLLM's context is the longest prompt + max_new_tokens (SMALL's 8); before prompts were
    # measured it was capped at 2 * 4 + max_new_tokens + 64 and such rows failed after the start-up
    assert f"vLLM max_model_len {longest + 8}" in out.stderr, out.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["audit_ok"]
    final = AutoModelForCausalLM.from_pretrained(str(run / "model"))
    base = AutoModelForCausalLM.from_pretrained(str(llama_dir))
    assert type(final).__name__ == "LlamaForCausalLM" and not final.config.tie_word_embeddings
    assert not torch.equal(final.lm_head.weight, base.lm_head.weight)
