"""The ``shm`` weight-sync transport: one node, CPU; the CPU analogue of ``cuda_ipc``.

::

    primary trainer (ShmWriter)          /dev/shm/bidirl-ws-<pid>-<layout>-<tag>       replica (ShmReader)
    named tensors --DeltaTracker-->      [header | table | tensor 0 | tensor 1 | ...]  <-- mapped once per
    one copy of each changed tensor -->  version (-1 while being written)                 layout: zero-copy
         returns a ShmTicket ------------> the driver --> read_weights(ticket) -------->  views of every tensor

The segment is laid out once per run (a new one, and the old one unlinked, when the set of
names, shapes or dtypes changes) and always holds the whole current set: a delta writes the
changed tensors alone, and a replica, new or not, reads the whole set without any merging (vLLM
reloads the whole set anyway; see ``weight_sync.py``).  The header's version is -1 while the
trainer writes and the sync's version once it is whole; the driver issues a replica's read only
after the write returned, and the next write only after every read of the previous one
(``sync_driver.py``), so a reader never meets a half-written sync; the version is checked
before and after the read all the same, and a mismatch refused.

The owner (the trainer) unlinks the segment when it is closed, garbage-collected or its process
exits (``weakref.finalize``).  A trainer killed outright runs none of that, and Ray kills its
children (``multiprocessing``'s resource tracker) with it, so the driver, which saw every
segment's name in the tickets, unlinks them too at the end of the run, failed or not
(``SyncDriver.close``, from ``DeviceExecutor.finish``).  Readers map the file directly, so they
never register it (and never unlink it on exit).
"""

from __future__ import annotations

import mmap
import os
import pickle
import secrets
import struct
import time
import weakref
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from bidirl.runtime.weight_sync import DeltaTracker, SyncEndpoint, SyncRecord, plan_buckets, tensor_bytes

__all__ = ["SHM_DIR", "ShmEndpoint", "ShmReader", "ShmTicket", "ShmWriter", "check_one_node", "unlink_segments"]

SHM_DIR = "/dev/shm"
PREFIX = "bidirl-ws-"
_MAGIC = b"bidirlws"
_HEAD = struct.Struct("<8sqqq")  # magic, version (-1: being written), layout, table bytes
_DATA_ALIGN = 4096  # the tensors start on a page of their own


@dataclass(frozen=True)
class ShmTicket:
    """What a replica is told to read: the driver carries it from the write to the reads."""

    segment: str
    layout: int
    version: int
    bytes_moved: int
    tensors: int


def check_one_node(device_node: tuple[int, ...], trainer: int, where: list[str] | None = None) -> None:
    """A one-line ``ValueError`` unless every device of the run is on the primary trainer's
    node: any of them may host a replica (a trainer unit is lent as one), and a segment of
    ``/dev/shm`` is seen on its own node alone."""
    home = device_node[trainer]
    away = [d for d, k in enumerate(device_node) if k != home]
    if away:
        nodes = f" ({', '.join(where)})" if where else ""
        raise ValueError(f"weight_sync 'shm' needs every device on the primary trainer's node; the run's devices "
                         f"are on {len(set(device_node))} nodes{nodes}, devices {away} away from device {trainer}'s "
                         "(use collective or object_store)")


def _dtype_name(t) -> str:
    return str(t.dtype) if isinstance(t, np.ndarray) else str(t.dtype).removeprefix("torch.")


def _unlink(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.unlink()
    except FileNotFoundError:  # the driver unlinked it first (``unlink_segments``): untrack it all the same
        resource_tracker.unregister(shm._name, "shared_memory")
    try:
        shm.close()
    except BufferError:  # a view still exported: the mapping goes with it, the name is gone already
        pass


def unlink_segments(names) -> list[str]:
    """Unlink these segments where this process sees them (the driver's end of the run: a
    trainer killed outright runs no finaliser, and Ray takes its resource tracker with it);
    the ones it unlinked."""
    gone = []
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            gone.append(name)
        except FileNotFoundError:  # unlinked by its owner, or on another node than this process
            pass
    return gone


class ShmWriter:
    """The primary trainer's end: owns the segment and writes every sync into it."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None
        self.key: tuple | None = None  # (name, shape, dtype) per tensor: the layout's identity
        self.layout = 0
        self.entries: dict[str, tuple[int, int]] = {}  # name -> (offset in the segment, bytes)
        self.tracker = DeltaTracker()  # what the segment holds
        self._finalizer = None

    def write(self, named: dict[str, Any], version: int, delta: bool = False) -> tuple[ShmTicket, SyncRecord]:
        """Write ``named`` (with ``delta``, its changed tensors) into the segment; the ticket
        the replicas read it with, and the sync's record (the copies' seconds)."""
        t0 = time.perf_counter()
        key = tuple((k, tuple(t.shape), _dtype_name(t)) for k, t in named.items())
        if key != self.key:
            self._lay_out(named, key)
        names, digests = self.tracker.changed(named) if delta else (list(named), None)
        self._set_version(-1)
        moved = 0
        for k in names:
            off, n = self.entries[k]
            moved += n
            if n:
                self._view(off, n).copy_(_flat_cpu(named[k]))
        self._set_version(version)
        if digests is None and all(hasattr(t, "_version") for t in named.values()):
            digests = self.tracker.changed(named)[1]  # torch's marks cost no reads
        if digests is not None:  # else (numpy, a whole write) the old marks stay: a superset changed since
            self.tracker.sent(digests)
        ticket = ShmTicket(self.shm.name, self.layout, version, moved, len(names))
        return ticket, SyncRecord("shm", version, moved, tensor_bytes(named), len(names), time.perf_counter() - t0)

    def _lay_out(self, named: dict[str, Any], key: tuple) -> None:
        """A new segment for this set of tensors (the old one unlinked): a header, the table, the data."""
        entries, sizes = plan_buckets(named, bucket_bytes=1 << 62)  # one bucket: offsets, 64-byte aligned
        table = pickle.dumps([(name, shape, dt, off, n) for name, shape, dt, _, off, n in entries])
        data = -(-(_HEAD.size + len(table)) // _DATA_ALIGN) * _DATA_ALIGN
        size = data + (sizes[0] if sizes else 0)
        free = os.statvfs(SHM_DIR).f_bavail * os.statvfs(SHM_DIR).f_frsize
        if size > free + (self.shm.size if self.shm is not None else 0):
            raise ValueError(f"weight_sync 'shm' needs {size / 1e9:.2f} GB of {SHM_DIR}, which has "
                             f"{free / 1e9:.2f} GB free (grow it, or use collective or object_store)")
        self.close()
        self.layout += 1
        name = f"{PREFIX}{os.getpid()}-{self.layout}-{secrets.token_hex(3)}"
        self.shm = shared_memory.SharedMemory(name, create=True, size=size)
        self._finalizer = weakref.finalize(self, _unlink, self.shm)
        _HEAD.pack_into(self.shm.buf, 0, _MAGIC, -1, self.layout, len(table))
        self.shm.buf[_HEAD.size:_HEAD.size + len(table)] = table
        self.entries = {name: (data + off, n) for name, _, _, _, off, n in entries}
        self.key = key
        self.tracker.forget()  # a fresh segment holds nothing: the first write is whole

    def _set_version(self, version: int) -> None:
        struct.pack_into("<q", self.shm.buf, 8, version)

    def _view(self, off: int, n: int):
        import torch

        return torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=n, offset=off)

    def close(self) -> None:
        """Unlink the segment (the end of the run); readers' mappings stay valid until they drop them."""
        if self._finalizer is not None:
            self._finalizer()
        self.shm, self._finalizer, self.key, self.entries = None, None, None, {}


def _flat_cpu(t):
    """``t``'s bytes as a flat uint8 CPU tensor (a view when it is contiguous already)."""
    import torch

    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    return t.detach().to("cpu").contiguous().view(-1).view(torch.uint8)


class ShmReader:
    """A replica's end: maps a segment once per layout and hands out views of its tensors."""

    def __init__(self) -> None:
        self.segment: str | None = None
        self.map: mmap.mmap | None = None
        self.views: dict[str, Any] = {}

    def read(self, ticket: ShmTicket) -> tuple[int, dict[str, Any], int]:
        """(version, every tensor as a zero-copy view, bytes the sync wrote): the views are
        numpy arrays (torch tensors for dtypes numpy lacks), valid until the next sync's write."""
        if ticket.segment != self.segment:
            self._map(ticket)
        self.check(ticket)
        return ticket.version, dict(self.views), ticket.bytes_moved

    def check(self, ticket: ShmTicket) -> None:
        """Refuse a segment that does not hold ``ticket``'s sync, whole."""
        magic, version, layout, _ = _HEAD.unpack_from(self.map, 0)
        if magic != _MAGIC or layout != ticket.layout or version != ticket.version:
            raise RuntimeError(f"weight_sync 'shm': segment {ticket.segment} holds layout {layout} version {version}, "
                               f"not the sync's layout {ticket.layout} version {ticket.version} (written over)")

    def _map(self, ticket: ShmTicket) -> None:
        self.close()
        fd = os.open(os.path.join(SHM_DIR, ticket.segment), os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        _, _, _, n = _HEAD.unpack_from(self.map, 0)
        table = pickle.loads(self.map[_HEAD.size:_HEAD.size + n])
        data = -(-(_HEAD.size + n) // _DATA_ALIGN) * _DATA_ALIGN
        self.views = {name: _view(self.map, dt, shape, data + off, nbytes) for name, shape, dt, off, nbytes in table}
        self.segment = ticket.segment

    def close(self) -> None:
        self.views, self.segment = {}, None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # views still held (by the engine's caller): they keep the mapping
                pass
            self.map = None


def _view(buf, dtype: str, shape: tuple, offset: int, nbytes: int):
    """A zero-copy view of ``nbytes`` at ``offset``: numpy where numpy has the dtype (bf16: torch)."""
    try:
        return np.ndarray(shape, np.dtype(dtype), buffer=buf, offset=offset)
    except TypeError:
        import torch

        flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(getattr(torch, dtype)).view(shape)


class ShmEndpoint(SyncEndpoint):
    """``SyncEndpoint`` with the ``shm`` transport's ends too (the bench's and the tests')."""

    def __init__(self, threads: int = 1) -> None:
        super().__init__(threads)
        self.shm_out, self.shm_in = ShmWriter(), ShmReader()

    def write(self, version: int, delta: bool = False) -> tuple[ShmTicket, SyncRecord]:
        """(the ticket to read this sync with, its record): what ``write_weights`` returns."""
        return self.shm_out.write(self.named, version, delta)

    def read(self, ticket: ShmTicket) -> tuple[int, int]:
        self.version, self.named, n = self.shm_in.read(ticket)
        return self.version, n

    def close_shm(self) -> None:
        self.shm_in.close()
        self.shm_out.close()
