"""bidirl against TRL's GRPOTrainer: the same model, prompts, reward and settings, interleaved.

BENCHMARKS.md, "Against TRL". The latest series (three rounds, one pair each):

    .venv/bin/python -m bench.peer_trl --model-size small --steps 100 --val-every 20 --pairs 1 --append \
        --json bench/results/peer_trl_small_val.json
    .venv/bin/python -m bench.peer_trl --model-size large --lr 5e-4 --steps 40 --val-every 10 --pairs 1 --append \
        --json bench/results/peer_trl_large_natural_val.json
    .venv/bin/python -m bench.peer_trl --model-size large --task reverse_long --lr 5e-4 --steps 30 --val-every 10 \
        --pairs 1 --append --json bench/results/peer_trl_large_long_val.json

Both sides get the same model (``build_tiny_model`` + a 40-step warm start), task, group size,
prompts per step, max new tokens, learning rate, clipping, token-mean loss and the 2 cores
(bidirl: two one-core devices; TRL: 2 torch threads); completion tokens of the training loop,
validation off both clocks. ``--force-length`` masks EOS until the cap on both sides (equal
work). Writes ``OUT.json`` and ``OUT.png``. Needs the ``peers`` extra; without ``xxhash`` a
``hashlib`` stand-in is registered for ``datasets``. ``small`` = 2 layers / hidden 128, 32 new
tokens; ``large`` = 4 layers / hidden 256, 128.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import ROOT, code_version, train, write_json

SIZES = {"small": {"layers": 2, "hidden": 128, "max_new_tokens": 32},
         "large": {"layers": 4, "hidden": 256, "max_new_tokens": 128}}
PROMPTS, GROUP, LR, CORES = 8, 8, 1e-3, 2


def build_model(size: str, out: Path, task: str = "reverse") -> Path:
    """The tiny model of ``size`` with the 40-step warm start on ``task``: both sides' start."""
    from bidirl.models.tiny import build_tiny_model
    from bidirl.models.warm_start import warm_start

    s = SIZES[size]
    base = build_tiny_model(out / f"tiny-L{s['layers']}-H{s['hidden']}", layers=s["layers"], hidden=s["hidden"])
    return warm_start(base, out / f"{base.name}-sft-{task}-40", tasks=(task,), steps=40, seed=0)


# -- TRL ----------------------------------------------------------------------------------
def _xxhash_standin() -> None:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        import hashlib
        import types

        class xxh64:  # noqa: N801 - the name datasets calls
            def __init__(self, data: bytes = b"") -> None:
                self._h = hashlib.blake2b(digest_size=8)
                self._h.update(data)

            def update(self, data: bytes) -> None:
                self._h.update(data)

            def hexdigest(self) -> str:
                return self._h.hexdigest()

            def intdigest(self) -> int:
                return int.from_bytes(self._h.digest(), "big")

        sys.modules["xxhash"] = types.SimpleNamespace(xxh64=xxh64)


def trl_child(model_dir: str, size: str, steps: int, out: str, force: bool = False, lr: float = LR,
              task_name: str = "reverse", val_every: int = 0) -> None:
    """One TRL run in this process (called as ``--trl-child``); writes its figures to ``out``."""
    _xxhash_standin()
    import torch

    torch.set_num_threads(CORES)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bidirl.algo.data import PromptCursor
    from bidirl.algo.tasks import get_task

    task = get_task(task_name)
    # bidirl's prompt order (prepare.prepare_data's 4096 rows, PromptCursor with data.seed=0).
    cursor = PromptCursor(task.rows(4096, seed=0), seed=0)
    rows = [cursor.next().row for _ in range(PROMPTS * steps)]
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                              for r in rows])

    def reward(prompts, completions, ground_truth, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [task.score(t, g) for t, g in zip(texts, ground_truth, strict=True)]

    max_new = SIZES[size]["max_new_tokens"]
    # --force-length: EOS masked until the cap (HF's min_new_tokens; bidirl: vLLM's min_tokens).
    gen_kwargs = {"min_new_tokens": max_new} if force else None
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    times: list[float] = []
    gen_s: list[float] = []  # seconds in HF generate (the unwrapped model is this object on CPU)
    generate = model.generate

    def timed_generate(*args, **kw):
        t = time.perf_counter()
        try:
            return generate(*args, **kw)
        finally:
            gen_s.append(time.perf_counter() - t)

    model.generate = timed_generate

    val_scores: list[dict] = []
    val_s: list[float] = []  # seconds validating, taken out of the loop's clock (as bidirl's are)
    validate = _trl_validator(generate, model, tok, task, max_new)  # untimed generate

    def run_validation(step: int) -> None:
        t = time.perf_counter()
        val_scores.append({"step": step, "score": validate()})
        val_s.append(time.perf_counter() - t)

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if val_every:
                run_validation(0)

        def on_step_end(self, args, state, control, **kw):
            if val_every and (state.global_step % val_every == 0 or state.global_step == steps):
                run_validation(state.global_step)
            times.append(time.perf_counter() - sum(val_s))

    with tempfile.TemporaryDirectory(prefix="bidirl-trl-") as tmp:
        cfg = GRPOConfig(output_dir=tmp, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                         weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                         per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
                         num_generations=GROUP, steps_per_generation=1, num_iterations=1,
                         max_completion_length=max_new, temperature=1.0, top_p=1.0, top_k=0,
                         generation_kwargs=gen_kwargs,
                         beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
                         max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                         seed=0, shuffle_dataset=False, disable_tqdm=True, dataloader_num_workers=0,
                         log_completions=False)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=data,
                              processing_class=tok, callbacks=[Clock()])
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0 - sum(val_s)
        logs = [h for h in trainer.state.log_history if "reward" in h]
    lengths = [h["completions/mean_length"] for h in logs]
    completion_tokens = sum(n * PROMPTS * GROUP for n in lengths)
    step_s = [b - a for a, b in zip([t0] + times, times)]
    Path(out).write_text(json.dumps({
        "side": "trl", "loop_wall_s": wall, "steps": len(logs), "completion_tokens": completion_tokens,
        "completion_tokens_per_s": completion_tokens / wall, "seconds_per_step": statistics.mean(step_s),
        "rewards": [h["reward"] for h in logs], "mean_length": lengths, "generate_s": gen_s,
        "val_scores": val_scores, "val_s": sum(val_s)}))


def _trl_validator(generate, model, tok, task, max_new: int):
    """Greedy answers to the validation prompts bidirl uses (the task's 64 ``split="test"`` rows,
    ``data.seed=0``, the same chat-template ids), scored by the task's reward: mean score."""
    import torch

    from bidirl.models.tiny import encode_prompt
    from bidirl.runtime.validation import BUILTIN_VAL_ROWS

    rows = task.rows(BUILTIN_VAL_ROWS, seed=0, split="test")
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def validate() -> float:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=pad)
        model.train(was_training)
        texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
        return statistics.fmean(task.score(t, r["reward_model"]["ground_truth"]) for t, r in zip(texts, rows,
                                                                                                 strict=True))
    return validate


def run_trl(model_dir: Path, size: str, steps: int, force: bool, lr: float, task: str, val_every: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bidirl-trl-out-") as tmp:
        out = Path(tmp) / "trl.json"
        env = dict(os.environ, OMP_NUM_THREADS=str(CORES), TOKENIZERS_PARALLELISM="false")
        p = subprocess.run([sys.executable, "-m", "bench.peer_trl", "--trl-child", str(model_dir), size,
                            str(steps), str(out), str(int(force)), str(lr), task, str(val_every)],
                           cwd=ROOT, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"TRL run failed:\n{p.stderr[-4000:]}")
        return json.loads(out.read_text())


# -- bidirl -------------------------------------------------------------------------------
def run_bidirl(model_dir: Path, size: str, steps: int, policy: str, force: bool, lr: float, task: str,
               val_every: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bidirl-peer-") as tmp:
        run = Path(tmp) / "run"
        args = [f"model.path={model_dir}", f"data.task={task}", "data.seed=0", f"run.steps={steps}",
                f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}",
                f"rollout.max_new_tokens={SIZES[size]['max_new_tokens']}", f"trainer.lr={lr}",
                f"rollout.min_new_tokens={SIZES[size]['max_new_tokens'] if force else 0}",
                f"scheduler.policy={policy}", "cluster.rollout_devices=1", "cluster.train_devices=1",
                f"run.val_every={val_every}", f"run.val_before_train={str(bool(val_every)).lower()}",
                "run.plot=false", "run.tensorboard=false", "run.checkpoint_every=0"]
        p = train(run, args)
        if not p.ok:
            raise RuntimeError(f"bidirl run failed:\n{p.stderr[-4000:]}")
        s, recs = p.summary(), p.metrics()
        lengths = [d["response_length/mean"] for d in recs if "response_length/mean" in d and "critic/score/mean" in d]
        gen_s = [d["timing_s/gen"] for d in recs if "timing_s/gen" in d and "critic/score/mean" in d]
        vals = [d for d in recs if "val/score/mean" in d]
    # The validations inside the loop took their seconds of replica 0's device from the rollout;
    # like TRL's they come off the clock (the final one is outside the loop already).
    val_s = sum(d["timing_s/val"] for d in vals if d["step"] < steps)
    wall = s["wall_s"] - val_s
    completion_tokens = sum(n * PROMPTS * GROUP for n in lengths)
    return {"side": "bidirl", "policy": policy, "loop_wall_s": wall, "steps": s["steps"],
            "completion_tokens": completion_tokens, "completion_tokens_per_s": completion_tokens / wall,
            "val_scores": [{"step": d["step"], "score": d["val/score/mean"]} for d in vals], "val_s": val_s,
            "seconds_per_step": statistics.mean(s["step_times_s"]), "rewards": s["rewards"], "mean_length": lengths,
            "borrows": s["borrows"], "gen_s": gen_s}


def summarise(pairs: list[dict]) -> dict:
    def med(side: str, key: str) -> float:
        return statistics.median(p[side][key] for p in pairs)

    ratios = [p["bidirl"]["completion_tokens_per_s"] / p["trl"]["completion_tokens_per_s"] for p in pairs]
    return {"pairs": len(pairs), "ratio_completion_tokens_per_s": statistics.median(ratios),
            "ratios": ratios,
            "bidirl": {"completion_tokens_per_s": med("bidirl", "completion_tokens_per_s"),
                       "seconds_per_step": med("bidirl", "seconds_per_step"),
                       "reward_last_10": _last(pairs, "bidirl"),
                       "val_first": _val(pairs, "bidirl", 0), "val_last": _val(pairs, "bidirl", -1)},
            "trl": {"completion_tokens_per_s": med("trl", "completion_tokens_per_s"),
                    "seconds_per_step": med("trl", "seconds_per_step"),
                    "reward_last_10": _last(pairs, "trl"),
                    "val_first": _val(pairs, "trl", 0), "val_last": _val(pairs, "trl", -1)}}


def _val(pairs: list[dict], side: str, which: int) -> float | None:
    """The first (``which=0``) or last (``-1``) validation score, averaged over pairs."""
    scores = [p[side]["val_scores"][which]["score"] for p in pairs if p[side].get("val_scores")]
    return statistics.mean(scores) if scores else None


def _mean_curve(runs: list[dict], key: str) -> list[float]:
    n = min(len(r[key]) for r in runs)
    return [statistics.mean(r[key][i] for r in runs) for i in range(n)]


def plot(result: dict, png: Path) -> Path:
    """Reward per step, reward against loop seconds and greedy validation, both sides (mean over pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    has_val = any(r[side].get("val_scores") for r in runs for side in ("trl", "bidirl"))
    fig, axes = plt.subplots(1, 3 if has_val else 2, figsize=(15 if has_val else 10, 4))
    for side, label in (("trl", "TRL GRPOTrainer"), ("bidirl", "bidirl")):
        sides = [r[side] for r in runs]
        reward = _mean_curve(sides, "rewards")
        axes[0].plot(range(1, len(reward) + 1), reward, label=label)
        per_step = [r["loop_wall_s"] / max(1, r["steps"]) for r in sides]
        seconds = statistics.mean(per_step)
        axes[1].plot([seconds * (i + 1) for i in range(len(reward))], reward, label=label)
        if has_val:
            by_step: dict[int, list[float]] = {}
            for r in sides:
                for v in r.get("val_scores", []):
                    by_step.setdefault(v["step"], []).append(v["score"])
            steps = sorted(by_step)
            axes[2].plot(steps, [statistics.mean(by_step[k]) for k in steps], marker="o", label=label)
    s = result["settings"]
    axes[0].set(xlabel="step", ylabel="mean reward", title=f"{s['model_size']} model, {s.get('task', 'reverse')}")
    axes[1].set(xlabel="training-loop seconds (mean s/step x step)", ylabel="mean reward",
                title=f"bidirl / TRL completion tok/s: {result['ratio_completion_tokens_per_s']:.2f}")
    if has_val:
        axes[2].set(xlabel="step", ylabel="greedy validation score", title="validation (64 test prompts)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result['pairs']} interleaved pairs, mean over pairs")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def _last(pairs: list[dict], side: str, k: int = 10) -> float:
    """Mean reward of the last ``k`` steps, averaged over pairs."""
    return statistics.mean(statistics.mean(p[side]["rewards"][-k:]) for p in pairs)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-child":
        a = sys.argv
        trl_child(a[2], a[3], int(a[4]), a[5], a[6] == "1", float(a[7]), a[8], int(a[9]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-size", choices=sorted(SIZES), default="small")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="training steps per run (both sides)")
    ap.add_argument("--policy", default="bidirl", help="bidirl's scheduling policy")
    ap.add_argument("--force-length", action="store_true",
                    help="both sides mask EOS until max new tokens: every response runs to the cap (equal work)")
    ap.add_argument("--lr", type=float, default=LR, help="learning rate (both sides)")
    ap.add_argument("--task", default="reverse", choices=("reverse", "reverse_long"),
                    help="built-in task (prompts, reward, warm start); reverse_long: 16-48 digits, long answers")
    ap.add_argument("--val-every", type=int, default=0,
                    help="both sides validate greedily on the task's 64 test prompts before training and every "
                         "K steps (off the clock on both sides); 0: no validation")
    ap.add_argument("--json", required=True)
    ap.add_argument("--append", action="store_true", help="add pairs to OUT (same settings)")
    a = ap.parse_args()
    path = Path(a.json)
    settings = {"model_size": a.model_size, **SIZES[a.model_size], "steps": a.steps, "prompts_per_step": PROMPTS,
                "group_size": GROUP, "lr": a.lr, "cores": CORES, "policy": a.policy,
                "force_length": a.force_length, **({"task": a.task} if a.task != "reverse" else {}),
                **({"val_every": a.val_every} if a.val_every else {})}
    pairs = []
    if a.append and path.is_file():
        old = json.loads(path.read_text())
        if old["settings"] != settings:
            raise SystemExit(f"--append: {path} holds other settings: {old['settings']}")
        pairs = old["runs"]
    with tempfile.TemporaryDirectory(prefix="bidirl-peer-model-") as tmp:
        model_dir = build_model(a.model_size, Path(tmp), a.task)
        for k in range(a.pairs):
            trl = run_trl(model_dir, a.model_size, a.steps, a.force_length, a.lr, a.task, a.val_every)
            ours = run_bidirl(model_dir, a.model_size, a.steps, a.policy, a.force_length, a.lr, a.task, a.val_every)
            pairs.append({"trl": trl, "bidirl": ours, "date": time.strftime("%Y-%m-%d %H:%M"), "code": code_version(),
                          "load_avg": os.getloadavg()[0]})
            print(f"[peer_trl] pair {k + 1}: TRL {trl['completion_tokens_per_s']:.0f} completion tok/s, "
                  f"{trl['seconds_per_step']:.2f} s/step; bidirl {ours['completion_tokens_per_s']:.0f} tok/s, "
                  f"{ours['seconds_per_step']:.2f} s/step", file=sys.stderr)
            write_json(path, {"settings": settings, **summarise(pairs), "runs": pairs})
    result = json.loads(path.read_text())
    print(f"[peer_trl] plot: {plot(result, path.with_suffix('.png'))}", file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
