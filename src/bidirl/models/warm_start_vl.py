"""Short supervised warm start of a vision-language model on a built-in visual task.

Why, as for the text tasks (``models/warm_start.py``): a random tiny model never writes
``\\boxed{...}``, so every reward of a group is 0 and GRPO learns nothing.  SFT steps on the
task's ``prompt + image -> \\boxed{answer}<|eos|>`` teach the format, so that sampled
answers score above 0, the regime where GRPO has a signal.

What the targets are (``truth_fraction``): each example's ground truth with that probability,
else an answer drawn uniformly from its question's answers (``tasks_visual.ANSWERS``).  The
default, 85 steps at 2e-3 on the ground truth (``1.0``), stops the warm start part-way into
reading the picture: supervised learning of ``shapes`` is a cliff (greedy validation, seed 0:
0.20 at 70 steps, 0.30 at 85, 0.47 at 100, 0.61 at 300; the colour of the largest shape is
read first, the circles' count much later), and 85 steps leave greedy validation at 0.30-0.34
(seeds 0 and 1) with a few colours read.  RL then has a signal that points at the picture and
climbs from there (seed 0, sync, lr 1e-4: 0.297 -> 0.492 in 300 steps).  ``0.0`` is the
earlier default, the format only: greedy decoding starts at a constant answer per question
(~0.15) and 300 RL steps stayed flat for 200-250 of them (+0.04 to +0.30 over 2 seeds);
``0.5`` for 100 steps did no better (+0.125)
(docs/notes/2026-12-08-visual-warm-start.md).

The examples are built as the run builds its inputs: the processor's chat template with one
image placeholder per image expanded to the image's tokens (``algo/multimodal.encode_image_prompt``),
and the pixels from the images' bytes by the trainer's own path (``engines/vision_inputs.py``).
The loss is token-mean cross-entropy on the answer tokens and the closing EOS.  The result is
a model directory (weights, configs, tokenizer and processor files) with a
``bidirl_warm_start.json`` marker that makes the call idempotent, as the text warm start's.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from bidirl.algo import tasks_visual  # noqa: F401  (registers the visual task "shapes")
from bidirl.algo.multimodal import encode_image_prompt, validate_image_row
from bidirl.algo.tasks import get_task
from bidirl.algo.tasks_visual import ANSWERS
from bidirl.engines.hf_io import TOKENIZER_FILES, quiet_hf_progress_bars
from bidirl.models.tiny import replace_dir

_MARKER = "bidirl_warm_start.json"
WARM_START_STEPS = get_task("shapes").warm_start_steps
WARM_START_LR = 2e-3
"""At 5e-3 the format is learnt at once and the model no longer learns the picture under RL
(colour flat over 200 steps, 2026-12-05); 2e-3 reaches the picture's cliff in 70-100 steps."""
WARM_START_TRUTH_FRACTION = 1.0
"""The share of examples trained on their ground truth (the rest on a random answer)."""


def vl_sft_examples(processor, task_name: str, n: int,
                    seed: int) -> list[tuple[list[int], list[int], list[list[int]], tuple]]:
    """(expanded prompt ids, the ground truth's ``\\boxed{answer}`` ids + EOS, those of every
    answer the row's question can have, the images' bytes) of ``n`` task rows."""
    tok = processor.tokenizer

    def target(answer: str) -> list[int]:
        return tok.encode(f"\\boxed{{{answer}}}", add_special_tokens=False) + [tok.eos_token_id]

    out = []
    for i, raw in enumerate(get_task(task_name).rows(n, seed=seed, split="sft")):
        row = validate_image_row(raw, f"<task {task_name}, split sft>", i)
        prompt = encode_image_prompt(processor, row).input_ids
        answers = ANSWERS[raw["extra_info"]["question"]]
        out.append((prompt, target(raw["reward_model"]["ground_truth"]), [target(a) for a in answers], row.images))
    return out


def warm_start_vl(model_dir: str | Path, out_dir: str | Path, task: str = "shapes", steps: int = WARM_START_STEPS,
                  batch_size: int = 64, lr: float = WARM_START_LR, seed: int = 0, num_threads: int | None = 1,
                  truth_fraction: float = WARM_START_TRUTH_FRACTION) -> Path:
    """SFT ``model_dir`` for ``steps`` steps on ``task``'s image rows and save it to ``out_dir``.
    Each example's target is its ground truth with probability ``truth_fraction``, else an
    answer drawn uniformly from its question's answers (see the module's docstring).

    Idempotent: returns ``out_dir`` untouched if it holds a warm start of the same source and
    arguments."""
    if not 0.0 <= truth_fraction <= 1.0:
        raise ValueError(f"truth_fraction: a probability in [0, 1], not {truth_fraction!r}")
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    spec = {"source": str(model_dir.resolve()), "tasks": [task], "steps": steps, "batch_size": batch_size,
            "lr": lr, "seed": seed, "truth_fraction": truth_fraction}
    marker = out_dir / _MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("spec") == spec:
        return out_dir
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from bidirl.engines.torch_setup import set_torch_threads  # lazy, as torch: not when the warm start is on disk
    from bidirl.engines.vision_inputs import VisionInputs  # lazy: imports torch

    quiet_hf_progress_bars()
    if num_threads is not None:
        set_torch_threads(num_threads)
    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).train()
    pad = processor.tokenizer.pad_token_id
    vision = VisionInputs(model_dir)
    examples = vl_sft_examples(processor, task, max(512, batch_size * 8), seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.1, 1 - s / steps))
    rng = random.Random(seed)
    start, losses = time.perf_counter(), []
    for _ in range(steps):
        batch = [(p, truth if rng.random() < truth_fraction else rng.choice(others), imgs)
                 for p, truth, others, imgs in rng.sample(examples, batch_size)]
        L = max(len(p) + len(a) for p, a, _ in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        labels = torch.full((len(batch), L), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), L), dtype=torch.long)
        for b, (p, a, _) in enumerate(batch):
            ids[b, :len(p) + len(a)] = torch.tensor(p + a)
            labels[b, len(p):len(p) + len(a)] = torch.tensor(a)
            attention[b, :len(p) + len(a)] = 1
        extra = vision.forward_kwargs(model, ids, attention, [imgs for _, _, imgs in batch], "cpu")
        loss = model(input_ids=ids, attention_mask=attention, labels=labels, use_cache=False, **extra).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    report = {"spec": spec, "seconds": time.perf_counter() - start, "first_loss": losses[0] if losses else None,
              "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:]))}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in model_dir.iterdir():  # the tokenizer, processor and marker files, as the source has them
            if f.is_file() and (f.name in TOKENIZER_FILES or f.suffix == ".json") and not (tmp / f.name).exists():
                shutil.copy2(f, tmp / f.name)
        (tmp / _MARKER).write_text(json.dumps(report, indent=1))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
