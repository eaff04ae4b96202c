"""The group queue: which prompt groups are waiting to start, which batch each joins, and
per-batch progress.

Kept apart from ``ClusterState`` because it is the one place that knows the order groups
start in, the rule every policy shares: partial groups (prefixes a reclaimed replica
handed back) first, lowest group id first, then fresh groups in group-id order.  Every
question a policy asks of it is O(1) or O(log n), so admission stays cheap per event:

* fresh groups are a counter, not a list: ``next_fresh`` is the lowest not started,
  ``ahead`` holds fresh ids already committed beyond it (a decision may assign a later
  fresh group before an earlier one while its actions are being committed);
* partial groups wait in ``partial_heap``, a heap of ``(group, seq)`` with lazy deletion:
  an entry is valid while ``partial_seq[group] == seq``, so resuming a group is a dict
  delete and re-queueing it again never leaves a stale entry that looks valid;
* per-batch counters (``started``, ``last_start``, ``done``, ``partial_in_batch``) answer
  "is batch b ready" and "how much is queued up to batch b" without scanning groups.

**Which batch a fresh group joins** (``peek`` / ``bind``).  Fresh ids are bound to batches
in id order, each to the lowest batch that still needs a group.  Without dynamic sampling
that is ``gid // groups_per_step``, as it always was.  With it (``algorithm.filter_groups``,
DAPO), a completed group whose rewards are all equal is *filtered* (``filtered_one``): it
leaves its batch, which then owes one more group, a *hole*; the next fresh id fills the
lowest hole before the frontier moves on.  So a step still trains exactly
``groups_per_step`` groups, every filtered group is replaced exactly once, and prompts
stay a function of the group id (the runtime creates groups in id order): a replacement is
simply the data stream's next prompt, as veRL's next generation batch is.

Replacement on demand, not over-provisioning: a filtered group's replacement is queued the
moment it is filtered, ahead of every fresh group of a later batch (holes are filled
first), so it starts as soon as a slot frees.  Admitting ``batch / keep_rate`` groups up
front instead would leave kept groups over when the rate was underestimated, groups that
belong to no step; on demand, every group that completes is trained or filtered, and the
extra rollout a batch needs is what the predictions scale by the measured keep rate
(``ClusterState.groups_to_generate``, ``policy/predict.py``).  A replacement is bound to
its batch before it starts, so the staleness rule (``core.staleness.may_start``) admits it
exactly as any group of that batch.  ``max_gen_batches`` caps the groups generated for one
batch (veRL's ``max_num_gen_batches``): a batch that would need more stops the run
(``GenerationCapError``, raised by the state).

Binding happens when the plan takes a group (``bind``) or, for a group committed out of
order, when it is committed (``take`` binds every id up to it, in id order); a fresh id
bound and not yet started is ``reserved`` (only within one decision).

``ClusterState`` changes it (assignments, completions, interruptions); policies only read
it through the state.
"""

from __future__ import annotations

import heapq

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
        self.cap, self.keep_rate, self.option = cap, keep_rate, option
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
        self.cap_groups = spec.max_gen_batches * spec.groups_per_step  # 0: no cap
        self.next_fresh = 0  # the lowest fresh group not started
        self.ahead: set[int] = set()  # fresh groups started beyond next_fresh
        self.next_unbound = 0  # the lowest fresh group not bound to a batch
        self.reserved: dict[int, int] = {}  # fresh group bound, not started -> its batch
        self.partial_heap: list[tuple[int, int]] = []  # (group, seq), lazily deleted
        self.partial_seq: dict[int, int] = {}  # partial group -> its valid heap seq
        self.seq = 0
        self.partial_left: dict[int, int] = {}  # group -> responses left (partial or resumed)
        self.partial_in_batch = [0] * spec.steps  # partial groups waiting, per batch
        self.started = [0] * spec.steps  # fresh groups started, per batch
        self.last_start = [0.0] * spec.steps  # when a batch's last group started
        self.done = [0] * spec.steps  # groups complete and kept, per batch
        self.kept: dict[int, list[int]] = {}  # batch -> its kept complete groups, untrained
        self.bound = [0] * spec.steps  # groups bound per batch (generated, filtered ones included)
        self.filtered = [0] * spec.steps  # groups filtered per batch
        self.frontier = 0  # the lowest batch never fully bound
        # heap: batches below the frontier owed a group, one entry each (a handful at most:
        # a hole lasts from a group's filtering to its replacement's binding)
        self.holes: list[int] = []

    # -- binding fresh groups to batches ------------------------------------------------
    def alive(self, b: int) -> int:
        """Groups of batch ``b`` bound and not filtered (started, reserved, complete)."""
        return self.bound[b] - self.filtered[b]

    def peek(self) -> int | None:
        """The batch the next fresh group would join (None: no batch needs one)."""
        if self.holes:
            return self.holes[0]
        return self.frontier if self.frontier < self.steps else None

    def bind(self) -> tuple[int, int]:
        """Bind the next fresh group to the batch ``peek`` names: (group, batch), reserved."""
        b = self.peek()
        if b is None:
            raise ValueError(f"group {self.next_unbound} cannot start: every batch has its groups")
        if self.holes:
            heapq.heappop(self.holes)
        self.bound[b] += 1
        if b == self.frontier and self.alive(b) >= self.groups_per_step:
            self.frontier += 1
        gid = self.next_unbound
        self.next_unbound += 1
        self.reserved[gid] = b
        return gid, b

    def bindable(self) -> int:
        """Fresh groups the batches still need (holes, then the frontier's batches)."""
        front = 0
        if self.frontier < self.steps:
            front = (self.steps - self.frontier) * self.groups_per_step - self.alive(self.frontier)
        return len(self.holes) + front

    def take(self, gid: int) -> int:
        """Fresh group ``gid`` is starting: its batch (bound now, with every unbound id below
        it, in id order, if the plan did not bind it)."""
        if gid in self.reserved:
            return self.reserved.pop(gid)
        if gid < self.next_unbound or gid - self.next_unbound >= self.bindable():
            raise ValueError(f"group {gid} cannot start: not queued (next fresh group is {self.next_fresh})")
        while self.next_unbound <= gid:
            self.bind()
        return self.reserved.pop(gid)

    def fully_bound(self, b: int) -> bool:
        """Batch ``b`` needs no more fresh groups (its last one has been bound)."""
        return b < self.frontier and b not in self.holes

    # -- outcomes ---------------------------------------------------------------------------
    def kept_one(self, gid: int, b: int) -> None:
        self.done[b] += 1
        self.kept.setdefault(b, []).append(gid)

    def filtered_one(self, b: int) -> bool:
        """A group of batch ``b`` was filtered: the batch owes one more.  False when the cap
        forbids it (the state stops the run)."""
        self.filtered[b] += 1
        if self.cap_groups and self.bound[b] >= self.cap_groups:
            return False
        if b < self.frontier:
            heapq.heappush(self.holes, b)
        return True

    def batch_groups(self, b: int) -> tuple[int, ...]:
        """Batch ``b``'s kept groups, in group-id order (what a step trains)."""
        return tuple(sorted(self.kept.get(b, ())))

    # -- queries ------------------------------------------------------------------------------
    def batch_ready(self, b: int) -> bool:
        """Every group of batch ``b`` is complete and kept (and ``b`` is a real batch)."""
        return b < self.steps and self.done[b] == self.groups_per_step

    def queued(self, first_batch: int, through_batch: int) -> int:
        """Groups of batches <= ``through_batch`` not running and not complete.

        ``first_batch`` is the first batch not yet trained: the batches before it hold no
        partial groups or holes, so only the later batches' counters are summed.
        """
        last = min(through_batch, self.steps - 1)
        fresh = sum(1 for b in self.holes if b <= last)
        if last >= self.frontier:
            fresh += (last - self.frontier + 1) * self.groups_per_step - self.alive(self.frontier)
        if self.reserved:
            fresh += sum(1 for b in self.reserved.values() if b <= last)
        return fresh + sum(self.partial_in_batch[first_batch: last + 1])

    def in_flight(self, first_batch: int, through_batch: int) -> int:
        """Groups of batches ``first_batch..through_batch`` started (or resumable) and not
        complete: what may still be filtered."""
        last = min(through_batch, self.steps - 1)
        return sum(self.alive(b) - self.done[b] for b in range(first_batch, last + 1))

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
        gid = self.next_fresh
        if gid in self.reserved:
            return gid, self.reserved[gid]
        b = self.peek()
        return None if b is None else (self.next_unbound, b)

    def head(self) -> int | None:
        """The group that starts next (partial prefixes first), if any is queued."""
        gid = self.partial_head()
        if gid is not None:
            return gid
        fresh = self.fresh_head()
        return None if fresh is None else fresh[0]

    def has_work(self) -> bool:
        """Some group (partial or fresh) is still waiting to start."""
        return bool(self.partial_seq) or bool(self.reserved) or self.peek() is not None

    def requeue(self, gid: int, batch: int, left: int) -> None:
        """An interrupted group waits again, ``left`` responses to go, ahead of fresh ones."""
        self.partial_left[gid] = left
        self.partial_in_batch[batch] += 1
        self.seq += 1
        self.partial_seq[gid] = self.seq
        heapq.heappush(self.partial_heap, (gid, self.seq))
