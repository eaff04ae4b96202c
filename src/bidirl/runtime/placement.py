"""Where roles go: device ids, nodes, units, the controller's ``ClusterSpec``, and the workers.

Devices ``0 .. R-1`` form the rollout pool, ``R .. R+T-1`` the training pool (one
data-parallel rank per device, gloo on CPU / NCCL on CUDA).  A rollout replica spans
``rollout.tensor_parallel_size`` (k) consecutive devices, a *unit*; so does each lendable
unit of the training pool (its first k x floor(T / k) devices), which can host one borrowed
replica.  A unit's roles live on its first device's worker: a k-way replica is one vLLM
engine there, whose shards run in vLLM's own worker processes (``RolloutRole``); the unit's
other workers hold their share of the cores (or their trainer ranks) meanwhile.  A rollout
unit lent to training hosts one auxiliary trainer, a full copy on its first device (the
simulator's is one rank over the unit's k devices: faster by up to k).  CPU only: on CUDA
a worker holds one GPU, and a k-way engine needs the unit's k.

Nodes: as the planner's envelope lays devices out (``planner/envelope.py``), consecutive
devices share a node: device ``d`` lives on node ``d // P``, ``P`` the devices of one node
(``ClusterSpec.devices_per_node``, what ``planner/compat.py`` checks node alignment
against).  The nodes of a Ray cluster are the alive ones offering devices, the head first,
then by address; what a node offers is its ``bidirl_devices`` resource (``ray start
--resources '{"bidirl_devices": 8}'``) where any node has one, else its CPUs (``cpu``) or
its GPUs / ``gpus_per_device`` (``cuda``).  ``P`` is the first node's offer; every node a
run needs must offer its share.  On one node the workers go in a placement group (each
its own core or GPU share); across nodes each worker is pinned to its node (hard node
affinity, so a worker of a lost node is never silently moved).  The primary trainer's
data-parallel rendezvous listens on its first rank's node address, never on every
interface.

The controller's ``ClusterSpec`` of the run is ``run_spec.build_spec``'s.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass

from bidirl.controller.cluster import ClusterSpec
from bidirl.core.ledger import Role, switch_kind
from bidirl.runtime.config import ConfigError, TrainConfig
from bidirl.runtime.exits import resume_command, resume_point
from bidirl.runtime.worker import worker_class

DEVICE_RESOURCE = "bidirl_devices"  # what a node offers bidirl (a custom Ray resource)


@dataclass(frozen=True)
class Node:
    """A Ray node that offers ``devices`` devices; ``index`` is its place in the layout."""

    index: int
    node_id: str
    ip: str
    devices: int
    port: int = 0  # its raylet's (node manager's) port

    def answers(self, timeout_s: float = 2.0) -> bool:
        """Its raylet accepts a connection: the node is there (Ray may take seconds more
        than this to declare a dead one dead)."""
        if not self.port:
            return True
        try:
            with socket.create_connection((self.ip, self.port), timeout=timeout_s):
                return True
        except OSError:
            return False


@dataclass(frozen=True)
class Placement:
    """Which node each device lives on (``device_node[d]``), and the layout's ``P``."""

    nodes: tuple[Node, ...]
    device_node: tuple[int, ...]
    per_node: int
    resource: str | None  # DEVICE_RESOURCE when the nodes offer it (each worker takes one)

    @property
    def spans_nodes(self) -> bool:
        return len(set(self.device_node)) > 1

    def node_ip(self, device: int) -> str:
        return self.nodes[self.device_node[device]].ip

    def devices_on(self, node: int) -> list[int]:
        return [d for d, k in enumerate(self.device_node) if k == node]


class NodeLost(RuntimeError):
    """A node of the run's cluster is gone, with the devices placed on it."""


def assign_nodes(offers: list[int], devices: int) -> tuple[list[int], int]:
    """Per device its node (consecutive devices share one) and ``P``, from what each node
    offers, in layout order; a ``ConfigError`` naming what is missing if they do not fit."""
    if not offers or offers[0] < 1:
        raise ConfigError(f"cluster: no node offers a device ({DEVICE_RESOURCE}, CPU or GPU resources); "
                          f"{devices} are needed")
    per = min(offers[0], devices)
    need = math.ceil(devices / per)
    if len(offers) < need:
        raise ConfigError(f"cluster: {devices} devices (rollout_devices + train_devices) at {per} a node need "
                          f"{need} nodes; the cluster has {len(offers)} offering devices ({offers})")
    for k in range(need):
        share = min(per, devices - k * per)
        if offers[k] < share:
            raise ConfigError(f"cluster: node {k} offers {offers[k]} devices, the layout puts {share} on it "
                              f"(devices_per_node {per}, the first node's offer); give every node the same "
                              f"{DEVICE_RESOURCE}")
    return [d // per for d in range(devices)], per


def check_units_fit_nodes(tp: int, per_node: int, nodes: int) -> None:
    """A unit's ``tp`` devices on one node: its replica's shards run where its first device is.
    Units start at multiples of ``tp`` (``controller/cluster.device_layout``), nodes at
    multiples of ``per_node``, so every unit fits iff ``tp`` divides ``per_node``."""
    if nodes > 1 and per_node % tp:
        raise ConfigError(f"rollout.tensor_parallel_size: {tp} devices a replica do not fit on one node at "
                          f"{per_node} devices a node (a replica's shards run on its first device's node); "
                          f"use a divisor of {per_node}")


def ray_nodes(ray, cfg: TrainConfig) -> tuple[list[Node], str | None]:
    """The alive nodes offering devices, in layout order, and the resource they offer by."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    resource = DEVICE_RESOURCE if any(n["Resources"].get(DEVICE_RESOURCE) for n in alive) else None

    def offer(res: dict) -> int:
        if resource:
            return int(res.get(resource, 0))
        if cfg.cluster.device == "cuda":
            return int(res.get("GPU", 0) / cfg.cluster.gpus_per_device + 1e-9)
        return int(res.get("CPU", 0))

    alive.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]))
    nodes = [(n["NodeID"], n["NodeManagerAddress"], offer(n["Resources"]), int(n.get("NodeManagerPort") or 0))
             for n in alive]
    return [Node(i, nid, ip, c, port) for i, (nid, ip, c, port) in enumerate(x for x in nodes if x[2] > 0)], resource


def place(cfg: TrainConfig) -> Placement:
    """The run's devices on the nodes of the Ray cluster this process is connected to."""
    import ray

    nodes, resource = ray_nodes(ray, cfg)
    n = cfg.cluster.rollout_devices + cfg.cluster.train_devices
    device_node, per = assign_nodes([x.devices for x in nodes], n)
    check_units_fit_nodes(cfg.rollout.tensor_parallel_size, per, len(nodes))
    return Placement(tuple(nodes), tuple(device_node), per, resource)


def check_machine_fits(cfg: TrainConfig, cores: int | None = None, ray_address: str | None = None) -> None:
    """On a local CPU cluster each device worker needs a core of its own: refuse more
    devices than cores before anything starts (``cluster.oversubscribe=true`` allows it).
    Ray would otherwise be told the machine has that many cores and start them all.  A run
    that joins a cluster (``cluster.ray_address``, or ``ray_address``: ``--ray-address``)
    is not counted against this machine."""
    c = cfg.cluster
    if c.device != "cpu" or c.ray_address or ray_address or c.oversubscribe:
        return
    cores = cores or os.cpu_count() or 1
    devices = c.rollout_devices + c.train_devices
    if devices > cores:
        raise ConfigError(f"cluster: {devices} devices (rollout_devices {c.rollout_devices} + train_devices "
                          f"{c.train_devices}) on a machine with {cores} CPU cores; each device worker needs a "
                          f"core. Use at most {cores} devices or set cluster.oversubscribe=true")


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (default loopback: the DP group's rendezvous on one node;
    tests use it too)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def rendezvous(placement: Placement | None, device: int) -> tuple[str, int]:
    """(address, port) of the DP group's rendezvous, on ``device``'s node: loopback on a
    one-node cluster; on a cluster of several nodes (the driver's may not be the ranks')
    that node's own address and a port free there (asked on that node)."""
    if placement is None or len(placement.nodes) == 1:
        return "127.0.0.1", free_port()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = placement.nodes[placement.device_node[device]]
    probe = ray.remote(num_cpus=0)(free_port).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
    return node.ip, ray.get(probe.remote(node.ip), timeout=120)


def prewarm_hosts(spec: ClusterSpec, workers: dict, rollout_kwargs: dict, model_dir: str,
                  trainer_config: dict, policy) -> list:
    """Ask every device to bring up each role ``policy`` may lend it for: ``[(worker, role, ref)]``.

    Sent right behind the native roles' ``host`` calls, without waiting for them: a worker
    runs its calls in order, so a train device starts loading vLLM as soon as its trainer is
    up, while the rollout devices still load theirs (the cores would otherwise take turns:
    ~7 s of a 2-core start-up).  :func:`prewarm` waits for them and parks the roles.
    """
    calls = []
    for u in range(spec.n_units):  # a unit's roles live on its first device (a replica spans the unit)
        d = spec.unit_devices(u)[0]
        w = workers[d]
        if d in spec.train_devices and policy.lends_train_devices:
            calls.append((w, "rollout", w.host.remote("rollout", **rollout_kwargs)))
        elif d not in spec.train_devices and policy.lends_rollout_devices:
            calls.append((w, "aux_train", w.host.remote("aux_train", model_dir=model_dir, config=trainer_config)))
    return calls


def prewarm(cfg: TrainConfig, spec: ClusterSpec, workers: dict, rollout_kwargs: dict, model_dir: str,
            trainer_config: dict, calls: list) -> list[tuple[str, float, int]]:
    """Bring every role a device may be lent for up once and park it (the warm start).

    Without this the first lend of a device pays a cold engine start (10-20 s for vLLM
    here) instead of a hot switch (tens of milliseconds).  ``calls``: the hosts
    :func:`prewarm_hosts` sent.
    """
    import ray

    ray.get([c for _, _, c in calls])
    if cfg.cluster.warm_up_trainers:  # parked with its memory: the first lend's micro-batch is not cold
        ray.get([w.call.remote("aux_train", "warm_up", *warm_up_shape(cfg, spec))
                 for w, role, _ in calls if role == "aux_train"])
    ray.get([w.release.remote(role, park=True) for w, role, _ in calls])
    # One hot round trip per direction: the switch-cost estimator starts from measurements
    # of this machine instead of priors: (kind, seconds, device), the device's node pair.
    measured = []
    primary = workers[spec.train_devices[0]]
    device_of = {id(w): d for d, w in workers.items()}
    for w, role, _ in calls:
        d = device_of[id(w)]
        kind = switch_kind(Role.ROLLOUT if role == "rollout" else Role.AUX_TRAIN)
        kw = rollout_kwargs if role == "rollout" else {"model_dir": model_dir, "config": trainer_config}
        weights = primary.call.remote("train", "weights")  # a real lend loads the newest weights
        measured.append((f"{kind}.c_in", ray.get(w.host.remote(role, **kw, weights=[weights], version=0)), d))
        measured.append((f"{kind}.c_out", ray.get(w.release.remote(role, park=True))[0], d))
    return measured


PREWARM_SYNC = "weight_sync"  # the kind of prewarm's weight-load measurement (not a switch)
WARM_UP = "trainer_warm_up"  # the kind of a trainer's start-up pass (TorchTrainer.warm_up; not a switch)


def warm_up_shape(cfg: TrainConfig, spec: ClusterSpec) -> tuple[int, int, int]:
    """The micro-batch a trainer warms up on: ``trainer.micro_batch_size`` sequences of the
    mean prompt and the longest response (the largest micro-batch a run commonly meets)."""
    return cfg.trainer.micro_batch_size, max(1, round(spec.prompt_tokens)), cfg.rollout.max_new_tokens


def prewarm_weight_sync(spec: ClusterSpec, workers: dict) -> list[tuple[str, float, int]]:
    """Load the primary's weights on every home replica twice; the second round's slowest
    load, timed on the devices (``RolloutRole.update_weights``), is the weight-sync model's
    first measurement.

    The replicas already hold these weights (version 0), and nothing is live yet.  The first
    load in a process is the slow one (its buffers are new: 66 ms against 28-38 ms later on
    this machine); without this, a run's first weight sync was predicted by a 0.2 s roofline
    prior and the second by that cold first load, two of its ~11 syncs' errors."""
    import ray

    weights = workers[spec.train_devices[0]].call.remote("train", "weights")
    replicas = [workers[devs[0]] for devs in spec.replica_devices]
    if not replicas:
        return []
    seconds = 0.0
    for _ in range(2):
        seconds = max(ray.get([w.call.remote("rollout", "update_weights", weights, 0) for w in replicas]))
    return [(PREWARM_SYNC, seconds, spec.replica_devices[0][0])] if seconds > 0 else []


def _worker_factory(cfg: TrainConfig, spec: ClusterSpec, placement: Placement | None):
    """``new_worker(d)``: a worker for device ``d`` where the layout puts it (also used to
    restart one): its bundle of a placement group on one node, pinned to its node across
    several."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    n = spec.devices
    gpu = cfg.cluster.device == "cuda"
    share = cfg.cluster.gpus_per_device
    bundle = {"CPU": 1, "GPU": share} if gpu else {"CPU": 1}
    resource = placement.resource if placement is not None else None
    if resource:
        bundle[resource] = 1
    cls = worker_class(num_cpus=1, num_gpus=share if gpu else 0, log_level=cfg.run.worker_log_level)
    extra = {"resources": {resource: 1}} if resource else {}
    if placement is not None and placement.spans_nodes:
        def strategy(d: int):
            return NodeAffinitySchedulingStrategy(placement.nodes[placement.device_node[d]].node_id, soft=False)
    else:
        pg = placement_group([bundle] * n, strategy="PACK")
        try:
            ray.get(pg.ready(), timeout=120)
        except Exception as e:
            raise ConfigError(f"cluster: cannot place {n} device workers ({bundle} each): {e}") from None

        def strategy(d: int):
            return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=d)

    def new_worker(d: int):
        if placement is not None and placement.spans_nodes:
            node = placement.nodes[placement.device_node[d]]
            if not node.answers() or not any(x["NodeID"] == node.node_id and x.get("Alive") for x in ray.nodes()):
                raise NodeLost(f"node {node.ip} (devices {placement.devices_on(node.index)}) is gone: device {d} "
                               f"cannot be restarted there; resume from {resume_point()} with: {resume_command()} "
                               "(on the nodes left, e.g. cluster.ray_address=null)")
        pool = "train" if d in spec.train_devices else "rollout"
        return cls.options(scheduling_strategy=strategy(d), **extra).remote(d, pool, cfg.trainer.threads,
                                                                             cfg.run.seed)

    return new_worker


def start_workers(cfg: TrainConfig, spec: ClusterSpec, rollout_kwargs: dict, model_dir: str,
                  trainer_config: dict, policy, trainer_ckpt=None, placement: Placement | None = None):
    """Start one worker per device, host each pool's native role (and, with
    ``cluster.prewarm``, each role ``policy`` may lend the device for); returns handles."""
    import ray

    n = spec.devices
    new_worker = _worker_factory(cfg, spec, placement)
    workers = {d: new_worker(d) for d in range(n)}
    try:  # pinned workers wait for their node's resources: say so instead of hanging
        ray.get([w.__ray_ready__.remote() for w in workers.values()], timeout=300)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(f"cluster: {n} device workers were not all placed within 300 s (is every node's "
                          f"{DEVICE_RESOURCE} or CPU/GPU free?)") from None
    train_devices = list(spec.train_devices)
    addr, port = rendezvous(placement, train_devices[0]) if len(train_devices) > 1 else ("127.0.0.1", None)
    calls = []
    for d, w in workers.items():
        if d in train_devices:
            rank = train_devices.index(d)
            dp = dict(dp_rank=rank, dp_world=len(train_devices), dp_port=port)
            if addr != "127.0.0.1":
                dp["dp_addr"] = addr
            calls.append(w.host.remote("train", model_dir=model_dir, config=trainer_config, **dp,
                                       checkpoint=str(trainer_ckpt) if trainer_ckpt else None))
        elif any(d == devs[0] for devs in spec.replica_devices):  # a replica's other devices host nothing
            calls.append(w.host.remote("rollout", **rollout_kwargs))
    lends = prewarm_hosts(spec, workers, rollout_kwargs, model_dir, trainer_config, policy) if cfg.cluster.prewarm \
        else []
    ray.get(calls)
    warm = []
    if cfg.cluster.warm_up_trainers:  # runs while the lent roles come up on the other devices
        warm = [(d, workers[d].call.remote("train", "warm_up", *warm_up_shape(cfg, spec))) for d in train_devices]
    switch_measurements = []
    if cfg.cluster.prewarm:
        switch_measurements = prewarm(cfg, spec, workers, rollout_kwargs, model_dir, trainer_config, lends)
        if trainer_ckpt is None:  # a resumed run loads the checkpoint's weights below
            switch_measurements += prewarm_weight_sync(spec, workers)
    switch_measurements += [(WARM_UP, ray.get(ref), d) for d, ref in warm]
    if trainer_ckpt is not None:  # rollout replicas start from the checkpoint's weights
        weights = workers[train_devices[0]].call.remote("train", "weights")
        version = ray.get(workers[train_devices[0]].call.remote("train", "get_version"))
        ray.get([workers[devs[0]].call.remote("rollout", "update_weights", weights, version)
                 for devs in spec.replica_devices])

    def unit_device(u: int) -> int:
        return spec.unit_devices(u)[0]

    return workers, unit_device, train_devices, switch_measurements, new_worker
