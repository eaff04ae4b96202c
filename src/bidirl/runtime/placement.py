"""Where roles go: device ids, units, the controller's ``ClusterSpec``, and the workers.

Devices ``0 .. R-1`` form the rollout pool (one replica per device: tensor-parallel vLLM
across Ray actors is not supported yet), ``R .. R+T-1`` the training pool (one
data-parallel rank per device, gloo on CPU / NCCL on CUDA).  Every train device is also a
lendable unit that can host a borrowed rollout replica.  Workers are placed with a
placement group so each gets its own core (or GPU).
"""

from __future__ import annotations

import os
import socket

from bidirl.controller.cluster import ClusterSpec, device_layout
from bidirl.core.ledger import Role, switch_kind
from bidirl.runtime.config import ConfigError, TrainConfig


def build_spec(cfg: TrainConfig, steps: int, prompt_tokens: float) -> ClusterSpec:
    """The controller's view of the run; ``prompt_tokens`` is the data's measured mean prompt
    (``train.fit_prompts``), rounded for the stage models."""
    prompt_tokens = max(1, round(prompt_tokens))
    r, t = cfg.cluster.rollout_devices, cfg.cluster.train_devices
    on_gpu = cfg.cluster.device == "cuda"
    mean_len = cfg.rollout.max_new_tokens // 2
    return ClusterSpec(
        hardware="H100-80GB" if on_gpu else "cpu-core",
        model="tiny-qwen2",
        devices=r + t,
        **device_layout(r, t, 1, r + t),  # one device a replica, a rank and a unit; one node
        train_dp=t, train_tp=1,
        replica_cap=cfg.rollout.max_num_seqs,
        groups_per_step=cfg.rollout.prompts_per_step,
        group_size=cfg.rollout.group_size,
        prompt_tokens=prompt_tokens,
        staleness=cfg.scheduler.staleness,
        steps=steps,
        micro_batch_tokens=cfg.trainer.micro_batch_size * (prompt_tokens + mean_len),
        max_response_tokens=cfg.rollout.max_new_tokens,
        prior_scale=1.0,
    )


def check_machine_fits(cfg: TrainConfig, cores: int | None = None) -> None:
    """On a local CPU cluster each device worker needs a core of its own: refuse more
    devices than cores before anything starts (``cluster.oversubscribe=true`` allows it).
    Ray would otherwise be told the machine has that many cores and start them all."""
    c = cfg.cluster
    if c.device != "cpu" or c.ray_address or c.oversubscribe:
        return
    cores = cores or os.cpu_count() or 1
    devices = c.rollout_devices + c.train_devices
    if devices > cores:
        raise ConfigError(f"cluster: {devices} devices (rollout_devices {c.rollout_devices} + train_devices "
                          f"{c.train_devices}) on a machine with {cores} CPU cores; each device worker needs a "
                          f"core. Use at most {cores} devices or set cluster.oversubscribe=true")


def free_port() -> int:
    """A free TCP port on loopback (the DP group's rendezvous; tests use it too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prewarm(cfg: TrainConfig, spec: ClusterSpec, workers: dict, rollout_kwargs: dict, model_dir: str,
            trainer_config: dict) -> list[tuple[str, float]]:
    """Bring every role a device may be lent for up once and park it (the warm start).

    Without this the first lend of a device pays a cold engine start (10-20 s for vLLM
    here) instead of a hot switch (tens of milliseconds).
    """
    import ray

    from bidirl.policy.base import policy_class

    calls = []
    policy = policy_class(cfg.scheduler.policy)
    for d, w in workers.items():
        if d in spec.train_devices and policy.lends_train_devices:
            calls.append((w, "rollout", w.host.remote("rollout", **rollout_kwargs)))
        elif d not in spec.train_devices and policy.lends_rollout_devices:
            calls.append((w, "aux_train", w.host.remote("aux_train", model_dir=model_dir, config=trainer_config)))
    ray.get([c for _, _, c in calls])
    ray.get([w.release.remote(role, park=True) for w, role, _ in calls])
    # One hot round trip per direction: the switch-cost estimator starts from measurements
    # of this machine instead of priors.
    measured = []
    primary = workers[spec.train_devices[0]]
    for w, role, _ in calls:
        kind = switch_kind(Role.ROLLOUT if role == "rollout" else Role.AUX_TRAIN)
        kw = rollout_kwargs if role == "rollout" else {"model_dir": model_dir, "config": trainer_config}
        weights = primary.call.remote("train", "weights")  # a real lend loads the newest weights
        measured.append((f"{kind}.c_in", ray.get(w.host.remote(role, **kw, weights=[weights], version=0))))
        measured.append((f"{kind}.c_out", ray.get(w.release.remote(role, park=True))[0]))
    return measured


def start_workers(cfg: TrainConfig, spec: ClusterSpec, rollout_kwargs: dict, model_dir: str,
                  trainer_config: dict, trainer_ckpt=None):
    """Start one worker per device, host each pool's native role; returns handles."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from bidirl.runtime.worker import worker_class

    n = spec.devices
    gpu = cfg.cluster.device == "cuda"
    share = cfg.cluster.gpus_per_device
    bundle = {"CPU": 1, "GPU": share} if gpu else {"CPU": 1}
    pg = placement_group([bundle] * n, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=120)
    except Exception as e:
        raise ConfigError(f"cluster: cannot place {n} device workers ({bundle} each): {e}") from None
    cls = worker_class(num_cpus=1, num_gpus=share if gpu else 0, log_level=cfg.run.worker_log_level)

    def new_worker(d: int):
        """A worker for device ``d`` in its own placement bundle (also used to restart one)."""
        pool = "rollout" if d < len(spec.replica_devices) else "train"
        return cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=d)).remote(
            d, pool, cfg.trainer.threads, cfg.run.seed)

    workers = {d: new_worker(d) for d in range(n)}
    train_devices = list(spec.train_devices)
    port = free_port()
    calls = []
    for d, w in workers.items():
        if d in train_devices:
            rank = train_devices.index(d)
            calls.append(w.host.remote("train", model_dir=model_dir, config=trainer_config,
                                       dp_rank=rank, dp_world=len(train_devices), dp_port=port,
                                       checkpoint=str(trainer_ckpt) if trainer_ckpt else None))
        else:
            calls.append(w.host.remote("rollout", **rollout_kwargs))
    ray.get(calls)
    switch_measurements = []
    if cfg.cluster.prewarm:
        switch_measurements = prewarm(cfg, spec, workers, rollout_kwargs, model_dir, trainer_config)
    if trainer_ckpt is not None:  # rollout replicas start from the checkpoint's weights
        weights = workers[train_devices[0]].call.remote("train", "weights")
        version = ray.get(workers[train_devices[0]].call.remote("train", "get_version"))
        ray.get([workers[d].call.remote("rollout", "update_weights", weights, version)
                 for d in range(len(spec.replica_devices))])

    def unit_device(u: int) -> int:
        return spec.unit_devices(u)[0]

    return workers, unit_device, train_devices, switch_measurements, new_worker
