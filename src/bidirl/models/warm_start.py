"""Short supervised warm start so that RL on a built-in task has a signal.

Why: a randomly initialised model almost never emits a digit string of the right shape, so
every reward in a group is 0, every group-normalised advantage is 0 and GRPO learns nothing.
A few hundred tiny SFT steps on the task's ``prompt -> answer<|eos|>`` format teach the format
and part of the mapping (a multi-turn tool task: whole episodes of its expert, the
environment's turns masked, ``episode_examples``); sampled answers then earn a mean reward clearly above 0 and clearly
below 1, which is the regime where GRPO's improvement is visible within minutes on a CPU.

The SFT loss is token-mean cross-entropy on the answer tokens (and the closing EOS) only; the
prompt is context. The result is saved as a normal HF directory (weights, config, tokenizer),
next to a ``bidirl_warm_start.json`` marker that makes the call idempotent.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from bidirl.algo.chat_tokens import observation_ids, prompt_ids
from bidirl.algo.episode import EpisodeLimits, run_episode
from bidirl.algo.tasks import mixed_rows
from bidirl.algo.tasks_tools import TOOL_TASKS
from bidirl.engines.hf_io import quiet_hf_progress_bars
from bidirl.models.tiny import encode_prompt, replace_dir

_MARKER = "bidirl_warm_start.json"


def sft_examples(task_names: list[str], n: int, tokenizer, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) pairs drawn from the built-in tasks."""
    out = []
    for row in mixed_rows(task_names, n, seed=seed, split="sft"):
        prompt = encode_prompt(tokenizer, row["prompt"])
        answer = tokenizer.encode(str(row["reward_model"]["ground_truth"]), add_special_tokens=False)
        out.append((prompt, answer + [tokenizer.eos_token_id]))
    return out


def episode_examples(task_name: str, n: int, tokenizer, seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, trajectory ids, loss mask) of ``n`` episodes of a built-in tool task played
    by its expert (``algo/tasks_tools.py``), tokenised as the runtime tokenises a trajectory
    (``algo/chat_tokens.py``): the model's turns each closed by EOS and trained on, the
    environment's turns masked."""
    task = TOOL_TASKS[task_name]
    limits = EpisodeLimits(task.max_turns, 1 << 16, 30.0)
    out = []
    for row in task.rows(n, seed=seed, split="sft"):
        env = task.environment()
        tools = getattr(env, "schemas", None) or None
        traj = run_episode(env, row, task.expert(row), lambda text: 0, limits)
        first = [{"role": t.role, "content": t.text} for t in traj.turns[:1]]
        ids, mask, pending = [], [], []
        for t in traj.turns[1:]:
            if t.trains:
                if pending:
                    env_ids = observation_ids(tokenizer, pending, tools, ended_with_eos=True)
                    ids, mask, pending = ids + env_ids, mask + [0] * len(env_ids), []
                turn = tokenizer.encode(t.text, add_special_tokens=False) + [tokenizer.eos_token_id]
                ids, mask = ids + turn, mask + [1] * len(turn)
            else:
                pending.append({"role": t.role, "content": t.text})
        out.append((prompt_ids(tokenizer, first, tools), ids, mask))
    return out


def rows_fingerprint(tasks, seed: int) -> str:
    """A short hash of the tasks' first SFT rows: a cached warm start of a task whose rows have
    since changed (guess_number's range went from 32 to 64) is redone, not reused."""
    tool = [t for t in tasks if t in TOOL_TASKS]
    rows = TOOL_TASKS[tool[0]].rows(8, seed=seed, split="sft") if tool else mixed_rows(list(tasks), 8, seed, "sft")
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _batch(examples, pad_id: int):
    """Padded ids, labels (-100 off the answer, and on a trajectory's environment tokens) and
    the attention mask of (prompt, answer) or (prompt, trajectory, loss mask) examples."""
    import torch

    L = max(len(e[0]) + len(e[1]) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), L), dtype=torch.long)
    for b, (p, a, *rest) in enumerate(examples):
        seq = p + a
        target = a if not rest else [x if m else -100 for x, m in zip(a, rest[0])]
        ids[b, : len(seq)] = torch.tensor(seq)
        labels[b, len(p) : len(seq)] = torch.tensor(target)
        attention[b, : len(seq)] = 1
    return ids, labels, attention


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    tasks: tuple[str, ...] = ("copy",),
    steps: int = 100,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    num_threads: int | None = 1,
) -> Path:
    """SFT ``model_dir`` for ``steps`` steps on ``tasks`` and save the result to ``out_dir``.

    Idempotent: returns ``out_dir`` untouched if it already holds a warm start of the same
    source model with the same arguments. Defaults take ~5 s on one core for the 2-layer model.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    spec = {
        "source": str(model_dir.resolve()), "tasks": list(tasks), "steps": steps,
        "batch_size": batch_size, "lr": lr, "seed": seed, "rows": rows_fingerprint(tasks, seed),
    }
    marker = out_dir / _MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("spec") == spec:
        return out_dir  # before importing torch and transformers' models: ~5 s of a run's start-up
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # lazy, as torch above: not loaded when the warm start is on disk already
    from bidirl.engines.torch_setup import set_torch_threads

    quiet_hf_progress_bars()
    if num_threads is not None:
        set_torch_threads(num_threads)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).train()
    n = max(4096, batch_size * 8)
    tool = [t for t in tasks if t in TOOL_TASKS]
    examples = (episode_examples(tool[0], n // 4, tok, seed) if tool  # whole episodes of the task's expert
                else sft_examples(list(tasks), n, tok, seed))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    rng = random.Random(seed)
    start, losses = time.perf_counter(), []
    for _ in range(steps):
        ids, labels, attention = _batch(rng.sample(examples, batch_size), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    report = {
        "spec": spec, "seconds": time.perf_counter() - start,
        "first_loss": losses[0] if losses else None, "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        for f in model_dir.iterdir():  # keep the tiny-model marker and anything else small
            if f.suffix == ".json" and not (tmp / f.name).exists():
                shutil.copy2(f, tmp / f.name)
        (tmp / _MARKER).write_text(json.dumps(report, indent=1))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def warm_start_report(out_dir: str | Path) -> dict:
    """The marker written by :func:`warm_start` (spec, seconds, first/final loss)."""
    return json.loads((Path(out_dir) / _MARKER).read_text())
