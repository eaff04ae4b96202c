"""Scenarios: a cluster, a model, a workload and a device split, as validated data.

A scenario is a YAML file (built-in ones live in ``sim/scenarios/``); every field is
documented in ``docs/simulator.md``.  Loading never guesses: an unknown field, a wrong
type or an out-of-range value fails with a ``ScenarioError`` that names the field path
(e.g. ``workload.response_length.max``) and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from bidirl.perf.profiles import HARDWARE, MODELS

LENGTH_DISTS = ("lognormal", "constant", "uniform", "file")


class ScenarioError(ValueError):
    """A scenario file or dict that does not describe a valid run."""


@dataclass(frozen=True)
class ResponseLength:
    """Response lengths in tokens, drawn per response (long-tailed by default).

    ``lognormal``: median ``median``, shape ``sigma``, clipped to ``[min, max]`` (responses
    that hit ``max`` are truncated, as with ``max_tokens`` in an engine).
    ``constant``: every response is ``max`` long.  ``uniform``: in ``[min, max]``.
    ``file``: lengths read from ``file`` (one integer per line, cycled in order).
    """

    dist: str = "lognormal"
    median: int = 1500
    sigma: float = 0.9
    min: int = 16
    max: int = 8192
    file: str | None = None


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int = 64  # prompt groups per training step (GRPO batch)
    group_size: int = 8  # responses per prompt
    prompt_tokens: int = 256
    response_length: ResponseLength = field(default_factory=ResponseLength)


@dataclass(frozen=True)
class TrainLayout:
    """Trainer layout: ``dp`` data-parallel ranks of ``tp`` devices each (tp=1: FSDP/DDP)."""

    dp: int = 8
    tp: int = 1


@dataclass(frozen=True)
class Pools:
    """The committed split.  ``rollout_devices + train_devices`` must equal ``devices``."""

    rollout_devices: int = 8
    train_devices: int = 8
    rollout_tp: int = 1
    train: TrainLayout = field(default_factory=TrainLayout)


@dataclass(frozen=True)
class Costs:
    """Overrides of the priors (seconds); ``null`` keeps the profile-derived prior."""

    weight_sync_s: float | None = None
    roll_on_train_c_in_s: float | None = None
    roll_on_train_c_out_s: float | None = None
    train_on_roll_c_in_s: float | None = None
    train_on_roll_c_out_s: float | None = None
    train_on_roll_c_grad_s: float | None = None
    colocated_switch_s: float | None = None  # sync policy: offload/onload between stages


@dataclass(frozen=True)
class SimKnobs:
    """How the simulated world differs from the scheduler's prior beliefs."""

    timing_noise_cv: float = 0.03  # lognormal noise on every simulated stage time
    prior_scale: float = 1.25  # scheduler's models start this far off; calibration fixes it
    micro_batch_tokens: int = 16384  # tokens per training micro-batch


@dataclass(frozen=True)
class Scenario:
    name: str
    hardware: str = "H100-80GB"
    devices: int = 16
    model: str = "Qwen3-8B"
    staleness: int = 1
    steps: int = 20
    seed: int = 0
    description: str = ""
    workload: Workload = field(default_factory=Workload)
    pools: Pools = field(default_factory=Pools)
    costs: Costs = field(default_factory=Costs)
    sim: SimKnobs = field(default_factory=SimKnobs)

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_NESTED = {
    "workload": Workload, "pools": Pools, "costs": Costs, "sim": SimKnobs,
    "response_length": ResponseLength, "train": TrainLayout,
}


def _build(cls, data: Any, path: str):
    if not isinstance(data, dict):
        raise ScenarioError(f"{path or 'scenario'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ScenarioError(
            f"{path + '.' if path else ''}{unknown[0]}: unknown field; allowed: "
            f"{', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        fpath = f"{path}.{name}" if path else name
        if name in _NESTED:
            kwargs[name] = _build(_NESTED[name], value, fpath)
            continue
        default = fields[name].default
        kwargs[name] = _coerce(value, default, fpath)
    return cls(**kwargs)


def _coerce(value: Any, default: Any, path: str) -> Any:
    if value is None:
        if default is None or isinstance(default, str):
            return value
        raise ScenarioError(f"{path}: must be set (got null)")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScenarioError(f"{path}: expected true/false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{path}: expected an integer, got {value!r}")
        return value
    if isinstance(default, float) or (default is None and path.split(".")[0] == "costs"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if isinstance(default, str) or default is None:
        if not isinstance(value, str):
            raise ScenarioError(f"{path}: expected a string, got {value!r}")
        return value
    return value


def _check(s: Scenario) -> None:
    def need(cond: bool, path: str, allowed: str, value: Any) -> None:
        if not cond:
            raise ScenarioError(f"{path}: {value!r} not allowed; {allowed}")

    need(s.hardware in HARDWARE, "hardware", f"one of {', '.join(sorted(HARDWARE))}", s.hardware)
    need(s.model in MODELS, "model", f"one of {', '.join(sorted(MODELS))}", s.model)
    need(s.devices >= 2, "devices", "at least 2", s.devices)
    need(0 <= s.staleness <= 16, "staleness", "an integer in [0, 16]", s.staleness)
    need(s.steps >= 1, "steps", "at least 1", s.steps)
    w, rl, p = s.workload, s.workload.response_length, s.pools
    need(w.prompts_per_step >= 1, "workload.prompts_per_step", "at least 1", w.prompts_per_step)
    need(w.group_size >= 1, "workload.group_size", "at least 1", w.group_size)
    need(w.prompt_tokens >= 1, "workload.prompt_tokens", "at least 1", w.prompt_tokens)
    need(rl.dist in LENGTH_DISTS, "workload.response_length.dist",
         f"one of {', '.join(LENGTH_DISTS)}", rl.dist)
    need(1 <= rl.min <= rl.max, "workload.response_length.min", "1 <= min <= max", rl.min)
    need(rl.max <= 262144, "workload.response_length.max", "at most 262144", rl.max)
    need(rl.sigma >= 0, "workload.response_length.sigma", ">= 0", rl.sigma)
    need(rl.median >= 1, "workload.response_length.median", "at least 1", rl.median)
    if rl.dist == "file":
        need(bool(rl.file), "workload.response_length.file", "a path when dist is file", rl.file)
    need(p.rollout_devices >= 1, "pools.rollout_devices", "at least 1", p.rollout_devices)
    need(p.train_devices >= 1, "pools.train_devices", "at least 1", p.train_devices)
    need(p.rollout_devices + p.train_devices == s.devices, "pools.train_devices",
         f"rollout_devices + train_devices must equal devices ({s.devices})",
         p.train_devices)
    need(p.rollout_tp >= 1 and p.rollout_devices % p.rollout_tp == 0, "pools.rollout_tp",
         f"a divisor of pools.rollout_devices ({p.rollout_devices})", p.rollout_tp)
    need(p.train.tp >= 1 and p.train.dp >= 1, "pools.train", "dp >= 1 and tp >= 1", p.train)
    need(p.train.dp * p.train.tp == p.train_devices, "pools.train.dp",
         f"dp * tp must equal pools.train_devices ({p.train_devices})", p.train.dp)
    k = s.sim
    need(0 <= k.timing_noise_cv <= 1, "sim.timing_noise_cv", "a number in [0, 1]",
         k.timing_noise_cv)
    need(0.1 <= k.prior_scale <= 10, "sim.prior_scale", "a number in [0.1, 10]", k.prior_scale)
    need(k.micro_batch_tokens >= 256, "sim.micro_batch_tokens", "at least 256",
         k.micro_batch_tokens)
    for f in dataclasses.fields(s.costs):
        v = getattr(s.costs, f.name)
        need(v is None or v >= 0, f"costs.{f.name}", "null or a number >= 0", v)


def from_dict(data: dict[str, Any], default_name: str = "custom") -> Scenario:
    data = dict(data)
    data.setdefault("name", default_name)
    s = _build(Scenario, data, "")
    _check(s)
    return s


def builtin_names() -> list[str]:
    root = resources.files("bidirl.sim") / "scenarios"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str | Path) -> Scenario:
    """Load a built-in scenario by name or a user's YAML file by path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ScenarioError(f"scenario file not found: {p}")
        text, default_name, base = p.read_text(), p.stem, p.parent
    else:
        root = resources.files("bidirl.sim") / "scenarios" / f"{name_or_path}.yaml"
        if not root.is_file():
            raise ScenarioError(
                f"unknown scenario {name_or_path!r}; built-in: {', '.join(builtin_names())}"
                " (or pass a path to a .yaml file)")
        text, default_name, base = root.read_text(), str(name_or_path), None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ScenarioError(f"{name_or_path}: not valid YAML: {e}") from None
    s = from_dict(data, default_name)
    rl = s.workload.response_length
    if rl.dist == "file" and base is not None and not Path(rl.file).is_absolute():
        s = dataclasses.replace(s, workload=dataclasses.replace(
            s.workload, response_length=dataclasses.replace(rl, file=str(base / rl.file))))
    return s
