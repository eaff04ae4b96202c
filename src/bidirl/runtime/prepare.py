"""What a run needs before any worker starts: the model, the data, the measured prompts.

``bidirl train`` calls these in order, and each fails in seconds on a bad input rather than
after the whole start-up: ``check_model_shape`` (a model vLLM cannot run on the device),
``prepare_data`` (the prompt rows and the reward function, tried once; a multi-turn
``env.path``'s class loaded and checked), ``prepare_val_rows``,
``prepare_model`` (the user's model directory, or bidirl's tiny model plus a warm start),
then ``fit_prompts`` (every prompt measured with the run's tokenizer, or processor when
rows hold images: vLLM's ``max_model_len``, over-long prompts dropped or refused).
``response_cap`` is the length curriculum.  How the prompts are encoded and handed to the
store and the validator is ``runtime/prompt_stream.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bidirl.algo import tasks as task_lib
from bidirl.algo import tasks_visual  # noqa: F401  (registers the visual task "shapes" with task_lib)
from bidirl.algo.data import DataError, load_reward_fn, validate_row
from bidirl.algo.environment import load_environment
from bidirl.algo.multimodal import image_prompt_lengths, load_prompt_rows, validate_image_row
from bidirl.algo.tasks_tools import TOOL_TASKS
from bidirl.engines.hf_io import is_vision_language
from bidirl.models.tiny import build_tiny_model, encode_prompt
from bidirl.models.tiny_vl import build_tiny_vl_model
from bidirl.models.warm_start import warm_start
from bidirl.models.warm_start_vl import WARM_START_TRUTH_FRACTION, warm_start_vl
from bidirl.runtime.config import ConfigError, TrainConfig
from bidirl.runtime.model_check import check_model_dir, cpu_head_sizes
from bidirl.runtime.reward_call import BadRewardError, RewardFn, call_reward, describe_bad_reward
from bidirl.runtime.trajectories import is_multi_turn, tool_task
from bidirl.runtime.validation import BUILTIN_VAL_ROWS

MODELS_CACHE = Path(os.environ.get("BIDIRL_CACHE", Path.home() / ".cache" / "bidirl")) / "models"
WARM_START_SEED = 0
"""The built-in warm starts' seed, not ``run.seed``: every RL seed starts from one checkpoint (seeded
by run.seed, kv_lookup's 425-step warm start read 0.414 on seed 0 and 0.008 on seed 1)."""


def prepare_model(cfg: TrainConfig) -> str:
    """A local HF model directory: the user's, or bidirl's tiny model (``model.kind``: text,
    or the SmolVLM-shaped vision-language one) plus a warm start."""
    if cfg.model.path:
        return str(Path(cfg.model.path).resolve())
    if cfg.model.kind == "vl":
        return _prepare_tiny_vl(cfg)
    base = MODELS_CACHE / f"tiny-L{cfg.model.tiny_layers}-H{cfg.model.tiny_hidden}"
    build_tiny_model(base, layers=cfg.model.tiny_layers, hidden=cfg.model.tiny_hidden)
    tasks = (cfg.data.task,) if cfg.data.task and not cfg.data.files else ("copy",)
    steps = _warm_start_steps(cfg, tasks[0])
    if steps <= 0:
        return str(base)
    out = MODELS_CACHE / f"{base.name}-sft-{'-'.join(tasks)}-{steps}"
    print(f"[bidirl] warm start: {steps} SFT steps on {tasks} -> {out}", file=sys.stderr)
    warm_start(base, out, tasks=tasks, steps=steps, seed=WARM_START_SEED)
    return str(out)


def _warm_start_steps(cfg: TrainConfig, task: str) -> int:
    """``model.warm_start_steps``, or when null the task's own (a binary-reward task needs more)."""
    steps = cfg.model.warm_start_steps
    own = TOOL_TASKS[task] if task in TOOL_TASKS else task_lib.get_task(task)
    return own.warm_start_steps if steps is None else steps


def _prepare_tiny_vl(cfg: TrainConfig) -> str:
    """The tiny Idefics3 model (``models/tiny_vl.py``, the text tiny model's shape), warm
    started on the visual task when the run trains on one (``models/warm_start_vl.py``)."""
    base = MODELS_CACHE / f"tiny-vl-L{cfg.model.tiny_layers}-H{cfg.model.tiny_hidden}"
    build_tiny_vl_model(base, layers=cfg.model.tiny_layers, hidden=cfg.model.tiny_hidden)
    task = cfg.data.task if not cfg.data.files else None
    if task is None or task_lib.get_task(task).name != "shapes":
        return str(base)
    steps = _warm_start_steps(cfg, task)
    if steps <= 0:
        return str(base)
    truth = WARM_START_TRUTH_FRACTION
    out = MODELS_CACHE / f"{base.name}-sft-{task}-{steps}-truth{truth:g}"
    print(f"[bidirl] warm start: {steps} SFT steps on {task} (images, {truth:.0%} true answers) -> {out}",
          file=sys.stderr)
    warm_start_vl(base, out, task=task, steps=steps, seed=WARM_START_SEED)
    return str(out)


def prepare_data(cfg: TrainConfig):
    """(rows, reward_fn): validated prompt rows and the veRL-style reward function.

    The reward comes as a ``RewardFn`` carrying ``data.on_bad_reward`` (which
    ``GroupStore.score`` applies) and has been tried once on the first row.
    """
    if cfg.env.path is not None:  # the user's environment, checked before anything slow (one line per problem)
        load_environment(cfg.env.path, cfg.env.name)
        if cfg.model.kind == "vl":
            raise ConfigError("env.path: multi-turn rollouts take text prompts; model.kind=vl (images) is not "
                              "supported with an environment yet")
    if is_multi_turn(cfg) and cfg.data.reward_fn:  # an episode's return is its reward: it would be ignored
        raise ConfigError("data.reward_fn: a multi-turn run is scored by its environment's step rewards; "
                          "score the final answer in the environment's step (docs/environments.md)")
    tool = tool_task(cfg)
    if cfg.data.files:
        rows = load_files(cfg, cfg.data.files, "data")
    elif tool is not None:  # a built-in multi-turn task: its environment scores (runtime/trajectories.py)
        if cfg.rollout.max_new_tokens < tool.turn_tokens:
            raise ConfigError(f"rollout.max_new_tokens: {cfg.rollout.max_new_tokens} is a model turn's cap, and "
                              f"data.task={tool.name}'s turns need {tool.turn_tokens}; set "
                              f"rollout.max_new_tokens={tool.turn_tokens} or more")
        rows = [validate_row(r, f"<task {tool.name}>", i) for i, r in enumerate(tool.rows(4096, seed=cfg.data.seed))]
    else:
        try:
            task = task_lib.get_task(cfg.data.task)
        except (KeyError, ValueError):
            raise ConfigError(f"data.task: {cfg.data.task!r} not allowed; one of "
                              f"{', '.join([*task_lib.task_names(), *TOOL_TASKS])}") from None
        rows = [_task_row(cfg, r, f"<task {task.name}>", i) for i, r in enumerate(task.rows(4096, seed=cfg.data.seed))]
    if cfg.data.reward_fn:
        fn = load_reward_fn(cfg.data.reward_fn, cfg.data.reward_fn_name)
        name = f"{Path(cfg.data.reward_fn).name}:{cfg.data.reward_fn_name}"
    else:
        fn, name = task_lib.compute_score, "the built-in compute_score"
    reward_fn = RewardFn(fn, cfg.data.on_bad_reward, name, cfg.data.reward_timeout_s)
    check_images_fit_model(cfg, rows, "data")
    if not is_multi_turn(cfg) and rows:
        check_reward_fn(reward_fn, rows[0])
    return rows, reward_fn


def load_files(cfg: TrainConfig, files, what: str) -> list:
    """Every row of ``files``, images checked (``algo/multimodal.load_prompt_rows``): a row with
    an image over ``data.max_image_pixels`` is an error, or dropped and counted with
    ``data.filter_oversized_images``."""
    rows, dropped = [], 0
    for f in files:
        loaded = load_prompt_rows(f, cfg.data.image_key, cfg.data.max_image_pixels, cfg.data.filter_oversized_images)
        rows += loaded.rows
        dropped += loaded.oversized
    if dropped:
        print(f"[bidirl] {what}: {dropped} rows with an image over data.max_image_pixels="
              f"{cfg.data.max_image_pixels:,} dropped", file=sys.stderr)
    return rows


def _task_row(cfg: TrainConfig, raw: dict, source: str, i: int):
    if cfg.data.image_key in raw:  # a visual task (algo/tasks_visual.py): its images checked as a file's
        return validate_image_row(raw, source, i, cfg.data.image_key, cfg.data.max_image_pixels)
    return validate_row(raw, source, i)


def check_images_fit_model(cfg: TrainConfig, rows, what: str) -> None:
    """``ConfigError`` for image rows and a text model, before anything starts: the tiny text
    model (``model.kind=text``) or a ``model.path`` without a vision tower cannot see them."""
    first = next((r for r in rows if getattr(r, "images", ())), None)
    if first is None:
        return
    n = sum(1 for r in rows if getattr(r, "images", ()))
    where = f"{what}: {n} of {len(rows)} rows hold images (the first: {first.path} {first.label})"
    if cfg.model.path is None and cfg.model.kind != "vl":
        raise ConfigError(f"{where}, and model.kind=text builds a text-only model; set model.kind=vl (the tiny "
                          "SmolVLM-shaped model) or model.path=<a vision-language model directory>")
    if cfg.model.path is not None and not is_vision_language(cfg.model.path):
        raise ConfigError(f"{where}, but model.path={cfg.model.path} is a text-only model (no vision_config in "
                          "its config.json); use a vision-language model, or data without images")


def prepare_val_rows(cfg: TrainConfig) -> list:
    """The validation prompts: ``data.val_files`` (their first ``data.val_max_samples`` rows), or
    a built-in task's ``split="test"`` rows; none when validation is off or there are none."""
    if not cfg.run.val_every and not cfg.run.val_before_train:
        return []
    n = cfg.data.val_max_samples
    if cfg.data.val_files:
        rows = load_files(cfg, cfg.data.val_files, "validation data")
        check_images_fit_model(cfg, rows, "validation data")
        return rows if n < 0 else rows[:n]
    if cfg.data.files:
        return []  # user data with no validation files: nothing to validate on
    n = BUILTIN_VAL_ROWS if n < 0 else n
    tool = tool_task(cfg)
    if tool is not None:  # episodes of the task's environment (runtime/validation_episodes.py)
        return [validate_row(r, f"<task {tool.name}, split test>", i)
                for i, r in enumerate(tool.rows(n, seed=cfg.data.seed, split="test"))]
    task = task_lib.get_task(cfg.data.task)  # prepare_data has checked the name
    return [_task_row(cfg, r, f"<task {task.name}, split test>", i)
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
    max_images: int = 0
    """The most images one kept prompt holds (vLLM's ``limit_mm_per_prompt``); 0: text only."""


_CHUNK = 4096


def prompt_token_lengths(tok, rows) -> list[int]:
    """Tokens of every row's prompt, chat template applied, as ``encode_prompt`` encodes it.

    Rendered and tokenized in batches (1.3-2x faster than one row at a time on 2 cores, and
    the tokenizer spreads a batch over every core); the first rows of each batch are checked
    against :func:`encode_prompt` and, should a tokenizer disagree, the batch is encoded one
    row at a time instead.  Rows with images need the model's processor as ``tok``: their
    placeholders count as the tokens they expand to (``algo/multimodal.image_prompt_lengths``).
    """
    if any(getattr(r, "images", ()) for r in rows):
        return image_prompt_lengths(tok, rows)
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


TINY_HEADS = 4
"""Attention heads of bidirl's tiny model (``build_tiny_model``'s default)."""


def check_model_shape(cfg: TrainConfig) -> None:
    """``ConfigError`` for a model the run cannot use on ``cluster.device``, before anything starts.

    A ``model.path`` directory is checked whole by ``model_check.check_model_dir`` (architecture,
    head shapes, dtype, vocabulary); the tiny model bidirl builds is checked here, by its
    ``model.tiny_hidden``: without it a head size vLLM's CPU attention lacks (16, say) dies with a
    raw traceback from inside a worker after the whole start-up.  Reads no weights, imports no
    torch or vLLM.
    """
    if cfg.model.path is not None:
        check_model_dir(cfg.model.path, device=cfg.cluster.device)
        return
    hidden = cfg.model.tiny_hidden
    if hidden % TINY_HEADS:
        raise ConfigError(f"model.tiny_hidden: must be a multiple of {TINY_HEADS} (the tiny model's "
                          f"attention heads), got {hidden}")
    head_dim, sizes = hidden // TINY_HEADS, cpu_head_sizes() if cfg.cluster.device == "cpu" else None
    if sizes and head_dim not in sizes:
        raise ConfigError(f"model.tiny_hidden: attention head size {head_dim} (tiny_hidden {hidden} / {TINY_HEADS} "
                          f"heads) is not one vLLM's CPU attention runs ({', '.join(map(str, sizes))}); use a "
                          f"tiny_hidden {TINY_HEADS} times one of them, or cluster.device=cuda")


def _within_limit(cfg: TrainConfig, rows: list, tok, source: str, what: str,
                  need_one: bool) -> tuple[list, list[int], int]:
    """(kept rows, their lengths, how many were over ``data.max_prompt_length``).

    An over-long row is a ``DataError`` naming it unless ``data.filter_overlong_prompts``;
    with ``need_one``, so is having none left.
    """
    limit = cfg.data.max_prompt_length
    lengths = prompt_token_lengths(tok, rows)
    over = [i for i, n in enumerate(lengths) if n > limit]
    if over and not cfg.data.filter_overlong_prompts:
        first = rows[over[0]]
        raise DataError(f"{first.path or source}: {first.label}: {what} is {lengths[over[0]]} tokens "
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
                        val_filtered=val_over,
                        max_images=max((len(getattr(r, "images", ())) for r in kept + val_kept), default=0))
    context = model_context(model_dir)
    if is_multi_turn(cfg):  # a trajectory's turns follow its prompt: room for env.max_total_tokens more
        want = fit.max_model_len + cfg.env.max_total_tokens
        fit = dataclasses.replace(fit, max_model_len=want if context is None else max(fit.max_model_len,
                                                                                      min(want, context)))
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
    value, raw = call_reward(reward_fn, row.data_source, "", row.ground_truth, row.extra_info)
    if value is not None:
        return
    what = (f"data.reward_fn: {reward_fn.name} {describe_bad_reward(raw)} when tried on data {row.label} "
            f"(data_source {row.data_source!r}) with an empty response")
    if reward_fn.on_bad_reward == "error":
        raise BadRewardError(f"{what}, before any worker started; fix the reward function or set "
                             "data.on_bad_reward=zero to score such responses 0")
    print(f"[bidirl] warning: {what}; such rewards will be scored 0 (data.on_bad_reward=zero)", file=sys.stderr)
