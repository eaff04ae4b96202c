"""Start a real run's device workers and assemble what drives them; name what a lost node took.

``start_executor`` starts one worker per device (``placement.start_workers``: each pool's
native role, the roles a device may be lent for prewarmed and parked, the trainers warmed
up), teaches the controller's estimates the start-up's measurements (switch costs, the
first weight loads) and returns the ``DeviceExecutor`` bound to the controller.  The
policy is the session's: looked up once, it decides which roles to prewarm here and
schedules the run in the controller.

When a node of a multi-node cluster goes, ``node_lost`` turns whatever exception surfaced
first into a ``NodeLost`` naming the node, what went with it (the primary trainer's devices,
rollout devices) and where to resume from.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import StageMeasured
from bidirl.controller.loop import Controller
from bidirl.engines.lora import lora_settings
from bidirl.engines.trainer_config import trainer_wire
from bidirl.runtime.backend import RayBackend
from bidirl.runtime.checkpoints import complete_checkpoints
from bidirl.runtime.config import ConfigError, TrainConfig
from bidirl.runtime.executor import DeviceExecutor, Job, Layout
from bidirl.runtime.messages import rollout_wire
from bidirl.runtime.placement import PREWARM_SYNC, WARM_UP, NodeLost, Placement, rendezvous, start_workers
from bidirl.runtime.weight_shm import check_one_node


def worker_settings(cfg: TrainConfig, model_dir: str, max_model_len: int, max_images: int = 0
                    ) -> tuple[dict, dict]:
    """(the rollout role's keyword arguments, the trainer's config on the wire): what every
    worker is given to host its roles; ``max_images``: the most images one prompt holds."""
    rollout_kwargs = rollout_wire(cfg, model_dir, max_model_len, max_images)
    trainer_config = trainer_wire(cfg.trainer, device=cfg.cluster.device, seed=cfg.run.seed, steps=cfg.run.steps,
                                  algorithm=cfg.algorithm, max_new_tokens=cfg.rollout.max_new_tokens,
                                  freeze_vision_tower=cfg.model.freeze_vision_tower,
                                  lora=(lora.wire() if (lora := lora_settings(cfg.model)) else None))
    return rollout_kwargs, trainer_config


def check_sync_placement(cfg: TrainConfig, spec: ClusterSpec, placement: Placement | None) -> None:
    """``rollout.weight_sync=shm`` on a cluster of several nodes: refused in one line, before
    any worker starts (a ``/dev/shm`` segment is seen on its own node alone)."""
    if cfg.rollout.weight_sync != "shm" or placement is None:
        return
    where = [f"{x.ip}: devices {placement.devices_on(x.index)}" for x in placement.nodes
             if x.index in placement.device_node]
    try:
        check_one_node(placement.device_node, spec.train_devices[0], where)
    except ValueError as e:
        raise ConfigError(f"rollout.{e}") from None


def start_executor(cfg: TrainConfig, policy, spec: ClusterSpec, placement: Placement, job: Job, ckpt: Path | None,
                   wrap_backend=None) -> tuple[DeviceExecutor, tuple[int, ...]]:
    """(the executor, bound to a controller running ``policy``; the primary trainer's devices).

    ``job`` carries the workers' settings (``worker_settings``); ``ckpt`` the checkpoint the
    trainer starts from (None: the model directory's weights); ``wrap_backend(backend, spec)``
    the tests' fault injection."""
    model_dir, trainer_config = job.trainer_kwargs["model_dir"], job.trainer_kwargs["config"]
    check_sync_placement(cfg, spec, placement)
    t_boot = time.perf_counter()
    workers, unit_device, train_devices, switch_measurements, new_worker = start_workers(
        cfg, spec, job.rollout_kwargs, model_dir, trainer_config, policy, ckpt, placement)
    where = "" if not placement.spans_nodes else f" on {len(set(placement.device_node))} nodes " + ", ".join(
        f"{x.ip}: devices {placement.devices_on(x.index)}"
        for x in placement.nodes if x.index in placement.device_node)
    warm_up = [s for kind, s, _ in switch_measurements if kind == WARM_UP]
    warmed = f"; trainers warmed up in {max(warm_up):.1f} s" if warm_up else ""
    print(f"[bidirl] {len(workers)} device workers up in {time.perf_counter() - t_boot:.1f} s{where} "
          f"(policy {cfg.scheduler.policy}, staleness {cfg.scheduler.staleness}{warmed})", file=sys.stderr)
    controller = Controller(spec, policy)
    unit_of = {unit_device(u): u for u in range(spec.n_units)}
    sync_warm = [s for kind, s, _ in switch_measurements if kind == PREWARM_SYNC]
    switch_measurements = [m for m in switch_measurements if m[0] not in (PREWARM_SYNC, WARM_UP)]
    controller.state.est.learn_start_up([(k, unit_of[d], s) for k, s, d in switch_measurements], sync_warm)
    backend = RayBackend(workers, new_worker)
    if wrap_backend is not None:
        backend = wrap_backend(backend, spec)
    r = cfg.rollout  # the weight group's rendezvous is on the primary trainer's node
    job.weight_sync = (r.weight_sync, r.weight_sync_delta, lambda: rendezvous(placement, train_devices[0]))
    ex = DeviceExecutor(controller, backend, job, Layout(unit_device, train_devices))
    ex.switches.extend((f"prewarm.{k}", v) for k, v, _ in switch_measurements)
    # The weight load timed on the replicas at start-up (learned above, unscored) is kept
    # in the profile: the sync model's first measurement.
    ex.profile.extend((0.0, StageMeasured("weight_sync", (1.0,), s)) for s in sync_warm)
    controller.bind(ex)
    return ex, tuple(train_devices)


def node_lost(e: Exception, placement: Placement | None, train_devices: tuple[int, ...],
              run_dir: Path) -> NodeLost | None:
    """A ``NodeLost`` saying which node went, what died with it and where to resume, if
    ``e`` came from a node of the run's cluster that is gone (None otherwise)."""
    if isinstance(e, NodeLost):
        return e
    if placement is None or not placement.spans_nodes:
        return None
    import ray

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    gone = [x for x in placement.nodes
            if x.index in placement.device_node and (x.node_id not in alive or not x.answers())]
    if not gone:
        return None
    done = complete_checkpoints(Path(run_dir) / "checkpoints")
    where = f"checkpoint {done[-1].name}" if done else "step 0 (no checkpoint yet)"
    nodes = ", ".join(f"{x.ip} (devices {placement.devices_on(x.index)})" for x in gone)
    return NodeLost(f"node {nodes} is gone, {lost_with(placement, gone, train_devices)} "
                    f"({' '.join(str(e).split())}); resume from {where} with: bidirl train --resume {run_dir} "
                    "(on the nodes left; without --ray-address: this machine)")


def lost_with(placement: Placement, gone, train_devices: tuple[int, ...]) -> str:
    """What went with the ``gone`` nodes, by role: the exception that surfaced first may
    be any call's (e.g. a replica's whose input lived there), not the trainer's own."""
    lost = sorted(d for x in gone for d in placement.devices_on(x.index))
    trainer = [d for d in lost if d in train_devices]
    rollout = [d for d in lost if d not in train_devices]
    parts = ([f"the primary trainer's devices {trainer}"] if trainer else []) + (
        [f"rollout devices {rollout}"] if rollout else [])
    return "and with it " + " and ".join(parts)
