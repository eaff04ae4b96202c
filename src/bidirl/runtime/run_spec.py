"""The controller's view of a real run (``ClusterSpec``), described from the run itself.

The stage models' priors come from the spec's hardware and model profiles, so they describe
what runs: the model is ``model.path``'s ``config.json`` (its shapes, read as a scenario's
``model: {config: ...}`` is, ``perf/profile_spec.py``), weights counted at ``model.dtype``
(the rollout engine's); bidirl's tiny model (``model.path`` null) is the catalogue's
``tiny-qwen2``.  The hardware is what one device of ``cluster.device`` is: a CPU core
(``cpu-core``) or a GPU (``H100-80GB``, the catalogue's GPU the priors were set on).
"""

from __future__ import annotations

import dataclasses

from bidirl.controller.cluster import ClusterSpec, device_layout
from bidirl.perf.profile_spec import ModelSpec, model_profile
from bidirl.perf.profiles import DTYPE_BYTES, ModelProfile
from bidirl.planner.memory import trainer_budget_problem
from bidirl.runtime.config import ConfigError, TrainConfig

TINY_MODEL = "tiny-qwen2"  # the catalogue's profile of bidirl's tiny model (perf/profiles.py)
HARDWARE = {"cpu": "cpu-core", "cuda": "H100-80GB"}  # cluster.device -> the catalogue's profile


def run_model(cfg: TrainConfig) -> ModelProfile | None:
    """``model.path``'s model as a profile (its config's shapes, ``model.dtype``'s bytes per
    weight); None for bidirl's tiny model, which the catalogue describes (``TINY_MODEL``)."""
    if cfg.model.path is None:
        return None
    profile = model_profile(ModelSpec(config=cfg.model.path), ConfigError, "model.path")
    return dataclasses.replace(profile, bytes_per_param=DTYPE_BYTES[cfg.model.dtype])


def build_spec(cfg: TrainConfig, steps: int, prompt_tokens: float, per_node: int | None = None) -> ClusterSpec:
    """The controller's view of the run; ``prompt_tokens`` is the data's measured mean prompt
    (``prepare.fit_prompts``), rounded for the stage models; ``per_node`` the devices of a
    node (``Placement.per_node``; default: every device on one node)."""
    prompt_tokens = max(1, round(prompt_tokens))
    r, t = cfg.cluster.rollout_devices, cfg.cluster.train_devices
    mean_len = cfg.rollout.max_new_tokens // 2
    model = run_model(cfg)
    return ClusterSpec(
        hardware=HARDWARE[cfg.cluster.device],
        model=TINY_MODEL if model is None else model.name,
        model_profile=model,
        devices=r + t,
        # a replica and a lendable unit: rollout.tensor_parallel_size devices; a rank: one
        **device_layout(r, t, cfg.rollout.tensor_parallel_size, per_node or r + t),
        train_dp=t, train_tp=1,
        replica_cap=cfg.rollout.max_num_seqs,
        groups_per_step=cfg.rollout.prompts_per_step,
        group_size=cfg.rollout.group_size,
        prompt_tokens=prompt_tokens,
        staleness=cfg.scheduler.staleness,
        steps=steps,
        micro_batch_tokens=cfg.trainer.micro_batch_size * (prompt_tokens + mean_len),
        micro_batch_samples=cfg.trainer.micro_batch_size,
        max_response_tokens=cfg.rollout.max_new_tokens,
        prior_scale=1.0,
        reproducible=cfg.scheduler.reproducible,
        filter_groups=cfg.algorithm.filter_groups.enable,
        max_gen_batches=(cfg.algorithm.filter_groups.max_num_gen_batches
                         if cfg.algorithm.filter_groups.enable else 0),
    )


def check_trainer_memory(cfg: TrainConfig, model_dir: str) -> None:
    """Refuse (``ConfigError``, one line) a run whose primary trainer's state does not fit
    ``cluster.device_memory_gib`` on each of its ranks (``trainer.strategy``,
    ``cluster.train_devices``); the model is ``model_dir``'s ``config.json``."""
    if cfg.cluster.device_memory_gib is None:
        return
    params = model_profile(ModelSpec(config=model_dir), ConfigError, "model.path").params
    problem = trainer_budget_problem(params, cfg.trainer.strategy, cfg.cluster.train_devices,
                                     cfg.cluster.device_memory_gib)
    if problem:
        raise ConfigError(problem)
