"""How a ``SyncWeights`` reaches the replicas, for ``rollout.weight_sync``'s transport.

``object_store`` (the default): the primary's weights are fetched once per version as a numpy
dict in Ray's store (``PolicyWeights``) and every replica loads them (``update_weights``).

``collective``: the primary trainer (rank 0) and the replicas being synced form a weight group
(``runtime/weight_sync.WeightLink``, a process group apart from the trainer's data-parallel
one); the trainer's ``send_weights`` and each replica's ``recv_weights`` are issued together and
meet in a bucketed broadcast.  The group follows the replica set: a sync whose targets differ
from the group's members (a trainer unit lent as a replica, or reclaimed; a replica lent as an
auxiliary trainer, or home; a device restarted) first issues ``join_weights`` to every member
of a new generation (a fresh rendezvous), in call order before the broadcast, so the driver
never waits.  A rebuilt group starts with a whole send, so ``delta`` never assumes what a new
member holds.  Weights given outside a sync (a lend's C_in, a replica's catch-up, a restart)
still go through the object store.

``shm`` (one node, CPU; ``runtime/weight_shm.py``): the trainer's ``write_weights`` copies the
weights (a delta: the changed tensors) into a ``/dev/shm`` segment; once it returns, each
replica's ``read_weights`` loads zero-copy views of it.  The next write waits, here in the
driver, for every read of the previous one (the segment holds one sync), so no device waits
and no reader meets a half-written sync.

Every sync is recorded (transport, bytes, seconds): ``records``, and ``WeightsSynced.bytes_moved``
feeds the weight-sync model's per-byte term.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable

from bidirl.runtime.weight_shm import unlink_segments


class SyncDriver:
    def __init__(self, ex, transport: str = "object_store", delta: bool = False,
                 rendezvous: Callable[[], tuple[str, int]] | None = None) -> None:
        self.ex, self.transport, self.delta = ex, transport, delta
        self.rendezvous = rendezvous
        self.members: tuple[int, ...] | None = None  # the group's replica devices, in rank order
        self.generation = -1
        self.records: list[dict] = []  # {transport, version, bytes_moved, full_bytes, seconds, rebuilt}
        self.shm_queue: deque = deque()  # shm: syncs waiting for the previous one's reads
        self.shm_busy = False
        self.segments: set[str] = set()  # shm: every segment the trainer wrote, unlinked by ``close``

    def push(self, units: list[int], version: int, done: Callable[[object], None]) -> bool:
        """Bring ``version`` to ``units``' replicas; ``done`` per replica (the device's load
        seconds, or ``(seconds, bytes)``).  False: the object store's path is the caller's."""
        if self.transport not in ("collective", "shm") or not units:
            return False
        ex = self.ex
        if self.transport == "shm":
            self.shm_queue.append((tuple(ex.unit_device(u) for u in units), version, done))
            if not self.shm_busy:
                self._next_shm()
            return True
        trainer = ex.layout.train_devices[0]
        devices = tuple(ex.unit_device(u) for u in units)
        rebuilt = devices != self.members
        if rebuilt:
            self._rebuild(trainer, devices)
        t0 = ex.now()

        def sent(rec) -> None:
            self.records.append({"transport": rec.transport, "version": rec.version, "bytes_moved": rec.bytes_moved,
                                 "full_bytes": rec.full_bytes, "seconds": rec.seconds, "wall_s": ex.now() - t0,
                                 "rebuilt": rebuilt, "replicas": len(devices)})

        ex.calls.issue(trainer, sent, ("train", "weight sync"), "send_weights", version, self.delta)
        for d in devices:
            ex.calls.issue(d, done, ("rollout", "weight sync"), "recv_weights", on_lost=lambda: done(None))
        return True

    def _next_shm(self) -> None:
        """Write the oldest waiting sync; its reads once the write returned; then the next."""
        if not self.shm_queue:
            self.shm_busy = False
            return
        self.shm_busy = True
        ex = self.ex
        devices, version, done = self.shm_queue.popleft()
        t0, left, rec = ex.now(), [len(devices)], {}

        def read(result) -> None:
            done(result)
            left[0] -= 1
            if left[0] == 0:
                rec["wall_s"] = ex.now() - t0  # issue to the last replica holding the weights
                self._next_shm()

        def written(out) -> None:
            ticket, r = out
            rec.update({"transport": r.transport, "version": r.version, "bytes_moved": r.bytes_moved,
                        "full_bytes": r.full_bytes, "seconds": r.seconds, "wall_s": None,
                        "rebuilt": ticket.layout != self.generation, "replicas": len(devices)})
            self.generation = ticket.layout  # shm: the segment's layout
            self.segments.add(ticket.segment)
            self.records.append(rec)
            for d in devices:
                ex.calls.issue(d, read, ("rollout", "weight sync"), "read_weights", ticket, on_lost=lambda: read(None))

        ex.calls.issue(ex.layout.train_devices[0], written, ("train", "weight sync"), "write_weights", version,
                       self.delta)

    def close(self) -> None:
        """The run is over, failed or not: the trainer unlinks its segment (not waited for),
        and so does the driver, which saw every segment's name (a trainer killed outright runs
        no finaliser)."""
        if self.transport != "shm" or not self.segments:
            return
        try:
            self.ex.backend.submit(self.ex.layout.train_devices[0], "close_weights")
        except Exception:  # the trainer is gone already
            pass
        unlink_segments(self.segments)

    def _rebuild(self, trainer: int, devices: tuple[int, ...]) -> None:
        addr, port = self.rendezvous()
        self.generation += 1
        world, g = len(devices) + 1, self.generation
        self.ex.calls.issue(trainer, lambda _: None, None, "join_weights", g, addr, port, 0, world)
        for rank, d in enumerate(devices, start=1):
            self.ex.calls.issue(d, lambda _: None, None, "join_weights", g, addr, port, rank, world)
        self.members = devices

    def forget(self) -> None:
        """A member's process is gone (a lost device): the next sync builds a new group."""
        self.members = None

    def summary(self) -> dict:
        """``summary.json``'s ``weight_sync``: the transport, and over the run's syncs (collective
        and shm record each; the object store's path records only its durations, in the
        executor) the bytes moved against a whole send's, and median seconds."""
        out = {"transport": self.transport, "delta": self.delta, "syncs": len(self.records)}
        recs = [r for r in self.records if r.get("seconds") is not None]
        if recs:
            moved = sum(r["bytes_moved"] for r in recs)
            out.update(bytes_moved=moved, full_bytes=sum(r["full_bytes"] for r in recs),
                       seconds_median=statistics.median(r["seconds"] for r in recs),
                       group_rebuilds=sum(1 for r in recs if r.get("rebuilt")))
        waited = [r["wall_s"] for r in self.records if r.get("wall_s") is not None]
        if waited:
            out["wall_s_median"] = statistics.median(waited)
        if self.transport == "object_store":
            out["syncs"] = len(self.ex.sync_seconds)
        return out
