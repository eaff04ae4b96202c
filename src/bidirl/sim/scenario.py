"""Scenarios: a cluster, a model, a workload and a device split, loaded from YAML.

A scenario is a YAML file (built-in ones live in ``sim/scenarios/``); every field is
documented in ``docs/simulator.md`` and in its declaration.  The schema itself (the
dataclasses, their ranges and the cross-field rules) lives in the inner ring,
``bidirl.perf.scenario``, so that the planner can use it without importing the
simulator; this module re-exports it and adds the loading.  Loading never guesses: an
unknown field, a wrong type or an out-of-range value fails with a ``ScenarioError`` that
names the field path (e.g. ``workload.response_length.max``) and what is allowed.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import yaml

from bidirl.core.typed_config import yaml_error
from bidirl.perf.profile_spec import HardwareSpec, ModelSpec
from bidirl.perf.scenario import (
    LENGTH_DISTS,
    Calibration,
    Costs,
    Pools,
    ResponseLength,
    Scenario,
    ScenarioError,
    SimKnobs,
    TrainLayout,
    Turns,
    Workload,
    from_dict,
    read_lengths,
)

__all__ = ["LENGTH_DISTS", "Calibration", "Costs", "HardwareSpec", "ModelSpec", "Pools", "ResponseLength",
           "Scenario", "ScenarioError", "SimKnobs", "TrainLayout", "Turns", "Workload", "builtin_names",
           "from_dict", "load"]


def builtin_names() -> list[str]:
    root = resources.files("bidirl.sim") / "scenarios"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str | Path) -> Scenario:
    """Load a built-in scenario by name or a user's YAML file by path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ScenarioError(f"scenario file not found: {p}")
        if not p.is_file():
            raise ScenarioError(f"--scenario: {p} is a directory, not a scenario file (.yaml)")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ScenarioError(f"--scenario: cannot read {p}: {e}") from None
        default_name, base = p.stem, p.parent
    else:
        root = resources.files("bidirl.sim") / "scenarios" / f"{name_or_path}.yaml"
        if not root.is_file():
            raise ScenarioError(
                f"unknown scenario {name_or_path!r}; built-in: {', '.join(builtin_names())}"
                " (or pass a path to a .yaml file)")
        text, default_name = root.read_text(), str(name_or_path)
        base = Path(str(root)).parent if Path(str(root)).is_file() else None  # its models/ beside it
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ScenarioError(f"{name_or_path}: not valid YAML: {yaml_error(e)}") from None
    if base is not None and isinstance(data, dict) and isinstance(data.get("model"), dict):
        cfg = data["model"].get("config")
        if isinstance(cfg, str) and not Path(cfg).is_absolute():  # relative to the scenario file
            data = {**data, "model": {**data["model"], "config": str(base / cfg)}}
    s = from_dict(data, default_name)
    rl = s.workload.response_length
    if rl.dist == "file" and base is not None and not Path(rl.file).is_absolute():
        s = dataclasses.replace(s, workload=dataclasses.replace(
            s.workload, response_length=dataclasses.replace(rl, file=str(base / rl.file))))
    if rl.dist == "file":
        read_lengths(s.workload.response_length.file)  # a bad lengths file fails now, naming its line
    return s

