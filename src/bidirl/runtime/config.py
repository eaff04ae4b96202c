"""The configuration of a real training run: typed, validated, documented.

``bidirl train`` with no arguments uses the defaults below (local CPU, 2 devices, the
tiny model, the built-in ``add`` task).  ``--config FILE.yaml`` and ``key=value``
overrides (``trainer.lr=3e-4``, ``scheduler.policy=async``) change any field.  A bad
value fails at load time with a ``ConfigError`` naming the field path and what is
allowed; the resolved config is written to the run directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from bidirl.core.typed_config import as_dict, build, format_fields, option, section, set_path
from bidirl.engines.trainer_config import TrainerConfig
from bidirl.policy import policy_names

__all__ = ["ConfigError", "TrainConfig", "TrainerConfig", "load_config", "help_text"]


class ConfigError(ValueError):
    """A config file, field or override that does not describe a valid run."""


@dataclass
class ModelConfig:
    path: str | None = option(None, "a local HF model directory; null: build the tiny model")
    tiny_layers: int = option(2, "tiny model layers (used only when path is null)", ge=1)
    tiny_hidden: int = option(128, "tiny model hidden size", ge=1)
    warm_start_steps: int = option(40, "supervised steps before RL so that reward has signal", ge=0)
    dtype: Literal["float32", "bfloat16", "float16"] = option("float32", "rollout engine dtype")


@dataclass
class DataConfig:
    task: str | None = option("add", "a built-in task; ignored when files is set")
    files: list[str] = option(default_factory=list, doc="veRL-style .parquet / .jsonl files (key=a,b)")
    reward_fn: str | None = option(None, "path to a .py file defining compute_score(...)")
    reward_fn_name: str = option("compute_score", "the reward function's name in reward_fn")
    on_bad_reward: Literal["error", "zero"] = option(
        "error", "a reward that is not a finite number (NaN, inf, None, a string; or the function raised): "
        "error stops the run naming the row, response and value; zero scores it 0 and counts it "
        "(reward/bad_count)")
    seed: int = option(0, "data shuffling seed")
    max_prompt_length: int = option(
        512, "longest prompt in tokens (chat template applied, as the rollout sees it); vLLM's "
        "max_model_len is the longest kept prompt + rollout.max_new_tokens", ge=1)
    filter_overlong_prompts: bool = option(
        False, "drop (and count) rows longer than max_prompt_length; false: such a row is an error")


@dataclass
class RolloutConfig:
    prompts_per_step: int = option(8, "prompt groups per training step", ge=1)
    group_size: int = option(8, "responses per prompt (GRPO's n; GRPO normalises within a group)", ge=2)
    max_new_tokens: int = option(16, "longest response (tokens)", ge=1, le=4096)
    max_new_tokens_start: int | None = option(
        None, "a length curriculum: the response cap at step 0, growing linearly to max_new_tokens "
        "at the last step (the bottleneck moves from training to rollout); null: max_new_tokens "
        "throughout", ge=1)
    temperature: float = option(1.0, "sampling temperature", gt=0, le=5)
    max_num_seqs: int = option(128, "vLLM's concurrent sequences per replica", ge=1)
    kv_cache_mb: int = option(256, "vLLM KV-cache memory per replica (explicit: never sized from host RAM)",
                              ge=16)


@dataclass
class SchedulerConfig:
    policy: str = option("bidirl", "scheduling policy", choices=policy_names)
    staleness: int = option(1, "version gap from the oldest token (docs/algorithm.md)", ge=0, le=16)


@dataclass
class ClusterConfig:
    rollout_devices: int = option(1, "devices of the rollout pool", ge=1)
    train_devices: int = option(1, "devices of the training pool", ge=1)
    device: Literal["cpu", "cuda"] = option("cpu", "what one device is: a CPU core or a GPU (share)")
    gpus_per_device: float = option(1.0, "cuda: GPU share per device worker (0.5: two workers per GPU)",
                                    gt=0, le=1)
    ray_address: str | None = option(None, "join an existing Ray cluster instead of starting one")
    prewarm: bool = option(True, "start borrowable roles once and park them, so C_in is a hot switch")
    oversubscribe: bool = option(False, "cpu: allow more device workers than this machine has cores "
                                 "(each then runs slower than a device would)")


@dataclass
class RunConfig:
    steps: int = option(500, "optimizer steps", ge=1)
    seed: int = option(0, "seed of the trainer and the engines")
    run_dir: str | None = option(None, "where the run is written; null: runs/<timestamp>")
    checkpoint_every: int = option(50, "steps between checkpoints; 0: only the last step's and a stop's", ge=0)
    keep_checkpoints: int = option(2, "complete checkpoints kept (the newest); resume falls back to an older "
                                   "one if the newest is damaged", ge=1)
    tensorboard: bool = option(True, "write TensorBoard event files")
    plot: bool = option(True, "write a timeline plot at the end")


@dataclass
class TrainConfig:
    model: ModelConfig = section(ModelConfig, "the policy model")
    data: DataConfig = section(DataConfig, "prompts and reward")
    rollout: RolloutConfig = section(RolloutConfig, "sampling")
    trainer: TrainerConfig = section(TrainerConfig, "the GRPO trainer (the same class TorchTrainer takes)")
    scheduler: SchedulerConfig = section(SchedulerConfig, "the scheduling policy")
    cluster: ClusterConfig = section(ClusterConfig, "devices and pools")
    run: RunConfig = section(RunConfig, "length, output and checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)


def _check(c: TrainConfig) -> TrainConfig:
    """The rules that need the file system or span fields (ranges are checked on build)."""

    def need(cond: bool, path: str, allowed: str, value: Any) -> None:
        if not cond:
            raise ConfigError(f"{path}: must be {allowed}, got {value!r}")

    if c.model.path is not None:
        need(Path(c.model.path).is_dir(), "model.path", "an existing local HF model directory",
             c.model.path)
    if not c.data.files:
        need(c.data.task is not None, "data.task", "a built-in task name when data.files is empty",
             c.data.task)
    for i, f in enumerate(c.data.files):
        need(Path(f).is_file(), f"data.files[{i}]", "an existing .parquet or .jsonl file", f)
        need(f.endswith((".parquet", ".jsonl", ".json")), f"data.files[{i}]",
             "a .parquet or .jsonl file", f)
    if c.data.reward_fn is not None:
        need(Path(c.data.reward_fn).is_file(), "data.reward_fn", "an existing .py file",
             c.data.reward_fn)
    return c


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
            raise ConfigError(f"--config: file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value, e.g. trainer.lr=1e-4")
        key, raw = ov.split("=", 1)
        set_path(TrainConfig, data, key.strip(), _override_value(raw), ConfigError)
    return _check(build(TrainConfig, data, "", ConfigError))


def help_text() -> str:
    """Every field with its default and doc, for ``bidirl train --help``."""
    return "config fields (set with --config FILE.yaml or key=value):\n" + format_fields(TrainConfig, 44)
