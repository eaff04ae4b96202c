"""One long-lived Ray actor per device, hosting role objects that come and go.

A device worker never changes class or restarts to change what it does: it *hosts*
roles (a rollout replica, a trainer shard, an auxiliary trainer), each an object that is
loaded and released.  The role native to the device's pool stays resident while a
borrowed role is hosted (here in host memory; on CUDA, vLLM sleep/wake and optimizer
offload), so giving a device back costs only the borrowed role's release.

Every role change is timed and returned to the driver, which feeds the switch-cost
estimator: that is where the measured ``C_in`` and ``C_out`` come from.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bidirl.engines.hf_io import quiet_hf_progress_bars
from bidirl.runtime.rollout_role import RolloutRole
from bidirl.runtime.vllm_env import apply_vllm_env, vllm_env
from bidirl.runtime.weight_shm import ShmReader, ShmTicket, ShmWriter
from bidirl.runtime.weight_sync import WeightLink


class DeviceWorker:
    """The actor body; wrapped with ``ray.remote`` by :func:`worker_class`."""

    def __init__(self, device: int, pool: str, threads: int = 1, seed: int = 0) -> None:
        # Thread counts must be fixed before vLLM loads: it replaces them process-wide.
        apply_vllm_env(threads)
        quiet_hf_progress_bars()
        import torch

        torch.set_num_threads(threads)
        self.device, self.pool, self.threads, self.seed = device, pool, threads, seed
        self.roles: dict[str, Any] = {}
        # Released borrowed roles are parked, not destroyed: the next lend wakes them
        # (vLLM sleep/wake on CUDA; on CPU the engine simply stays in host memory), so a
        # hot switch costs a weight load instead of an engine start.
        self.parked: dict[str, Any] = {}
        self.link = WeightLink()  # this device's end of the weight-sync group (rollout.weight_sync)
        self.shm_out, self.shm_in = ShmWriter(), ShmReader()  # rollout.weight_sync=shm: nothing until used

    # -- hosting ----------------------------------------------------------------------
    def host(self, role: str, **kwargs) -> float:
        """Bring ``role`` up on this device; returns the seconds it took (C_in)."""
        if role in self.roles:
            raise RuntimeError(f"device {self.device} already hosts {role}")
        t0 = time.perf_counter()
        w = kwargs.get("weights")
        if isinstance(w, list) and len(w) == 1:  # [ObjectRef]: fetch inside the timed C_in
            import ray

            kwargs["weights"] = ray.get(w[0])
        if role in self.parked:
            r = self.parked.pop(role)
            r.wake()
            if kwargs.get("weights") is not None:
                r.set_weights(kwargs["weights"], kwargs.get("version", 0))
            self.roles[role] = r
        elif role == "rollout":
            weights, version = kwargs.pop("weights", None), kwargs.pop("version", 0)
            r = RolloutRole(seed=self.seed, **kwargs)
            if weights is not None:
                r.update_weights(weights, version)
            self.roles[role] = r
        elif role in ("train", "aux_train"):
            # lazy: pulls in torch, and the driver imports this module to start the workers
            from bidirl.runtime.trainer_role import TrainerRole

            group = None
            world = kwargs.pop("dp_world", 1)
            rank, port = kwargs.pop("dp_rank", 0), kwargs.pop("dp_port", None)
            addr = kwargs.pop("dp_addr", "127.0.0.1")  # across nodes: rank 0's node address
            ckpt = kwargs.pop("checkpoint", None)
            if world > 1:  # the primary trainer's data-parallel group (gloo on CPU)
                from bidirl.engines.torch_setup import init_process_group  # lazy: torch, as TrainerRole

                group = init_process_group(rank, world, master_addr=addr, master_port=port)
            r = TrainerRole(threads=self.threads, process_group=group, **kwargs)
            if ckpt:
                r.load(ckpt)
            self.roles[role] = r
        else:
            raise ValueError(f"unknown role {role!r}; allowed: rollout, train, aux_train")
        return time.perf_counter() - t0

    def release(self, role: str, park: bool = True) -> tuple[float, Any]:
        """Take ``role`` down; returns (seconds, what it handed back: rollout partials).

        ``park`` keeps the role's objects for a fast next ``host`` (hot switch); without
        it the role is destroyed and its memory returned.
        """
        r = self.roles.pop(role, None)
        if r is None:
            raise RuntimeError(f"device {self.device} does not host {role}")
        t0 = time.perf_counter()
        handed_back = r.abort_all() if role == "rollout" else None
        if park:
            r.sleep()
            self.parked[role] = r
        else:
            r.release()
        return time.perf_counter() - t0, handed_back

    # -- weight sync over a group (runtime/weight_sync.py, runtime/sync_driver.py) ----------
    def join_weights(self, generation: int, addr: str, port: int, rank: int, world: int) -> float:
        import torch

        return self.link.join(generation, addr, port, rank, world, "cuda" if torch.cuda.is_available() else "cpu")

    def send_weights(self, version: int, delta: bool = False):
        """The primary trainer (rank 0) broadcasts its parameters; a ``SyncRecord``."""
        return self.link.send(self.roles["train"].named_tensors(), version, delta)

    def recv_weights(self) -> tuple[float, int]:
        """A replica receives and loads; (seconds from the header's arrival to the engine
        holding the weights: the sync model's measurement, bytes received)."""
        version, named, n = self.link.recv()
        t0 = self.link.header_at
        self.roles["rollout"].update_weights(named, version)
        return time.perf_counter() - t0, n

    def write_weights(self, version: int, delta: bool = False):
        """shm: the primary trainer writes its parameters into the segment; (the ticket the
        replicas read it with, a ``SyncRecord``)."""
        return self.shm_out.write(self.roles["train"].named_tensors(), version, delta)

    def read_weights(self, ticket: ShmTicket) -> tuple[float, int]:
        """shm: a replica loads views of the segment; (seconds to the engine holding the
        weights, bytes the sync wrote).  Checked again after the load: never a torn sync."""
        t0 = time.perf_counter()
        version, named, n = self.shm_in.read(ticket)
        self.roles["rollout"].update_weights(named, version)
        self.shm_in.check(ticket)
        return time.perf_counter() - t0, n

    def close_weights(self) -> None:
        """The run is over: the segment this device owns is unlinked."""
        self.shm_in.close()
        self.shm_out.close()

    def kill(self) -> None:
        """Die now (fault-injection tests): Ray reports the actor as dead to the driver."""
        os._exit(1)

    def poll(self, timeout_s: float) -> dict:
        """Drain the rollout replica's finished responses (``RolloutRole.poll``).

        Runs on its own thread (the ``stream`` concurrency group), so that while it waits
        the driver's other calls (new requests, weights, a reclaim) still reach the device.
        Nothing hosted (a reclaim got here first): nothing to report.
        """
        r = self.roles.get("rollout")
        if r is None:
            return {"finished": [], "measurements": [], "prefills": [], "running": 0}
        return r.poll(timeout_s)

    def call(self, role: str, method: str, *args, **kwargs):
        """Run ``method`` of a hosted role (the driver's one entry point into roles)."""
        r = self.roles.get(role)
        if r is None:
            raise RuntimeError(f"device {self.device} does not host {role} (hosts {sorted(self.roles)})")
        return getattr(r, method)(*args, **kwargs)


STREAM_GROUP = "stream"
STREAM_METHODS = frozenset({"poll"})  # the worker methods that run in STREAM_GROUP


def worker_class(num_cpus: float = 1, num_gpus: float = 0, log_level: str = "warning"):
    """The Ray actor class; one per device, one CPU core (or one GPU) each; vLLM and
    transformers log at ``log_level`` (``run.worker_log_level``) in it.

    Calls run one at a time, in order (``max_concurrency=1``), except ``poll``, which has
    its own thread (``STREAM_GROUP``) so that it can wait without holding the others up.
    """
    import ray

    env = {"env_vars": vllm_env(threads=1, log_level=log_level)}
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=env,
                      max_concurrency=1, concurrency_groups={STREAM_GROUP: 1})(DeviceWorker)

