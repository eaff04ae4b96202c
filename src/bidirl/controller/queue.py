"""The group queue: which prompt groups are waiting to start, and per-batch progress.

Kept apart from ``ClusterState`` because it is the one place that knows the order groups
start in, the rule every policy shares: partial groups (prefixes a reclaimed replica
handed back) first, lowest group id first, then fresh groups in group-id order.  Every
question a policy asks of it is O(1) or O(log n), so admission stays cheap per event:

* fresh groups are ``next_fresh..total_groups-1``, a counter, not a list; ``ahead`` holds
  fresh ids already committed beyond ``next_fresh`` (a decision may assign a later fresh
  group before an earlier one while its actions are being committed);
* partial groups wait in ``partial_heap``, a heap of ``(group, seq)`` with lazy deletion:
  an entry is valid while ``partial_seq[group] == seq``, so resuming a group is a dict
  delete and re-queueing it again never leaves a stale entry that looks valid;
* per-batch counters (``started``, ``last_start``, ``done``, ``partial_in_batch``) answer
  "is batch b ready" and "how much is queued up to batch b" without scanning groups.

``ClusterState`` changes it (assignments, completions, interruptions); policies only read
it through the state.
"""

from __future__ import annotations

import heapq

from bidirl.controller.cluster import ClusterSpec


class GroupQueue:
    """Fresh groups by counter, partial groups by heap, progress per batch (see module)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.total_groups = spec.total_groups
        self.groups_per_step = spec.groups_per_step
        self.steps = spec.steps
        self.next_fresh = 0  # the lowest fresh group not started
        self.ahead: set[int] = set()  # fresh groups started beyond next_fresh
        self.partial_heap: list[tuple[int, int]] = []  # (group, seq), lazily deleted
        self.partial_seq: dict[int, int] = {}  # partial group -> its valid heap seq
        self.seq = 0
        self.partial_left: dict[int, int] = {}  # group -> responses left (partial or resumed)
        self.partial_in_batch = [0] * spec.steps  # partial groups waiting, per batch
        self.started = [0] * spec.steps  # fresh groups started, per batch
        self.last_start = [0.0] * spec.steps  # when a batch's last group started
        self.done = [0] * spec.steps  # groups complete, per batch

    def batch_ready(self, b: int) -> bool:
        """Every group of batch ``b`` is complete (and ``b`` is a real batch)."""
        return b < self.steps and self.done[b] == self.groups_per_step

    def queued(self, first_batch: int, through_batch: int) -> int:
        """Groups of batches <= ``through_batch`` not running and not complete.

        ``first_batch`` is the first batch not yet trained: the batches before it hold no
        partial groups, so only the later batches' counters are summed.
        """
        last = min(through_batch, self.steps - 1)
        fresh = max(0, (last + 1) * self.groups_per_step - self.next_fresh)
        return fresh + sum(self.partial_in_batch[first_batch: last + 1])

    def partial_head(self) -> int | None:
        """The lowest partial group waiting to be resumed (stale heap entries dropped)."""
        heap, seq = self.partial_heap, self.partial_seq
        while heap:
            gid, n = heap[0]
            if seq.get(gid) == n:
                return gid
            heapq.heappop(heap)
        return None

    def head(self) -> int | None:
        """The group that starts next (partial prefixes first), if any is queued."""
        gid = self.partial_head()
        if gid is not None:
            return gid
        return self.next_fresh if self.next_fresh < self.total_groups else None

    def has_work(self) -> bool:
        """Some group (partial or fresh) is still waiting to start."""
        return bool(self.partial_seq) or self.next_fresh < self.total_groups

    def requeue(self, gid: int, batch: int, left: int) -> None:
        """An interrupted group waits again, ``left`` responses to go, ahead of fresh ones."""
        self.partial_left[gid] = left
        self.partial_in_batch[batch] += 1
        self.seq += 1
        self.partial_seq[gid] = self.seq
        heapq.heappush(self.partial_heap, (gid, self.seq))
