"""The configuration of a real training run: typed, validated, documented.

``bidirl train`` with no arguments uses the defaults below (local CPU, 2 devices, the
tiny model, the built-in ``reverse`` task).  ``--config FILE.yaml`` and ``key=value``
overrides (``trainer.lr=3e-4``, ``scheduler.policy=async``) change any field.  A bad
value fails at load time with a ``ConfigError`` naming the field path and what is
allowed; the resolved config is written to the run directory.

A field declared ``resume_safe=True`` (or in a section so declared) may be changed by
``bidirl train --resume DIR key=value``; :func:`resume_safe` says why the others may not.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.core.typed_config import (
    as_dict,
    build,
    flagged,
    flagged_names,
    format_fields,
    option,
    section,
    set_path,
    yaml_error,
)
from bidirl.engines.lora import ALL_LINEAR
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.policy import policy_max_staleness, policy_names
from bidirl.runtime.verl_names import VERL_ALIASES, VERL_FIXED, VERL_ROOTS, canonical, leaves
from bidirl.runtime.weight_sync import check_transport

__all__ = ["AlgorithmConfig", "ConfigError", "TrainConfig", "TrainerConfig", "load_config", "help_text",
           "resume_safe", "resume_safe_names"]


class ConfigError(ValueError):
    """A config file, field or override that does not describe a valid run."""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""LoRA's default layers: a Llama/Qwen decoder's attention and MLP projections."""


@dataclass
class ModelConfig:
    path: str | None = option(None, "a local HF model directory; null: build the tiny model")
    kind: Literal["text", "vl"] = option(
        "text", "the tiny model bidirl builds when path is null: text (a Llama-shaped causal LM) or vl (a "
        "SmolVLM-shaped Idefics3 vision-language model, for prompts with images: data.task=shapes)")
    freeze_vision_tower: bool = option(
        False, "a vision-language model's vision tower is not trained (no gradient, not in the optimizer); "
        "false: trained with the rest")
    tiny_layers: int = option(2, "tiny model layers (used only when path is null)", ge=1)
    tiny_hidden: int = option(128, "tiny model hidden size: 4 attention heads of tiny_hidden / 4 each (cpu: a "
                              "head size vLLM's CPU attention supports, so one of 128, 256, 320, 384, ...)", ge=1)
    warm_start_steps: int | None = option(None, "supervised steps before RL so that reward has signal; null: "
                                          "the built-in task's own (40; reverse_mixed: 300), 40 with data.files",
                                          ge=0)
    dtype: Literal["float32", "bfloat16", "float16"] = option("float32", "rollout engine dtype")
    lora_rank: int = option(0, "LoRA: train rank-r adapters on the frozen model (only they train, checkpoint and "
                            "sync: docs/algorithm.md); 0: off, the whole model trains", ge=0, le=1024)
    lora_alpha: float = option(32.0, "LoRA: the adapters' output is scaled by lora_alpha / lora_rank", gt=0)
    lora_target_modules: list[str] = option(
        default_factory=lambda: list(LORA_TARGETS), doc="LoRA: the layers that get adapters, by the last part of "
        "their names (key=a,b); all-linear: every linear layer but the output head")


@dataclass
class DataConfig:
    task: str | None = option("reverse", "a built-in task (reverse, copy, add, reverse_long, reverse_mixed; "
                              "shapes, with images; kv_lookup, guess_number: multi-turn, with a tool); "
                              "ignored when files is set")
    files: list[str] = option(default_factory=list, doc="veRL-style .parquet / .jsonl files (key=a,b)")
    reward_fn: str | None = option(None, "path to a .py file defining compute_score(...)")
    reward_fn_name: str = option("compute_score", "the reward function's name in reward_fn")
    on_bad_reward: Literal["error", "zero"] = option(
        "error", "a reward that is not a finite number (NaN, inf, None, a string; or the function raised): "
        "error stops the run naming the row, response and value; zero scores it 0 and counts it "
        "(reward/bad_count)", resume_safe=True)
    reward_timeout_s: float = option(30.0, "seconds one reward call may take; a call over it is abandoned and is "
                                     "a bad reward (data.on_bad_reward)", gt=0, resume_safe=True)
    seed: int = option(0, "data shuffling seed", ge=0)
    max_prompt_length: int = option(
        512, "longest prompt in tokens (chat template applied, as the rollout sees it); vLLM's "
        "max_model_len is the longest kept prompt + rollout.max_new_tokens", ge=1)
    filter_overlong_prompts: bool = option(
        False, "drop (and count) rows longer than max_prompt_length; false: such a row is an error")
    image_key: str = option("images", "the column of a row's images (veRL's data.image_key): a list of "
                            "{'bytes': ...}, {'path': ...} or paths, one per <image> in the prompt")
    max_image_pixels: int = option(
        12_845_056, "largest image in pixels (width x height; Qwen-VL processors' max_pixels); a larger "
        "one is an error naming its row, or its row is dropped with filter_oversized_images", ge=1)
    filter_oversized_images: bool = option(
        False, "drop (and count) rows with an image over max_image_pixels; false: such a row is an error")
    val_files: list[str] = option(default_factory=list, doc="validation .parquet / .jsonl files, the layout of "
                                  "data.files (key=a,b); empty with a built-in task: its split='test' rows",
                                  resume_safe=True)
    val_max_samples: int = option(-1, "validation prompts: the first N rows of val_files; -1: all of them "
                                  "(a built-in task: 64)", ge=-1, resume_safe=True)


@dataclass
class RolloutConfig:
    prompts_per_step: int = option(8, "prompt groups per training step", ge=1)
    group_size: int = option(8, "responses per prompt (GRPO's n; GRPO normalises within a group)", ge=2)
    max_new_tokens: int = option(16, "longest response (tokens); multi-turn: a model turn's", ge=1, le=4096)
    max_new_tokens_start: int | None = option(
        None, "a length curriculum: the response cap at step 0, growing linearly to max_new_tokens "
        "at the last step (the bottleneck moves from training to rollout); null: max_new_tokens "
        "throughout", ge=1)
    min_new_tokens: int = option(
        0, "EOS is masked until a response has this many tokens (vLLM's min_tokens, HF's "
        "min_new_tokens); = max_new_tokens: every response runs to the cap (equal work, for "
        "benchmarks); 0: off; validation is never forced", ge=0, le=4096)
    temperature: float = option(1.0, "sampling temperature", gt=0, le=2)
    top_p: float = option(1.0, "nucleus sampling: keep the smallest set of tokens whose probability "
                          "reaches top_p; 1: off", gt=0, le=1)
    top_k: int = option(-1, "sample from the k most likely tokens; -1 or 0: off", ge=-1)
    val_temperature: float = option(0.0, "validation sampling temperature; 0: greedy", ge=0, le=2, resume_safe=True)
    max_num_seqs: int = option(128, "vLLM's concurrent sequences per replica", ge=1, resume_safe=True)
    kv_cache_mb: int = option(256, "vLLM KV-cache memory per replica (explicit: never sized from host RAM)",
                              ge=16, resume_safe=True)
    tensor_parallel_size: int = option(1, "devices one vLLM replica spans (tensor parallel); the rollout pool, and "
                                       "each training unit lent to rollout, come in blocks of it (CPU)", ge=1, le=8)
    weight_sync: str = option(
        "object_store", "how new weights reach the replicas: object_store (a numpy dict through Ray's store), "
        "collective (a bucketed broadcast over a group of the trainer and the replicas: gloo on CPU, NCCL on "
        "CUDA), cuda_ipc (trainer and replica on one CUDA device), shm (a /dev/shm segment the trainer writes "
        "and the replicas map: one node, CPU)", resume_safe=True)
    weight_sync_delta: bool = option(
        False, "collective, shm: send only the tensors whose bytes changed since the group's last sync "
        "(shm: since the segment's last write) (LoRA, a frozen vision tower)", resume_safe=True)


@dataclass
class SchedulerConfig:
    policy: str = option("bidirl", "scheduling policy", choices=policy_names, resume_safe=True)
    staleness: int = option(1, "version gap from the oldest token (docs/algorithm.md)", ge=0, le=16)
    reproducible: bool = option(
        False, "batch b is generated at exactly version max(0, b - staleness), weights move at batch "
        "boundaries, interrupted responses restart from their seed: the final weights are bitwise the "
        "same whatever the policy borrows, the replica count or the timing (policy/reproducible.py)")


@dataclass
class ClusterConfig:
    rollout_devices: int = option(1, "devices of the rollout pool", ge=1)
    train_devices: int = option(1, "devices of the training pool", ge=1)
    device: Literal["cpu", "cuda"] = option("cpu", "what one device is: a CPU core or a GPU (share)")
    gpus_per_device: float = option(1.0, "cuda: GPU share per device worker (0.5: two workers per GPU)",
                                    gt=0, le=1)
    ray_address: str | None = option(None, "join an existing Ray cluster instead of starting one")
    prewarm: bool = option(True, "start borrowable roles once and park them, so C_in is a hot switch")
    warm_up_trainers: bool = option(True, "at start-up, one thrown-away forward and backward pass of the "
                                    "largest micro-batch on every trainer (auxiliaries included), so the "
                                    "run's first is not the process's first (1.1-3.9x slower a token on a CPU)")
    oversubscribe: bool = option(False, "cpu: allow more device workers than this machine has cores "
                                 "(each then runs slower than a device would)")
    device_memory_gib: float | None = option(
        None, "one device's memory budget for the primary trainer's fp32 state (weights, gradients, AdamW; "
        "planner/memory.py:trainer_state_bytes), checked at start-up; null: no check", gt=0)


@dataclass
class EnvConfig:
    path: str | None = option(None, "a .py file defining a multi-turn environment class (docs/environments.md); "
                              "null: single-turn rollouts")
    name: str = option("Environment", "the environment class's name in path: reset(self, row) -> messages, "
                       "step(self, text) -> (messages, reward, done), plain or async def")
    max_turns: int = option(4, "model turns per trajectory; one not done by then ends as max_turns", ge=1)
    max_total_tokens: int = option(1024, "tokens of a whole trajectory (prompt, model and environment turns); "
                                   "one past it ends as max_length", ge=1)
    turn_timeout_s: float = option(30.0, "seconds one environment call (reset or step) may take; one over it is "
                                   "abandoned and ends its trajectory as env_timeout", gt=0)
    tool_latency_s: float = option(0.0, "the built-in tool tasks' wait per tool call or feedback turn (kv_lookup, "
                                   "guess_number: a real tool's latency, modelled)", ge=0)


@dataclass
class RunConfig:
    steps: int = option(500, "optimizer steps", ge=1, resume_safe=True)
    seed: int = option(0, "seed of the trainer and the engines", ge=0, le=2**32 - 1)
    run_dir: str | None = option(None, "where the run is written; null: runs/<timestamp>")
    checkpoint_every: int = option(50, "steps between checkpoints; 0: only the last step's and a stop's", ge=0,
                                   resume_safe=True)
    keep_checkpoints: int = option(2, "complete checkpoints kept (the newest); resume falls back to an older "
                                   "one if the newest is damaged", ge=1, resume_safe=True)
    tensorboard: bool = option(True, "write TensorBoard event files", resume_safe=True)
    plot: bool = option(True, "write a timeline plot at the end", resume_safe=True)
    val_every: int = option(50, "steps between validations (and one at the end); 0: no validation", ge=0,
                            resume_safe=True)
    val_before_train: bool = option(False, "also validate the initial weights (a resumed run: the checkpoint's)",
                                    resume_safe=True)
    val_samples: int = option(4, "validation responses written to samples.jsonl per validation", ge=0, resume_safe=True)
    train_samples_every: int = option(50, "steps between training responses written to samples.jsonl; 0: none",
                                      ge=0, resume_safe=True)
    train_samples: int = option(2, "training responses written each time (one per group)", ge=0, resume_safe=True)
    wandb: bool = option(False, "also log to Weights & Biases (needs the wandb package; WANDB_MODE=offline "
                         "works without network)", resume_safe=True)
    wandb_project: str = option("bidirl", "Weights & Biases project", resume_safe=True)
    wandb_name: str | None = option(None, "Weights & Biases run name; null: the run directory's name", resume_safe=True)
    worker_log_level: Literal["debug", "info", "warning", "error"] = option(
        "warning", "log level of vLLM and Ray in the device workers (known harmless vLLM warnings are "
        "dropped at any level above info)", resume_safe=True)


@dataclass
class TrainConfig:
    model: ModelConfig = section(ModelConfig, "the policy model")
    data: DataConfig = section(DataConfig, "prompts and reward")
    rollout: RolloutConfig = section(RolloutConfig, "sampling")
    trainer: TrainerConfig = section(TrainerConfig, "the GRPO trainer (the same class TorchTrainer takes)",
                                     resume_safe=True)
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantages, loss, aggregation, corrections "
                                         "(docs/algorithm.md)")
    scheduler: SchedulerConfig = section(SchedulerConfig, "the scheduling policy")
    cluster: ClusterConfig = section(ClusterConfig, "devices and pools", resume_safe=True)
    env: EnvConfig = section(EnvConfig, "multi-turn environments and tools (docs/environments.md)")
    run: RunConfig = section(RunConfig, "length, output and checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)


def resume_safe(key: str) -> bool:
    """Whether ``--resume DIR key=value`` may change field ``key`` (dotted): it is declared
    ``resume_safe=True``, or its section is.

    Those fields change how the rest of the run is carried out, not the data stream or the
    ledger of trained groups: the length (``run.steps``, at least the checkpoint's step),
    checkpoint spacing and count, logging, the scheduling policy, the cluster (devices, Ray
    address, prewarm), vLLM's capacity (``rollout.max_num_seqs``, ``rollout.kv_cache_mb``),
    the trainer (``trainer.lr``, its schedule and every other optimizer and loss setting: the
    schedule follows the version, and the loaded optimizer state keeps its moments and takes
    the new hyperparameters, ``TorchTrainer.load_checkpoint``; threads, micro-batch size, what
    a non-finite step does), what a bad reward scores, and what is only reported (validation:
    ``run.val_*``, ``data.val_*``, ``rollout.val_temperature``; samples, Weights & Biases,
    worker log level).  With a decaying ``trainer.lr_schedule`` and ``trainer.lr_decay_steps``
    null, a longer ``run.steps`` stretches the rest of the schedule.  Each change is recorded
    in ``RUN_DIR/resume_changes.jsonl``.  Everything else is refused, because the checkpoint
    and the ledger depend on it: group ids and sizes (``rollout.prompts_per_step``,
    ``rollout.group_size``), the prompt sequence and rewards (``data.*``), the samples
    (``rollout.max_new_tokens``, ``max_new_tokens_start``, ``min_new_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``run.seed``), the staleness bound the audit checks
    (``scheduler.staleness``), the model (``model.*``), the directory (``run.run_dir``), and
    the algorithm (``algorithm.*``: the estimator, loss, aggregation, corrections and reward
    shaping define what the run optimises, so a resume keeps the ones it began with).
    """
    return flagged(TrainConfig, key, "resume_safe")


def resume_safe_names() -> list[str]:
    """The fields a resume may change, as an error message lists them (``trainer.*``: all of it)."""
    return [k + "*" if k.endswith(".") else k for k in flagged_names(TrainConfig, "resume_safe")]


def _check(c: TrainConfig) -> TrainConfig:
    """The rules that need the file system or span fields (ranges are checked on build)."""

    def need(cond: bool, path: str, allowed: str, value: Any) -> None:
        if not cond:
            raise ConfigError(f"{path}: must be {allowed}, got {value!r}")

    if c.model.path is not None:
        need(Path(c.model.path).is_dir(), "model.path", "an existing local HF model directory",
             c.model.path)
    need(all(0 <= b < 1 for b in c.trainer.betas), "trainer.betas", "two numbers in [0, 1)",
         list(c.trainer.betas))
    targets = c.model.lora_target_modules
    need(bool(targets) and (ALL_LINEAR not in targets or len(targets) == 1) and all(t.strip() for t in targets),
         "model.lora_target_modules", f"one or more layer names, or {ALL_LINEAR} alone", targets)
    if not c.data.files:
        need(c.data.task is not None, "data.task", "a built-in task name when data.files is empty",
             c.data.task)
    for key in ("files", "val_files"):
        for i, f in enumerate(getattr(c.data, key)):
            need(Path(f).is_file(), f"data.{key}[{i}]", "an existing .parquet or .jsonl file", f)
            need(f.endswith((".parquet", ".jsonl", ".json")), f"data.{key}[{i}]",
                 "a .parquet or .jsonl file", f)
    # Reproducible mode generates batch b at max(0, b - staleness): the bound the policy itself keeps.
    most = policy_max_staleness(c.scheduler.policy)
    need(not (c.scheduler.reproducible and most is not None and c.scheduler.staleness > most),
         "scheduler.staleness", f"at most {most} with scheduler.policy={c.scheduler.policy} and "
         "scheduler.reproducible=true (the version gap that policy keeps)", c.scheduler.staleness)
    need(c.rollout.min_new_tokens <= c.rollout.max_new_tokens, "rollout.min_new_tokens",
         f"at most rollout.max_new_tokens ({c.rollout.max_new_tokens})", c.rollout.min_new_tokens)
    try:
        check_transport(c.rollout.weight_sync, c.cluster.device)
    except ValueError as e:
        raise ConfigError(f"rollout.{e}") from None
    tp = c.rollout.tensor_parallel_size
    need(c.cluster.rollout_devices % tp == 0, "cluster.rollout_devices",
         f"a multiple of rollout.tensor_parallel_size ({tp}: a replica spans that many devices)",
         c.cluster.rollout_devices)
    need(tp == 1 or c.cluster.device == "cpu", "rollout.tensor_parallel_size",
         "1 with cluster.device=cuda (a device worker holds one GPU, and a tensor-parallel replica's "
         "processes need all of its unit's GPUs: not supported yet)", tp)
    need(c.data.val_max_samples != 0, "data.val_max_samples", "-1 (all) or at least 1", 0)
    need(not (c.algorithm.filter_groups.enable and c.scheduler.reproducible), "algorithm.filter_groups.enable",
         "false with scheduler.reproducible=true (which step a replacement group joins depends on when groups "
         "complete, so the weights would depend on the timing)", True)
    ob = c.algorithm.overlong_buffer
    if ob.enable:
        need(ob.len is not None and ob.len < c.rollout.max_new_tokens, "algorithm.overlong_buffer.len",
             f"set, and below rollout.max_new_tokens ({c.rollout.max_new_tokens}), with overlong_buffer.enable", ob.len)
    if c.run.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("run.wandb: true needs the wandb package, which is not installed "
                          "(pip install wandb), or set run.wandb=false")
    if c.data.reward_fn is not None:
        need(Path(c.data.reward_fn).is_file(), "data.reward_fn", "an existing .py file",
             c.data.reward_fn)
        need(c.data.reward_fn.endswith(".py"), "data.reward_fn", "a python file (.py)", c.data.reward_fn)
    if c.env.path is not None:
        need(Path(c.env.path).is_file(), "env.path", "an existing .py file", c.env.path)
        need(c.env.path.endswith(".py"), "env.path", "a python file (.py)", c.env.path)
    return c


def _place(data: dict, key: str, value: Any) -> str:
    """Put ``key=value`` (a bidirl field or a veRL alias) into ``data``; the field's name."""
    name, value = canonical(key, value)
    if key in VERL_FIXED:  # nothing to set: what bidirl does anyway
        if value not in VERL_FIXED[key] or isinstance(value, bool) != isinstance(VERL_FIXED[key][0], bool):
            raise ConfigError(f"{key}: {value!r} not allowed; allowed: {', '.join(map(str, VERL_FIXED[key]))} "
                              "(what bidirl does; see VERL_FIXED in runtime/verl_names.py)")
        return key
    if name.split(".", 1)[0] in VERL_ROOTS:
        raise ConfigError(f"{key}: a veRL field bidirl does not take (the ones it takes, under their veRL "
                          "names, are listed by bidirl train --help)")
    set_path(TrainConfig, data, name, value, ConfigError)
    return name


def _resolve_aliases(data: dict) -> dict:
    """The mapping with every veRL alias renamed to its bidirl field; both given is an error."""
    out: dict[str, Any] = {}
    given: dict[str, tuple[str, Any]] = {}
    for key, value in leaves(data):
        name = _place(out, key, value)
        if name in given and given[name][0] != key and given[name][1] != canonical(key, value)[1]:
            raise ConfigError(f"{key}: the same field as {given[name][0]} ({name}), with another value; "
                              "give one of them")
        given[name] = (key, canonical(key, value)[1])
    return out


def _override_value(raw: str) -> Any:
    """``key=value``: the value is YAML (``1e-4``, ``true``, ``[a, b]``); empty or none is null."""
    value = yaml.safe_load(raw) if raw else None
    if isinstance(value, str) and value.lower() in ("null", "none"):
        return None
    return value


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides; validated."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config: {'a directory, not a file' if p.is_dir() else 'file not found'}: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {yaml_error(e)}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--config: cannot read {p}: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
    data = _resolve_aliases(data)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value, e.g. trainer.lr=1e-4")
        key, raw = ov.split("=", 1)
        if not key.strip():
            raise ConfigError(f"override {ov!r}: no field name before '='; expected key=value, e.g. trainer.lr=1e-4")
        try:
            value = _override_value(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"{key.strip()}: the value {raw!r} is not valid YAML: {yaml_error(e)}") from None
        _place(data, key.strip(), value)
    return _check(build(TrainConfig, data, "", ConfigError))


def help_text() -> str:
    """Every field with its default and doc, for ``bidirl train --help``."""
    width = max(len(a) for a, _ in VERL_ALIASES)
    aliases = "\n".join(f"  {a:<{width}} -> {b}" for a, b in VERL_ALIASES)
    fixed = "\n".join(f"  {k} = {' or '.join(map(str, v))}" for k, v in VERL_FIXED.items())
    return ("config fields (set with --config FILE.yaml or key=value):\n" + format_fields(TrainConfig, 44)
            + "\n\nveRL names accepted for the same fields (file or key=value):\n" + aliases
            + "\n\nveRL fields accepted with the value that is what bidirl does:\n" + fixed)
