"""Which batch each prompt group belongs to, and what each batch still needs.

Fresh groups are bound to batches in group-id order, each to the lowest batch that still
needs one (``peek`` / ``bind``).  Without dynamic sampling that is ``gid // groups_per_step``,
as it always was, and nothing below ever moves a group.

**Dynamic sampling** (DAPO's ``filter_groups``): a completed group whose rewards are all
equal is *filtered* (``filter``): it leaves its batch, which then owes one more group, a
*hole*, which the next fresh group fills before the frontier moves on.  A step therefore
trains exactly ``groups_per_step`` groups, every filtered group is replaced exactly once,
and prompts stay a function of the group id (the runtime creates groups in id order): a
replacement is the data stream's next prompt, as veRL's next generation batch is.

Replacement on demand, not over-provisioning: admitting ``batch / keep_rate`` groups up
front would leave kept groups over when the rate was underestimated, groups that belong to
no step (veRL throws them away); on demand, every group that completes is trained once or
filtered once.  What the extra rollout costs the schedule, the predictions scale by the
measured keep rate (``policy/predict.py:groups_to_generate``).

On demand, a batch would wait for its replacements one after another (each starts only
when the group it replaces is filtered).  So a batch that lost a group to filtering takes
the next kept completion of a later batch instead (``place_kept``): the completed group moves
down to it and takes over its queued replacement, or one of its groups still generating moves
up to the later batch in exchange (``ClusterState._may_move_up`` ranks them; tracked only
where groups are filtered, ``ClusterSpec.filter_groups``).  Moving down is always within the staleness
bound (the gap from the oldest token only shrinks, and stays >= 0 since the batch is not
trained yet); the group moving up is chosen only if the bound admits it there.  So a batch
is complete with the first kept groups among those generating for it and the next batches,
as DAPO's batch is, and no group is ever left over.

A fresh id bound and not yet started is ``reserved`` (only within one decision: the plan
binds as it takes, ``take`` binds every id up to one committed out of order).
``max_gen_batches`` caps the groups bound to one batch (veRL's ``max_num_gen_batches``,
``filter`` says when it is reached).
"""

from __future__ import annotations

import heapq

from bidirl.controller.cluster import ClusterSpec


class BatchMembers:
    """The binding of groups to batches (see the module doc); ``GroupQueue.members``."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.groups_per_step, self.steps = spec.groups_per_step, spec.steps
        self.cap = spec.max_gen_batches * spec.groups_per_step  # groups bound to one batch; 0: no cap
        self.next_unbound = 0  # the lowest fresh group not bound to a batch
        self.reserved: dict[int, int] = {}  # fresh group bound, not started -> its batch
        self.bound = [0] * spec.steps  # groups bound per batch (generated, filtered ones included)
        self.filtered = [0] * spec.steps  # groups filtered per batch
        self.frontier = 0  # the lowest batch never fully bound
        # heap: batches below the frontier owed a group, one entry each (a handful at most:
        # a hole lasts from a group's filtering to its replacement's binding)
        self.holes: list[int] = []
        self.kept: dict[int, list[int]] = {}  # batch -> its kept complete groups, untrained
        # batch -> its groups generating, for ``place_kept``; kept only where groups are
        # filtered (``ClusterSpec.filter_groups``): it costs every start and completion
        self.generating: dict[int, set[int]] | None = {} if spec.filter_groups else None

    def alive(self, b: int) -> int:
        """Groups of batch ``b`` bound and not filtered (started, reserved, complete)."""
        return self.bound[b] - self.filtered[b]

    # -- fresh groups ----------------------------------------------------------------------
    def peek(self) -> int | None:
        """The batch the next fresh group would join (None: no batch needs one)."""
        if self.holes:
            return self.holes[0]
        return self.frontier if self.frontier < self.steps else None

    def bind(self) -> tuple[int, int]:
        """Bind the next fresh group to the batch ``peek`` names: (group, batch), reserved.
        (Once per group a plan takes: written for speed.)"""
        holes, bound = self.holes, self.bound
        if holes:
            b = heapq.heappop(holes)
            bound[b] += 1
        else:
            b = self.frontier
            if b >= self.steps:
                raise ValueError(f"group {self.next_unbound} cannot start: every batch has its groups")
            bound[b] += 1
            if bound[b] - self.filtered[b] >= self.groups_per_step:
                self.frontier = b + 1
        gid = self.next_unbound
        self.next_unbound = gid + 1
        self.reserved[gid] = b
        return gid, b

    def bindable(self) -> int:
        """Fresh groups the batches still need (holes, then the frontier's batches)."""
        front = 0
        if self.frontier < self.steps:
            front = (self.steps - self.frontier) * self.groups_per_step - self.alive(self.frontier)
        return len(self.holes) + front

    def take(self, gid: int, next_fresh: int) -> int:
        """Fresh group ``gid`` is starting (generating): its batch (bound now, with every
        unbound id below it, in id order, if the plan did not bind it)."""
        b = self.reserved.pop(gid, None)
        if b is None:
            b = self._bind_through(gid, next_fresh)
        if self.generating is not None:
            self.generating.setdefault(b, set()).add(gid)
        return b

    def _bind_through(self, gid: int, next_fresh: int) -> int:
        if gid < self.next_unbound or gid - self.next_unbound >= self.bindable():
            raise ValueError(f"group {gid} cannot start: not queued (next fresh group is {next_fresh})")
        while self.next_unbound <= gid:
            self.bind()
        return self.reserved.pop(gid)

    def fully_bound(self, b: int) -> bool:
        """Batch ``b`` needs no more fresh groups (its last one has been bound)."""
        return b < self.frontier and b not in self.holes

    def needed(self, first_batch: int, last: int) -> int:
        """Fresh groups still to bind for batches ``first_batch..last`` (reserved ones too)."""
        fresh = sum(1 for b in self.holes if b <= last)
        if last >= self.frontier:
            fresh += (last - self.frontier + 1) * self.groups_per_step - self.alive(self.frontier)
        if self.reserved:
            fresh += sum(1 for b in self.reserved.values() if b <= last)
        return fresh

    # -- outcomes ---------------------------------------------------------------------------
    def generates(self, gid: int, b: int, yes: bool) -> None:
        """Group ``gid`` of batch ``b`` starts (or resumes) generating, or stops."""
        if self.generating is None:
            return
        if yes:
            self.generating.setdefault(b, set()).add(gid)
        else:
            self.generating.get(b, set()).discard(gid)

    def keep(self, gid: int, b: int) -> None:
        self.generates(gid, b, False)
        self.kept.setdefault(b, []).append(gid)

    def filter(self, gid: int, b: int) -> bool:
        """Group ``gid`` of batch ``b`` was filtered: the batch owes one more.  False when the
        cap forbids it (the state stops the run)."""
        self.generates(gid, b, False)
        self.filtered[b] += 1
        if self.cap and self.bound[b] >= self.cap:
            return False
        if b < self.frontier:
            heapq.heappush(self.holes, b)
        return True

    def place_kept(self, gid: int, b: int, first_batch: int, may_move_up) -> tuple[int, int | None]:
        """Kept group ``gid`` of batch ``b`` completed: the batch it is kept in, and the group
        that took its place in ``b`` (None: none moved).  See the module doc: the lowest batch
        from ``first_batch`` on that lost a group to filtering takes it, giving ``b`` its
        queued hole, or else the generating group ``may_move_up(group, b)`` ranks highest
        (a number; None: the staleness bound keeps it out of ``b``)."""
        for down in range(first_batch, min(b, self.steps)):
            if not self.filtered[down]:
                continue
            if down in self.holes:  # its replacement has not started: ``b`` takes over the hole
                self.holes.remove(down)
                heapq.heapify(self.holes)
                self._move(gid, b, down)
                if b < self.frontier:
                    heapq.heappush(self.holes, b)
                return down, None
            ranked = [(rank, r) for r in (self.generating or {}).get(down, ())
                      if (rank := may_move_up(r, b)) is not None]
            if ranked:
                running = max(ranked)[1]
                self.generates(running, down, False)
                self.generates(running, b, True)
                self._move(gid, b, down)
                self.bound[b] += 1  # the running group's place
                self.bound[down] -= 1
                return down, running
        self.keep(gid, b)
        return b, None

    def _move(self, gid: int, src: int, dst: int) -> None:
        """Kept group ``gid`` moves from batch ``src`` to ``dst``."""
        self.bound[src] -= 1
        self.bound[dst] += 1
        self.generates(gid, src, False)
        self.kept.setdefault(dst, []).append(gid)

    def batch_groups(self, b: int) -> tuple[int, ...]:
        """Batch ``b``'s kept groups, in group-id order (what a step trains)."""
        return tuple(sorted(self.kept.get(b, ())))
