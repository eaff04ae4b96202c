"""Weight sync as a transport: how the primary trainer's weights reach the rollout replicas.

::

    trainer (rank 0)                                   replicas (ranks 1..n)
    named tensors --DeltaTracker (optional)--> header: version, names, shapes, dtypes, buckets
      object_store  one numpy dict in Ray's store  ---->  ray.get (zero copy on one node)
      collective    broadcast(header), then one    ---->  views into the received buckets;
                    broadcast per bucket (gloo on CPU,     a delta merged into the full set
                    NCCL on CUDA) over a WeightLink        the replica holds
      cuda_ipc      CUDA IPC handles of the trainer's tensors, same device only
      shm           one copy into a /dev/shm segment ---->  zero-copy views of it (one node, CPU;
                    (``weight_shm.py``)                     the CPU analogue of cuda_ipc)

A ``WeightLink`` is one device's end of the weight group: a process group of its own (a
``TCPStore`` hosted by the trainer, rank 0), apart from the trainer's data-parallel group, so
it can be rebuilt whenever the set of replicas changes (a lend or a reclaim) without touching
training.  Every send returns a ``SyncRecord`` (transport, bytes, seconds): the per-byte cost
the weight-sync model learns (``controller/estimates.py``).

``delta`` sends only the tensors whose bytes changed since the group last received them (a
rebuilt group starts with a full send); the replica merges them into the weights it holds and
reloads the whole set, since vLLM fuses q/k/v and gate/up and cannot load one shard alone.
"""

from __future__ import annotations

import datetime
import hashlib
import pickle
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TRANSPORTS", "DeltaTracker", "SyncRecord", "WeightLink", "check_transport", "tensor_bytes"]

TRANSPORTS = ("object_store", "collective", "cuda_ipc", "shm")
# Measured (bench/weight_sync.py): gloo on loopback reaches its rate from 64 MiB buckets on.
BUCKET_BYTES = 64 << 20
_ALIGN = 64  # every tensor starts on a 64-byte boundary of its bucket: any dtype's view is legal
GROUP_TIMEOUT_S = 600


def check_transport(name: str, device: str = "cpu") -> str:
    """``name`` if it is a transport this run can use; a one-line ``ValueError`` otherwise."""
    if name not in TRANSPORTS:
        raise ValueError(f"weight_sync {name!r} is not a transport; choose one of: {', '.join(TRANSPORTS)}")
    if name == "cuda_ipc" and device != "cuda":
        raise ValueError(f"weight_sync 'cuda_ipc' needs the trainer and the replica on one CUDA device; "
                         f"this run's device is {device} (use object_store or collective)")
    if name == "shm" and device != "cpu":
        raise ValueError(f"weight_sync 'shm' is a CPU transport (a /dev/shm segment on one node); this run's "
                         f"device is {device} (use cuda_ipc or collective)")
    return name


@dataclass(frozen=True)
class SyncRecord:
    """One sync as the sender saw it: the per-byte cost's measurement."""

    transport: str
    version: int
    bytes_moved: int  # what crossed: a delta's changed tensors, else everything
    full_bytes: int  # what a full sync would have moved
    tensors: int
    seconds: float


def _np(t) -> np.ndarray:
    """A CPU numpy view of a tensor or an array (no copy when it is one already)."""
    if isinstance(t, np.ndarray):
        return t
    return t.detach().cpu().numpy()


def tensor_bytes(named: dict[str, Any]) -> int:
    return sum(_np(t).nbytes if isinstance(t, np.ndarray) else t.numel() * t.element_size()
               for t in named.values())


class DeltaTracker:
    """Which tensors differ from what a receiver holds.

    A torch tensor's mark is its in-place version counter and storage (every optimizer step,
    ``copy_`` or ``add_`` moves the counter; a frozen tower's and LoRA's base never do), so a
    sync looks at no bytes: hashing the adapters took a third of a LoRA sync (measured).  An
    array without a counter (numpy) is marked by a SHA-1 of its bytes."""

    def __init__(self) -> None:
        self.held: dict[str, bytes] = {}  # name -> the mark of what the receivers hold

    def digest(self, name: str, t) -> bytes:
        if hasattr(t, "_version"):
            return f"v{t._version}@{t.data_ptr()}".encode()
        a = np.ascontiguousarray(_np(t))
        return hashlib.sha1(a.view(np.uint8).reshape(-1), usedforsecurity=False).digest() + str(a.dtype).encode()

    def changed(self, named: dict[str, Any]) -> tuple[list[str], dict[str, bytes]]:
        """(names whose bytes differ from what is held, every tensor's digest)."""
        digests = {k: self.digest(k, t) for k, t in named.items()}
        return [k for k, d in digests.items() if self.held.get(k) != d], digests

    def sent(self, digests: dict[str, bytes]) -> None:
        self.held = dict(digests)

    def forget(self) -> None:
        """The receivers changed: the next sync is whole."""
        self.held = {}


def plan_buckets(named: dict[str, Any], bucket_bytes: int = BUCKET_BYTES) -> tuple[list[tuple], list[int]]:
    """``([(name, shape, dtype, bucket, offset, nbytes)], bucket sizes)``: tensors packed in
    order into buckets of at most ``bucket_bytes``; a larger tensor is a bucket of its own."""
    entries, sizes, cur = [], [], None
    for name, t in named.items():
        a = t if isinstance(t, np.ndarray) else None
        shape = tuple(a.shape if a is not None else t.shape)
        dtype = str(a.dtype) if a is not None else str(t.dtype).removeprefix("torch.")
        n = a.nbytes if a is not None else t.numel() * t.element_size()
        if cur is None or sizes[cur] + n > bucket_bytes:
            sizes.append(0)
            cur = len(sizes) - 1
        off = -(-sizes[cur] // _ALIGN) * _ALIGN
        entries.append((name, shape, dtype, cur, off, n))
        sizes[cur] = off + n
    return entries, sizes


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


class WeightLink:
    """One device's end of the weight-sync group (see the module docstring)."""

    def __init__(self, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.pg = None
        self.generation = -1
        self.rank = -1
        self.device = "cpu"
        self.bucket_bytes = bucket_bytes
        self.tracker = DeltaTracker()  # the sender's: what the group holds
        self.held: dict[str, Any] = {}  # a receiver's: the full weights, when deltas arrive
        self.header_at = 0.0
        # Buckets kept from sync to sync: a fresh 64 MiB buffer's first touch (page faults)
        # cost as much as its broadcast (measured, bench/weight_sync.py).
        self._staging: dict[tuple[int, int], Any] = {}

    # -- the group ---------------------------------------------------------------------
    def join(self, generation: int, addr: str, port: int, rank: int, world: int, device: str = "cpu") -> float:
        """Join generation ``generation`` of the group (every member calls this, the trainer as
        rank 0, which hosts the store); the previous one is dropped.  Returns the seconds."""
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        self.pg = None
        timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
        store = dist.TCPStore(addr, port, world, rank == 0, timeout=timeout)
        store = dist.PrefixStore(f"bidirl-weights-{generation}", store)
        if device == "cuda":
            torch.cuda.set_device(torch.cuda.current_device())
            self.pg = dist.ProcessGroupNCCL(store, rank, world)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world, timeout)
        self._store = store  # the master (rank 0) must outlive the others' use of it
        self.generation, self.rank, self.device = generation, rank, device
        self.tracker.forget()
        self.held, self._staging = {}, {}
        return time.perf_counter() - t0

    def _broadcast(self, t) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def _bytes(self, payload: bytes | None):
        """Broadcast a small byte string (the header) from rank 0."""
        import torch

        n = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=self.device)
        self._broadcast(n)
        buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device) if payload is not None
               else torch.empty(int(n.item()), dtype=torch.uint8, device=self.device))
        self._broadcast(buf)
        return bytes(buf.cpu().numpy())

    # -- the trainer's side ------------------------------------------------------------
    def send(self, named: dict[str, Any], version: int, delta: bool = False) -> SyncRecord:
        """Broadcast ``named`` (or, with ``delta``, its changed tensors) to every replica."""

        if self.pg is None:
            raise RuntimeError("weight link: send before join")
        t0 = time.perf_counter()
        full = tensor_bytes(named)
        digests = None
        if delta:
            names, digests = self.tracker.changed(named)
            named = {k: named[k] for k in names}
        entries, sizes = plan_buckets(named, self.bucket_bytes)
        self._bytes(pickle.dumps((version, delta, entries, sizes)))
        for b, size in enumerate(sizes):
            members = [e for e in entries if e[3] == b]
            if len(members) == 1:  # a bucket of one tensor: broadcast it in place
                buf = _flat_bytes(named[members[0][0]], self.device)
            else:
                buf = self._buffer(b, size)
                for name, _, _, _, off, n in members:
                    buf[off:off + n].copy_(_flat_bytes(named[name], self.device))
            self._broadcast(buf)
        if digests is not None:
            self.tracker.sent(digests)
        return SyncRecord("collective", version, sum(e[5] for e in entries), full, len(entries),
                          time.perf_counter() - t0)

    def pack(self, named: dict[str, Any], version: int, delta: bool = False) -> tuple[dict, SyncRecord]:
        """object_store: (the payload to put in Ray's store, numpy copies safe to ship; its record).
        The record's seconds are the copies alone: the store's put and get are the caller's."""
        t0 = time.perf_counter()
        full = tensor_bytes(named)
        if delta:
            names, digests = self.tracker.changed(named)
            self.tracker.sent(digests)
            named = {k: named[k] for k in names}
        arrays = {k: np.array(_np(t), copy=True) for k, t in named.items()}
        moved = sum(a.nbytes for a in arrays.values())
        payload = {"version": version, "delta": delta, "arrays": arrays}
        return payload, SyncRecord("object_store", version, moved, full, len(arrays), time.perf_counter() - t0)

    # -- a replica's side --------------------------------------------------------------
    def unpack(self, payload: dict) -> tuple[int, dict[str, Any], int]:
        """What :meth:`pack` made, as :meth:`recv` returns it."""
        got = payload["arrays"]
        moved = sum(a.nbytes for a in got.values())
        if payload["delta"]:
            self.held.update(got)
            got = dict(self.held)
        return payload["version"], got, moved

    def recv(self) -> tuple[int, dict[str, Any], int]:
        """(version, the full named weights, bytes received): views into the link's buckets,
        valid until the next ``recv`` (the replica loads them into its engine before), or
        with a delta, the held weights it was merged into."""

        if self.pg is None:
            raise RuntimeError("weight link: recv before join")
        version, delta, entries, sizes = pickle.loads(self._bytes(None))
        self.header_at = time.perf_counter()  # the sender has started: waiting for it is not the sync
        bufs = []
        for b, size in enumerate(sizes):
            buf = self._buffer(b, size)
            self._broadcast(buf)
            bufs.append(buf)
        got = {name: bufs[b][off:off + n].view(_torch_dtype(dt)).view(shape)
               for name, shape, dt, b, off, n in entries}
        if self.device == "cpu":
            got = {k: v.numpy() for k, v in got.items()}
        if delta:  # the buckets are reused: what is held must own its bytes
            self.held.update({k: v.copy() if isinstance(v, np.ndarray) else v.clone() for k, v in got.items()})
            got = dict(self.held)
        return version, got, sum(e[5] for e in entries)

    def _buffer(self, index: int, size: int):
        """Bucket ``index``'s buffer of ``size`` bytes, kept for the next sync."""
        import torch

        buf = self._staging.get((index, size))
        if buf is None:
            buf = self._staging[(index, size)] = torch.empty(size, dtype=torch.uint8, device=self.device)
        return buf


def _flat_bytes(t, device: str):
    """``t``'s bytes as a flat uint8 tensor on ``device`` (a view when it is contiguous there)."""
    import torch

    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    t = t.detach().to(device).contiguous()
    return t.view(-1).view(torch.uint8)


def cuda_ipc_handles(named: dict[str, Any]) -> dict[str, Any]:
    """The trainer's CUDA tensors as IPC handles (``torch.multiprocessing``'s reduction): a
    replica on the same device rebuilds them without a copy.  Refused off CUDA."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    if not torch.cuda.is_available():
        raise ValueError("weight_sync 'cuda_ipc' needs CUDA; this process has none")
    return {k: reduce_tensor(t.detach()) for k, t in named.items()}


def from_cuda_ipc(handles: dict[str, Any]) -> dict[str, Any]:
    """Rebuild what :func:`cuda_ipc_handles` made (the replica's side)."""
    return {k: fn(*args) for k, (fn, args) in handles.items()}


class SyncEndpoint:
    """A process holding named weights and a ``WeightLink``: the bench's and the tests' stand-in
    for a device worker (no vLLM), wrapped with ``ray.remote`` by the caller."""

    def __init__(self, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.link = WeightLink()
        self.named: dict[str, Any] = {}
        self.version = -1

    def make(self, shapes: dict[str, tuple], seed: int = 0) -> int:
        """Random fp32 tensors of these shapes (the trainer's parameters); their bytes."""
        import torch

        g = torch.Generator().manual_seed(seed)
        self.named = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
        return tensor_bytes(self.named)

    def touch(self, names: list[str], step: float = 1e-3) -> None:
        """An optimizer step on ``names`` alone (LoRA adapters, an unfrozen tower)."""
        import torch

        with torch.no_grad():
            for k in names:
                self.named[k].add_(step)

    def join(self, *args, **kwargs) -> float:
        return self.link.join(*args, **kwargs)

    def send(self, version: int, delta: bool = False) -> SyncRecord:
        return self.link.send(self.named, version, delta)

    def pack(self, version: int, delta: bool = False) -> dict:
        return self.link.pack(self.named, version, delta)[0]

    def recv(self) -> tuple[int, int]:
        self.version, self.named, n = self.link.recv()
        return self.version, n

    def load(self, payload: list) -> tuple[int, int]:
        """object_store: ``payload`` is ``[ObjectRef]``, fetched here (the transfer's end)."""
        import ray

        self.version, self.named, n = self.link.unpack(ray.get(payload[0]))
        return self.version, n

    def digest(self) -> dict[str, str]:
        return {k: hashlib.sha1(np.ascontiguousarray(_np(v)).view(np.uint8).reshape(-1),
                                usedforsecurity=False).hexdigest() for k, v in self.named.items()}
