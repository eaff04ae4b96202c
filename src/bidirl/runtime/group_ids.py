"""The controller's group ids (this session's) and the store's (the run's, across resumes).

A resumed run starts a fresh controller whose group ids count from 0, so its scheduling
state needs no serialising (``runtime/session.py``).  The store, the ledger and the data
cursor count the run's groups.  ``GroupIds`` maps the two:

* the checkpoint's groups (created, not trained: complete, partial or in flight) are the
  controller's first ids, in the order of their step, then their id;
* every later id is a new group, ``first_new`` on (the checkpoint's next group id).

Without dynamic sampling this is the offset it always was, ``checkpoint step x
prompts_per_step``: the checkpoint's groups are exactly the ids from there up.  With it
(``algorithm.filter_groups``) a step's groups are not a run of ids (replacements of
filtered groups come later in the data stream), so the checkpoint's groups are listed.
Their step order keeps the staleness bound: the controller binds ids to steps in id order,
each to the lowest step that still needs a group (``controller/queue.py``), so a group
listed here is bound to its old step or an earlier one, never a later one, and the gap
from its oldest token only shrinks (it cannot turn negative: its tokens are no newer than
the checkpoint's version).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupIds:
    """``global_id(local)`` / ``local_id(global)``: see the module doc."""

    restored: tuple[int, ...] = ()  # local 0 .. k-1: the checkpoint's groups, by (step, id)
    first_new: int = 0  # the global id of local k, the first group this session creates
    _local: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_local", {g: i for i, g in enumerate(self.restored)})

    @classmethod
    def resumed(cls, batches: dict[int, int | None], first_new: int, prompts_per_step: int) -> GroupIds:
        """From the checkpoint's groups (``global id -> step``; None: a checkpoint written
        before steps were kept, when a group's step was its id // prompts_per_step) and
        the next id it would have created."""
        def step(g: int) -> int:
            b = batches[g]
            return g // prompts_per_step if b is None else b

        return cls(tuple(sorted(batches, key=lambda g: (step(g), g))), first_new)

    def global_id(self, local: int) -> int:
        k = len(self.restored)
        return self.restored[local] if local < k else self.first_new + local - k

    def local_id(self, g: int) -> int:
        if g >= self.first_new:
            return g - self.first_new + len(self.restored)
        return self._local[g]
