"""The group queue: which prompt groups are waiting to start, and per-batch progress.

Kept apart from ``ClusterState`` because it is the one place that knows the order groups
start in, the rule every policy shares: partial groups (prefixes a reclaimed replica
handed back) first, lowest group id first, then fresh groups in group-id order.  Every
question a policy asks of it is O(1) or O(log n), so admission stays cheap per event:

* fresh groups are a counter, not a list: ``next_fresh`` is the lowest not started,
  ``ahead`` holds fresh ids already committed beyond it (a decision may assign a later
  fresh group before an earlier one while its actions are being committed); which batch a
  fresh group joins is ``members`` (``controller/batches.py``: in id order, and with DAPO's
  dynamic sampling, replacements of filtered groups first);
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

from bidirl.controller.batches import BatchMembers
from bidirl.controller.cluster import ClusterSpec


class GenerationCapError(RuntimeError):
    """A batch needs more groups than ``max_num_gen_batches`` lets it generate.

    Raised by the controller when a group is filtered and its batch has already generated
    ``cap x groups_per_step`` groups: the batch can never fill, so the run stops (cleanly:
    the real runtime checkpoints its last step boundary, ``runtime/session.py``).
    ``named(option, step_offset)`` is the same error naming the setting and the step as the
    caller spells them (a resumed run's controller counts steps from its checkpoint).
    """

    def __init__(self, batch: int, generated: int, most_kept: int, needed: int, cap: int,
                 keep_rate: float, option: str = "max_num_gen_batches", then: str = "") -> None:
        self.batch, self.generated, self.most_kept, self.needed = batch, generated, most_kept, needed
        self.cap, self.keep_rate = cap, keep_rate
        super().__init__(
            f"{option}={cap}: step {batch} generated {generated} groups ({cap} x {needed}), "
            f"{generated - most_kept} of them filtered (all rewards equal), so it cannot keep the {needed} it "
            f"trains; keep rate so far {keep_rate:.2f}; raise {option} (0: no cap), or use data or a reward "
            f"whose groups' rewards differ more often{then}")

    def named(self, option: str, step_offset: int = 0, then: str = "") -> GenerationCapError:
        """The same error naming ``option``, the step counted from ``step_offset``, and ending
        with ``then`` (what was kept, how to go on)."""
        return GenerationCapError(self.batch + step_offset, self.generated, self.most_kept, self.needed,
                                  self.cap, self.keep_rate, option, then)


class GroupQueue:
    """Fresh groups by counter, partial groups by heap, progress per batch (see module)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.groups_per_step = spec.groups_per_step
        self.steps = spec.steps
        self.members = BatchMembers(spec)  # which batch each group joins (controller/batches.py)
        self.next_fresh = 0  # the lowest fresh group not started
        self.ahead: set[int] = set()  # fresh groups started beyond next_fresh
        self.partial_heap: list[tuple[int, int]] = []  # (group, seq), lazily deleted
        self.partial_seq: dict[int, int] = {}  # partial group -> its valid heap seq
        self.seq = 0
        self.partial_left: dict[int, int] = {}  # group -> responses left (partial or resumed)
        self.partial_in_batch = [0] * spec.steps  # partial groups waiting, per batch
        self.started = [0] * spec.steps  # fresh groups started, per batch
        self.last_start = [0.0] * spec.steps  # when a batch's last group started
        self.done = [0] * spec.steps  # groups complete and kept, per batch

    def batch_ready(self, b: int) -> bool:
        """Every group of batch ``b`` is complete and kept (and ``b`` is a real batch)."""
        return b < self.steps and self.done[b] == self.groups_per_step

    def queued(self, first_batch: int, through_batch: int) -> int:
        """Groups of batches <= ``through_batch`` not running and not complete.

        ``first_batch`` is the first batch not yet trained: the batches before it hold no
        partial groups or holes, so only the later batches' counters are summed.
        """
        last = min(through_batch, self.steps - 1)
        return self.members.needed(first_batch, last) + sum(self.partial_in_batch[first_batch: last + 1])

    def in_flight(self, first_batch: int, through_batch: int) -> int:
        """Groups of batches ``first_batch..through_batch`` started and not complete (those
        waiting as partial prefixes too): what may still be filtered."""
        last, m = min(through_batch, self.steps - 1), self.members
        return sum(m.alive(b) - self.done[b] for b in range(first_batch, last + 1))

    def partial_head(self) -> int | None:
        """The lowest partial group waiting to be resumed (stale heap entries dropped)."""
        heap, seq = self.partial_heap, self.partial_seq
        while heap:
            gid, n = heap[0]
            if seq.get(gid) == n:
                return gid
            heapq.heappop(heap)
        return None

    def fresh_head(self) -> tuple[int, int] | None:
        """(group, batch) of the fresh group that starts next, if any batch needs one."""
        m, gid = self.members, self.next_fresh
        if gid in m.reserved:
            return gid, m.reserved[gid]
        b = m.peek()
        return None if b is None else (m.next_unbound, b)

    def head(self) -> int | None:
        """The group that starts next (partial prefixes first), if any is queued."""
        gid = self.partial_head()
        if gid is not None:
            return gid
        fresh = self.fresh_head()
        return None if fresh is None else fresh[0]

    def has_work(self) -> bool:
        """Some group (partial or fresh) is still waiting to start."""
        return bool(self.partial_seq) or bool(self.members.reserved) or self.members.peek() is not None

    def requeue(self, gid: int, batch: int, left: int) -> None:
        """An interrupted group waits again, ``left`` responses to go, ahead of fresh ones."""
        self.partial_left[gid] = left
        self.partial_in_batch[batch] += 1
        self.seq += 1
        self.partial_seq[gid] = self.seq
        heapq.heappush(self.partial_heap, (gid, self.seq))
        self.members.generates(gid, batch, False)
