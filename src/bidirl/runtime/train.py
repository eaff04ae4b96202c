"""``bidirl train``: a real GRPO run, driven by the same controller as the simulator.

The run, in order: resolve and validate the config -> load the prompts -> build (or take)
the model -> measure every prompt with its tokenizer (``fit_prompts``), while Ray starts on
loopback beside it -> one device worker per device, each hosting its pool's role -> controller +
policy + DeviceExecutor -> run until the last step -> write the trace, the timeline, the
final metrics and a checkpoint.  Everything lands in the run directory (``runs/<time>`` by default)::

    config.yaml  metrics.jsonl  events.out.tfevents.*  trace.json  timeline.png
    trained_groups.jsonl (ledger audit)  summary.json  admissions.jsonl  checkpoints/step_<k>/
    resume_changes.jsonl (what each --resume changed, if anything)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bidirl.runtime.config import ConfigError, TrainConfig, load_config
from bidirl.runtime.exits import note_run_dir

MODELS_CACHE = Path(os.environ.get("BIDIRL_CACHE", Path.home() / ".cache" / "bidirl")) / "models"


def prepare_model(cfg: TrainConfig) -> str:
    """A local HF model directory: the user's, or bidirl's tiny model plus a warm start."""
    if cfg.model.path:
        return str(Path(cfg.model.path).resolve())
    from bidirl.algo.tiny_model import build_tiny_model
    from bidirl.algo.warm_start import warm_start

    base = MODELS_CACHE / f"tiny-L{cfg.model.tiny_layers}-H{cfg.model.tiny_hidden}"
    build_tiny_model(base, layers=cfg.model.tiny_layers, hidden=cfg.model.tiny_hidden)
    if cfg.model.warm_start_steps <= 0:
        return str(base)
    tasks = (cfg.data.task,) if cfg.data.task and not cfg.data.files else ("copy",)
    out = MODELS_CACHE / f"{base.name}-sft-{'-'.join(tasks)}-{cfg.model.warm_start_steps}"
    print(f"[bidirl] warm start: {cfg.model.warm_start_steps} SFT steps on {tasks} -> {out}", file=sys.stderr)
    warm_start(base, out, tasks=tasks, steps=cfg.model.warm_start_steps, seed=cfg.run.seed)
    return str(out)


def prepare_data(cfg: TrainConfig):
    """(rows, reward_fn): validated prompt rows and the veRL-style reward function.

    The reward comes as a ``RewardFn`` carrying ``data.on_bad_reward`` (which
    ``GroupStore.score`` applies) and has been tried once on the first row.
    """
    from bidirl.algo import tasks as task_lib
    from bidirl.algo.data import load_dataset, load_reward_fn, validate_row
    from bidirl.runtime.group_store import RewardFn

    if cfg.data.files:
        rows = [r for f in cfg.data.files for r in load_dataset(f)]
    else:
        try:
            task = task_lib.get_task(cfg.data.task)
        except (KeyError, ValueError):
            raise ConfigError(f"data.task: {cfg.data.task!r} not allowed; one of "
                              f"{', '.join(task_lib.task_names())}") from None
        rows = [validate_row(r, f"<task {task.name}>", i)
                for i, r in enumerate(task.rows(4096, seed=cfg.data.seed))]
    if cfg.data.reward_fn:
        fn = load_reward_fn(cfg.data.reward_fn, cfg.data.reward_fn_name)
        name = f"{Path(cfg.data.reward_fn).name}:{cfg.data.reward_fn_name}"
    else:
        fn, name = task_lib.compute_score, "the built-in compute_score"
    reward_fn = RewardFn(fn, cfg.data.on_bad_reward, name)
    if rows:
        check_reward_fn(reward_fn, rows[0])
    return rows, reward_fn


def prepare_val_rows(cfg: TrainConfig) -> list:
    """The validation prompts: ``data.val_files`` (their first ``data.val_max_samples`` rows), or
    a built-in task's ``split="test"`` rows; none when validation is off or there are none."""
    from bidirl.algo import tasks as task_lib
    from bidirl.algo.data import load_dataset, validate_row
    from bidirl.runtime.validation import BUILTIN_VAL_ROWS

    if not cfg.run.val_every and not cfg.run.val_before_train:
        return []
    n = cfg.data.val_max_samples
    if cfg.data.val_files:
        rows = [r for f in cfg.data.val_files for r in load_dataset(f)]
        return rows if n < 0 else rows[:n]
    if cfg.data.files:
        return []  # user data with no validation files: nothing to validate on
    task = task_lib.get_task(cfg.data.task)  # prepare_data has checked the name
    n = BUILTIN_VAL_ROWS if n < 0 else n
    return [validate_row(r, f"<task {task.name}, split test>", i)
            for i, r in enumerate(task.rows(n, seed=cfg.data.seed, split="test"))]


@dataclass(frozen=True)
class PromptLengths:
    """The data's prompts as the rollout sees them, measured before any worker starts."""

    kept: int
    """Rows the run samples from."""
    filtered: int
    """Rows dropped for being longer than ``data.max_prompt_length``."""
    mean: float
    """Mean tokens of a kept prompt: the controller's ``ClusterSpec.prompt_tokens``."""
    longest: int
    """Tokens of the longest kept prompt."""
    max_model_len: int
    """vLLM's context: the longest kept prompt (validation's included) + ``rollout.max_new_tokens``."""
    val_rows: tuple = ()
    """The validation rows kept (``data.max_prompt_length`` applies to them alike)."""
    val_filtered: int = 0


_CHUNK = 4096


def prompt_token_lengths(tok, rows) -> list[int]:
    """Tokens of every row's prompt, chat template applied, as ``encode_prompt`` encodes it.

    Rendered and tokenized in batches (1.3-2x faster than one row at a time on 2 cores, and
    the tokenizer spreads a batch over every core); the first rows of each batch are checked
    against :func:`encode_prompt` and, should a tokenizer disagree, the batch is encoded one
    row at a time instead.
    """
    from bidirl.algo.tiny_model import encode_prompt

    lengths: list[int] = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        try:
            texts = tok.apply_chat_template([list(r.messages) for r in chunk], add_generation_prompt=True,
                                            tokenize=False)
            ids = tok(list(texts), add_special_tokens=False)["input_ids"]
            same = all(list(ids[i]) == encode_prompt(tok, r.messages) for i, r in enumerate(chunk[:8]))
        except Exception:  # a tokenizer without batch rendering: the run's own path below
            same = False
        if same:
            lengths.extend(len(x) for x in ids)
        else:
            lengths.extend(len(encode_prompt(tok, r.messages)) for r in chunk)
    return lengths


def model_context(model_dir: str | Path | None) -> int | None:
    """The longest context ``config.json`` allows (``max_position_embeddings``, times a RoPE
    scaling factor if any), or None if the config does not say.  Lenient on purpose: it only
    serves to reject a ``max_model_len`` that vLLM would refuse after the whole start-up."""
    if model_dir is None:
        return None
    try:
        hf = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if "max_position_embeddings" not in hf and isinstance(hf.get("text_config"), dict):
        hf = hf["text_config"]
    mpe = hf.get("max_position_embeddings")
    if not isinstance(mpe, int) or mpe <= 0:
        return None
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    return int(mpe * max(1.0, float(factor))) if isinstance(factor, int | float) else mpe


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.32's CPU attention runs (``CPUAttentionBackend.get_supported_head_sizes``;
``tests/runtime/test_real_models.py`` checks the two agree)."""
TINY_HEADS = 4
"""Attention heads of bidirl's tiny model (``build_tiny_model``'s default)."""


def check_model_shape(cfg: TrainConfig) -> None:
    """``ConfigError`` for a model vLLM cannot run on ``cluster.device``, before anything starts.

    Without it a model whose attention head size vLLM's CPU backend lacks (16, say) dies with
    a raw traceback from inside a worker after the whole start-up.  Reads ``config.json``
    only (no torch, no vLLM).  On CUDA vLLM has a backend for every head size.
    """
    if cfg.model.path is None:
        hidden = cfg.model.tiny_hidden
        if hidden % TINY_HEADS:
            raise ConfigError(f"model.tiny_hidden: must be a multiple of {TINY_HEADS} (the tiny model's "
                              f"attention heads), got {hidden}")
        head_dim, field, where = hidden // TINY_HEADS, "model.tiny_hidden", f"tiny_hidden {hidden} / {TINY_HEADS} heads"
    else:
        path = Path(cfg.model.path) / "config.json"
        try:
            hf = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.path: {path} is {'missing' if isinstance(e, OSError) else 'not JSON'}; "
                              "a Hugging Face model directory has a config.json") from None
        if isinstance(hf.get("text_config"), dict) and "num_attention_heads" not in hf:
            hf = hf["text_config"]
        try:
            heads = int(hf["num_attention_heads"])
            head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return  # an architecture this check does not know: vLLM decides
        field = "model.path"
        where = (f"head_dim {hf['head_dim']}" if hf.get("head_dim") else
                 f"hidden_size {hf.get('hidden_size')} / num_attention_heads {heads}") + f" in {path}"
    if cfg.cluster.device == "cpu" and head_dim not in CPU_HEAD_SIZES:
        raise ConfigError(f"{field}: attention head size {head_dim} ({where}) is not one vLLM's CPU attention "
                          f"runs ({', '.join(map(str, CPU_HEAD_SIZES))}); use a model with one of them, "
                          f"or cluster.device=cuda")


def _within_limit(cfg: TrainConfig, rows: list, tok, source: str, what: str,
                  need_one: bool) -> tuple[list, list[int], int]:
    """(kept rows, their lengths, how many were over ``data.max_prompt_length``).

    An over-long row is a ``DataError`` naming it unless ``data.filter_overlong_prompts``;
    with ``need_one``, so is having none left.
    """
    from bidirl.algo.data import DataError

    limit = cfg.data.max_prompt_length
    lengths = prompt_token_lengths(tok, rows)
    over = [i for i, n in enumerate(lengths) if n > limit]
    if over and not cfg.data.filter_overlong_prompts:
        first = rows[over[0]]
        raise DataError(f"{first.path or source}: row {first.index}: {what} is {lengths[over[0]]} tokens "
                        f"(chat template applied), over data.max_prompt_length={limit} "
                        f"({len(over)} of {len(rows)} rows are); raise data.max_prompt_length "
                        f"or set data.filter_overlong_prompts=true to drop them")
    if need_one and len(over) == len(rows):
        raise DataError(f"{source}: all {len(rows)} prompts are over data.max_prompt_length={limit} tokens "
                        f"(the shortest is {min(lengths)}); nothing left to train on")
    kept = [(r, n) for r, n in zip(rows, lengths, strict=True) if n <= limit]
    return [r for r, _ in kept], [n for _, n in kept], len(over)


def fit_prompts(cfg: TrainConfig, rows: list, tok, model_dir: str | Path | None = None, val_rows=()):
    """(kept rows, :class:`PromptLengths`): every prompt measured with the run's tokenizer.

    ``val_rows`` (validation prompts) are measured and filtered by the same rule and count
    towards ``max_model_len``; the kept ones are ``PromptLengths.val_rows``.

    A prompt longer than ``data.max_prompt_length`` is dropped and counted when
    ``data.filter_overlong_prompts`` is set, else it is a ``DataError`` naming the first such
    row, its length and the limit.  vLLM's ``max_model_len`` is the longest kept prompt +
    ``rollout.max_new_tokens`` (a resumed response's prompt + prefix stays below it), and must
    fit the model's context.  Called before any device worker starts (Ray starts meanwhile),
    so a bad combination fails in seconds.
    """
    from bidirl.algo.data import DataError

    if not rows:
        raise DataError("data: no prompt rows")
    limit, new = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    kept, kept_lengths, n_over = _within_limit(cfg, rows, tok, "data", "prompt", need_one=True)
    longest = max(kept_lengths)
    val_kept: list = []
    val_over = 0
    if val_rows:
        val_kept, val_lengths, val_over = _within_limit(cfg, list(val_rows), tok, "validation data",
                                                        "validation prompt", need_one=False)
        longest = max([longest] + val_lengths)
    fit = PromptLengths(kept=len(kept), filtered=n_over, mean=statistics.fmean(kept_lengths),
                        longest=longest, max_model_len=longest + new, val_rows=tuple(val_kept),
                        val_filtered=val_over)
    context = model_context(model_dir)
    if context is not None and fit.max_model_len > context:
        raise ConfigError(f"the longest prompt ({longest} tokens) + rollout.max_new_tokens ({new}) = "
                          f"{fit.max_model_len} tokens is over the model's context of {context} "
                          f"(max_position_embeddings in {Path(model_dir) / 'config.json'}); set "
                          f"data.max_prompt_length<={context - new} with data.filter_overlong_prompts=true, "
                          f"or lower rollout.max_new_tokens")
    val = ""
    if fit.val_rows:
        when = (["before training"] if cfg.run.val_before_train else []) + (
            [f"every {cfg.run.val_every} steps"] if 0 < cfg.run.val_every < cfg.run.steps else []) + (
            ["at the end"] if cfg.run.val_every else [])
        every = ", ".join(when)
        how = "greedy" if cfg.rollout.val_temperature == 0 else f"temperature {cfg.rollout.val_temperature:g}"
        val = (f"; validation: {len(fit.val_rows)} prompts{f' ({val_over} dropped)' if val_over else ''}, "
               f"{every}, {how}")
    elif cfg.run.val_every and cfg.data.files and not cfg.data.val_files:
        val = "; validation: off (no data.val_files)"
    print(f"[bidirl] prompts: {fit.kept} rows, mean {fit.mean:.1f} / longest {fit.longest} tokens"
          f"{f', {fit.filtered} over data.max_prompt_length={limit} dropped' if fit.filtered else ''}{val}; "
          f"vLLM max_model_len {fit.max_model_len}", file=sys.stderr)
    return kept, fit


def response_cap(cfg: TrainConfig):
    """``group_id -> its response cap``: ``rollout.max_new_tokens``, or the length curriculum
    from ``rollout.max_new_tokens_start`` (linear in the group's step; ids are global)."""
    end, start = cfg.rollout.max_new_tokens, cfg.rollout.max_new_tokens_start
    if start is None or start == end:
        return None
    per_step, last = cfg.rollout.prompts_per_step, max(cfg.run.steps - 1, 1)

    def cap(group_id: int) -> int:
        step = min(group_id // per_step, last)
        return max(1, round(start + (end - start) * step / last))

    return cap


def check_reward_fn(reward_fn, row) -> None:
    """Call the reward once, on ``row`` with an empty response, before any worker starts.

    A function that raises or returns no finite number is reported now rather than after
    the start-up: an error with ``data.on_bad_reward=error``, a warning with ``zero``.
    """
    from bidirl.runtime.group_store import BadRewardError, call_reward, describe_bad_reward

    value, raw = call_reward(reward_fn, row.data_source, "", row.ground_truth, row.extra_info)
    if value is not None:
        return
    what = (f"data.reward_fn: {reward_fn.name} {describe_bad_reward(raw)} when tried on data row {row.index} "
            f"(data_source {row.data_source!r}) with an empty response")
    if reward_fn.on_bad_reward == "error":
        raise BadRewardError(f"{what}, before any worker started; fix the reward function or set "
                             "data.on_bad_reward=zero to score such responses 0")
    print(f"[bidirl] warning: {what}; such rewards will be scored 0 (data.on_bad_reward=zero)", file=sys.stderr)


RESUME_SAFE = ("run.steps", "run.checkpoint_every", "run.keep_checkpoints", "run.tensorboard", "run.plot",
               "scheduler.policy", "cluster.", "rollout.max_num_seqs", "rollout.kv_cache_mb", "trainer.",
               "data.on_bad_reward",
               "run.val_every", "run.val_before_train", "run.val_samples", "run.train_samples_every",
               "run.train_samples", "run.wandb", "run.wandb_project", "run.wandb_name", "run.worker_log_level",
               "data.val_files", "data.val_max_samples", "rollout.val_temperature")
"""Fields ``--resume DIR key=value`` may change (a name ending in ``.``: its whole section).

They change how the rest of the run is carried out, not the data stream or the ledger of
trained groups: the length (``run.steps``, at least the checkpoint's step), checkpoint
spacing and count, logging, the scheduling policy, the cluster (devices, Ray address,
prewarm), vLLM's capacity (``rollout.max_num_seqs``, ``rollout.kv_cache_mb``), the trainer
(``trainer.lr``, its schedule and every other optimizer and loss setting: the schedule
follows the version, and the loaded optimizer state keeps its moments and takes the new
hyperparameters, ``TorchTrainer.load_checkpoint``; threads, micro-batch size, what a
non-finite step does), what a bad reward scores, and what is only reported (validation:
``run.val_*``, ``data.val_*``, ``rollout.val_temperature``; samples, Weights & Biases,
worker log level).  With a decaying ``trainer.lr_schedule`` and ``trainer.lr_decay_steps``
null, a longer ``run.steps`` stretches the rest of the schedule.  Each change is recorded
in ``RUN_DIR/resume_changes.jsonl``.  Everything else is refused, because the checkpoint
and the ledger depend on it: group ids and sizes (``rollout.prompts_per_step``,
``rollout.group_size``), the prompt sequence and rewards (``data.*``), the samples
(``rollout.max_new_tokens``, ``max_new_tokens_start``, ``min_new_tokens``, ``temperature``,
``top_p``, ``top_k``, ``run.seed``), the staleness bound the audit checks (``scheduler.staleness``),
the model (``model.*``) and the directory (``run.run_dir``).
"""
RESUME_CHANGES = "resume_changes.jsonl"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_safe(key: str) -> bool:
    return key.startswith(RESUME_SAFE) and key != "run.run_dir"


def resume_changes(saved: TrainConfig, cfg: TrainConfig) -> list[tuple[str, object, object]]:
    """(field, saved value, new value) for every field ``cfg`` changes.

    A ``ConfigError`` lists every changed field ``RESUME_SAFE`` does not allow, with its
    checkpointed value and the override's."""
    old, new = _flat(saved.to_dict()), _flat(cfg.to_dict())
    changed = [(k, old.get(k), new[k]) for k in sorted(new) if new[k] != old.get(k)]
    refused = [c for c in changed if not resume_safe(c[0])]
    if refused:
        what = "; ".join(f"{k} is {a!r} in the checkpointed run (config.yaml), the override sets {b!r}"
                         for k, a, b in refused)
        raise ConfigError(f"--resume: {what}: the data stream and the ledger of trained groups depend on "
                          f"{'it' if len(refused) == 1 else 'them'}; on resume only "
                          f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUME_SAFE)} may change")
    return changed


def check_resume_overrides(saved: TrainConfig, cfg: TrainConfig) -> None:
    """``ConfigError`` listing every field ``cfg`` changes that ``RESUME_SAFE`` does not allow."""
    resume_changes(saved, cfg)


def record_resume_changes(run_dir: Path, step: int, changes: list[tuple[str, object, object]]) -> None:
    """Append each allowed change to ``RUN_DIR/resume_changes.jsonl`` and say so on stderr."""
    if not changes:
        return
    when = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (run_dir / RESUME_CHANGES).open("a") as f:
        for key, old, new in changes:
            f.write(json.dumps({"time": when, "step": step, "field": key, "old": old, "new": new}) + "\n")
    print(f"[bidirl] resume from step {step} changes "
          f"{', '.join(f'{k} {a!r} -> {b!r}' for k, a, b in changes)} (recorded in {RESUME_CHANGES})",
          file=sys.stderr)


def check_saved_config(path: Path) -> None:
    """A resumed run's ``config.yaml`` (already loaded once, so valid) must state every field
    the data stream and the ledger depend on.

    ``write_config`` writes every field; one missing means the file was cut short or
    edited, and the defaults that would fill in might not be what the run trained with."""
    raw = yaml.safe_load(path.read_text())
    present = set(_flat(raw)) if isinstance(raw, dict) else set()
    needed = [k for k in _flat(TrainConfig().to_dict()) if not resume_safe(k) and k != "run.run_dir"]
    missing = [k for k in needed if k not in present]
    if missing:
        raise ConfigError(f"--resume: {path} does not state {', '.join(missing[:4])}"
                          f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}, which the run's "
                          "data stream and ledger depend on: the file is cut short or was edited (or written before "
                          "these fields existed); restore it, or add them with the values the run used")


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """``RUN_DIR/config.yaml``, every field, written whole or not at all (temporary file, rename)."""
    tmp = run_dir / ".config.yaml.partial"
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, run_dir / "config.yaml")


def resolve_run_dir(cfg: TrainConfig, resume: str | None, run_dir: str | None) -> Path:
    """The run directory: ``--resume``'s (which must hold a ``config.yaml``), or a new empty one."""
    if resume:
        p = Path(resume)
        if not (p / "config.yaml").is_file():
            raise ConfigError(f"--resume: {p} is not a bidirl run directory (no config.yaml)")
        return p
    p = Path(run_dir or cfg.run.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--run-dir: {p} is a file, not a directory")
    if p.exists() and any(p.iterdir()):
        raise ConfigError(f"run directory {p} exists and is not empty; use --resume {p} or another --run-dir")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--run-dir: cannot create {p}: {e.strerror or e}") from None
    return p


def _remove_unstarted(run_dir: Path) -> None:
    """A new run that failed before writing anything but its ``config.yaml`` (bad data, a bad
    reward, the machine too small) leaves no directory behind, so the same command, once
    fixed, can use it again."""
    try:
        if {p.name for p in run_dir.iterdir()} <= {"config.yaml"}:
            (run_dir / "config.yaml").unlink(missing_ok=True)
            run_dir.rmdir()
    except OSError:
        pass


def main(args, wrap_backend=None) -> int:
    """``bidirl train``; ``wrap_backend`` is the tests' fault-injection seam (see TrainSession).

    Exit status: 0 (the run finished and audits clean, or ``--resume`` found it finished),
    1 (it finished but the audit failed), 128 + the signal's number when SIGINT (130) or
    SIGTERM (143) stopped it at a step boundary, 2 for a user error or a non-finite step
    under ``trainer.on_nonfinite=stop`` (raised to the CLI, which prints one line).
    """
    from bidirl.runtime.session import TrainSession

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars (warm start)
    overrides = list(args.overrides or [])
    if getattr(args, "print_config", False):
        path = str(resolve_run_dir(None, args.resume, None) / "config.yaml") if args.resume else args.config
        cfg = load_config(path, overrides)
        if args.resume:
            check_resume_overrides(load_config(path, []), cfg)
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    if args.resume:
        given = [f for f, v in (("--config", args.config), ("--run-dir", args.run_dir)) if v]
        if given:
            raise ConfigError(f"{' and '.join(given)} cannot be given with --resume: a resumed run keeps its "
                              f"directory and its config.yaml (change safe fields with key=value)")
        run_dir = resolve_run_dir(None, args.resume, None)
        saved = load_config(str(run_dir / "config.yaml"), [])
        check_saved_config(run_dir / "config.yaml")
        cfg = load_config(str(run_dir / "config.yaml"), overrides)
        changes = resume_changes(saved, cfg)
        session = TrainSession(cfg, run_dir, resume=True, wrap_backend=wrap_backend)
        session.prepare_resume()  # the checkpoint, checked against run.steps; ledger and metrics cut back
        if changes:  # the run directory's config is the one the run continues with
            record_resume_changes(run_dir, session.start_step, changes)
            write_config(run_dir, cfg)
    else:
        cfg = load_config(args.config, overrides)
        run_dir = resolve_run_dir(cfg, None, args.run_dir)
        write_config(run_dir, cfg)
        session = TrainSession(cfg, run_dir, resume=False, wrap_backend=wrap_backend)
    note_run_dir(run_dir)  # messages raised deep in the run name it (runtime/exits.py)
    if args.ray_address:
        cfg.cluster.ray_address = args.ray_address
    try:
        summary = session.run()
    except BaseException:
        if not args.resume:
            _remove_unstarted(run_dir)
        raise
    print(json.dumps({k: summary.get(k) for k in ("steps", "wall_s", "reward_first_50", "reward_last_50", "val_score",
                                                  "throughput_tokens_per_s", "groups_trained", "audit_ok")},
                     indent=1))
    print(f"[bidirl] run directory: {run_dir}", file=sys.stderr)
    stopped = summary.get("stopped")
    if stopped:
        how = "" if not stopped["abandoned"] else f" (step {stopped['at_step']} abandoned)"
        at = stopped["resume_step"]
        print(f"[bidirl] stopped at step {at} by {stopped['by']}{how}; resume with: bidirl train --resume {run_dir}",
              file=sys.stderr)
        return stopped["exit_status"]
    return 0 if summary["audit_ok"] else 1
