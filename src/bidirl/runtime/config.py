"""The configuration of a real training run: typed, validated, documented.

``bidirl train`` with no arguments uses the defaults below (local CPU, 2 devices, the
tiny model, the built-in ``add`` task).  ``--config FILE.yaml`` and ``key=value``
overrides (``trainer.lr=3e-4``, ``scheduler.policy=async``) change any field.  A bad
value fails at load time with a ``ConfigError`` naming the field path and what is
allowed; the resolved config is written to the run directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bidirl.sim.result import POLICIES


class ConfigError(ValueError):
    """A config file, field or override that does not describe a valid run."""


@dataclass
class ModelConfig:
    path: str | None = None  # a local HF model directory; None: build the tiny model
    tiny_layers: int = 2  # tiny model shape (used only when path is None)
    tiny_hidden: int = 128
    warm_start_steps: int = 40  # supervised steps before RL so that reward has signal
    dtype: str = "float32"


@dataclass
class DataConfig:
    task: str | None = "add"  # a built-in task; ignored when files is set
    files: list[str] = field(default_factory=list)  # veRL-style parquet / jsonl
    reward_fn: str | None = None  # path to a .py file defining compute_score(...)
    reward_fn_name: str = "compute_score"
    seed: int = 0


@dataclass
class RolloutConfig:
    prompts_per_step: int = 8  # prompt groups per training step
    group_size: int = 8  # responses per prompt (GRPO's n)
    max_new_tokens: int = 16
    temperature: float = 1.0
    max_num_seqs: int = 128  # vLLM's concurrent sequences per replica
    kv_cache_mb: int = 256  # vLLM KV-cache memory per replica (explicit: never sized from host RAM)


@dataclass
class TrainerConfig:
    lr: float = 1e-3
    micro_batch_size: int = 16  # sequences per micro-batch (gradient accumulation)
    max_grad_norm: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    kl_coef: float = 0.0  # > 0 adds the k3 KL to the reference (initial) policy
    weight_decay: float = 0.0
    threads: int = 1  # torch threads per device worker


@dataclass
class SchedulerConfig:
    policy: str = "bidirl"
    staleness: int = 1  # version gap from the oldest token (docs/algorithm.md)


@dataclass
class ClusterConfig:
    rollout_devices: int = 1
    train_devices: int = 1
    device: str = "cpu"  # cpu | cuda
    gpus_per_device: float = 1.0  # cuda: GPU share per device worker (0.5: two workers per GPU)
    ray_address: str | None = None  # join an existing cluster instead of starting one
    prewarm: bool = True  # start borrowable roles once and park them, so C_in is a hot switch


@dataclass
class RunConfig:
    steps: int = 500
    seed: int = 0
    run_dir: str | None = None  # default: runs/<timestamp>
    checkpoint_every: int = 50  # steps; 0 disables periodic checkpoints
    tensorboard: bool = True
    plot: bool = True
    # Fault injection for tests: at this step, kill the actor of a rollout device that is
    # lent as an auxiliary trainer (-1: never).
    fault_kill_lent_device_at_step: int = -1


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _set(obj: Any, path: list[str], raw: Any, full: str) -> None:
    names = {f.name: f for f in dataclasses.fields(obj)}
    head = path[0]
    if head not in names:
        raise ConfigError(f"{full}: unknown field {head!r}; allowed: {', '.join(sorted(names))}")
    cur = getattr(obj, head)
    if dataclasses.is_dataclass(cur):
        if len(path) == 1:
            if not isinstance(raw, dict):
                raise ConfigError(f"{full}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(cur))}")
            for k, v in raw.items():
                _set(cur, [k], v, f"{full}.{k}")
            return
        _set(cur, path[1:], raw, full)
        return
    if len(path) > 1:
        raise ConfigError(f"{full}: {head} is a value, not a section")
    setattr(obj, head, _coerce(raw, names[head], full))


def _coerce(raw: Any, f: dataclasses.Field, full: str) -> Any:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    t = str(f.type)
    if raw is None or (isinstance(raw, str) and raw.lower() in ("null", "none")):
        if isinstance(default, list):
            return []
        if "None" in t:
            return None
        raise ConfigError(f"{full}: must be set (got null)")
    if isinstance(default, list) or t.startswith("list"):
        if isinstance(raw, str):
            raw = [x for x in raw.split(",") if x]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise ConfigError(f"{full}: expected a list of strings, got {raw!r}")
        return raw
    if isinstance(default, bool) or t == "bool":
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
            return raw.lower() in ("true", "1")
        if not isinstance(raw, bool):
            raise ConfigError(f"{full}: expected true or false, got {raw!r}")
        return raw
    if t == "int" or (isinstance(default, int) and "float" not in t):
        try:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{full}: expected an integer, got {raw!r}") from None
    if t == "float" or isinstance(default, float):
        try:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{full}: expected a number, got {raw!r}") from None
    if not isinstance(raw, str):
        raise ConfigError(f"{full}: expected a string, got {raw!r}")
    return raw


def validate(c: TrainConfig) -> TrainConfig:
    def need(cond: bool, path: str, allowed: str, value: Any) -> None:
        if not cond:
            raise ConfigError(f"{path}: {value!r} not allowed; {allowed}")

    need(c.scheduler.policy in POLICIES, "scheduler.policy", f"one of {', '.join(POLICIES)}",
         c.scheduler.policy)
    need(0 <= c.scheduler.staleness <= 16, "scheduler.staleness", "an integer in [0, 16]",
         c.scheduler.staleness)
    need(c.rollout.prompts_per_step >= 1, "rollout.prompts_per_step", "at least 1",
         c.rollout.prompts_per_step)
    need(c.rollout.group_size >= 2, "rollout.group_size",
         "at least 2 (GRPO normalises within a group)", c.rollout.group_size)
    need(1 <= c.rollout.max_new_tokens <= 4096, "rollout.max_new_tokens", "in [1, 4096]",
         c.rollout.max_new_tokens)
    need(0 < c.rollout.temperature <= 5, "rollout.temperature", "in (0, 5]",
         c.rollout.temperature)
    need(c.trainer.lr > 0 and c.trainer.lr < 1, "trainer.lr", "in (0, 1)", c.trainer.lr)
    need(c.trainer.micro_batch_size >= 1, "trainer.micro_batch_size", "at least 1",
         c.trainer.micro_batch_size)
    need(c.trainer.max_grad_norm > 0, "trainer.max_grad_norm", "> 0", c.trainer.max_grad_norm)
    need(0 <= c.trainer.clip_eps_low < 1, "trainer.clip_eps_low", "in [0, 1)",
         c.trainer.clip_eps_low)
    need(c.trainer.clip_eps_high >= 0, "trainer.clip_eps_high", ">= 0", c.trainer.clip_eps_high)
    need(c.trainer.kl_coef >= 0, "trainer.kl_coef", ">= 0", c.trainer.kl_coef)
    need(c.trainer.threads >= 1, "trainer.threads", "at least 1", c.trainer.threads)
    need(c.cluster.rollout_devices >= 1, "cluster.rollout_devices", "at least 1",
         c.cluster.rollout_devices)
    need(c.cluster.train_devices >= 1, "cluster.train_devices", "at least 1",
         c.cluster.train_devices)
    need(c.cluster.device in ("cpu", "cuda"), "cluster.device", "cpu or cuda", c.cluster.device)
    need(0 < c.cluster.gpus_per_device <= 1, "cluster.gpus_per_device", "in (0, 1]", c.cluster.gpus_per_device)
    need(c.rollout.kv_cache_mb >= 16, "rollout.kv_cache_mb", "at least 16", c.rollout.kv_cache_mb)
    need(c.run.steps >= 1, "run.steps", "at least 1", c.run.steps)
    need(c.run.checkpoint_every >= 0, "run.checkpoint_every", ">= 0 (0 disables)",
         c.run.checkpoint_every)
    need(c.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype",
         "float32, bfloat16 or float16", c.model.dtype)
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


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides; validated."""
    cfg = TrainConfig()
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
        for k, v in data.items():
            _set(cfg, [k], v, k)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value, e.g. trainer.lr=1e-4")
        key, raw = ov.split("=", 1)
        value = yaml.safe_load(raw) if raw else None
        _set(cfg, key.strip().split("."), value, key.strip())
    return validate(cfg)
