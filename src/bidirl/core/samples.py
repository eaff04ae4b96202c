"""Prompt groups and their lifecycle.

A *prompt group* is one prompt with its ``n`` responses (GRPO normalises advantages
within a group, so the group is the unit of scheduling and of training).  Its lifecycle::

    QUEUED --start--> GENERATING --interrupt--> PARTIAL --resume--> GENERATING
                          |                                             |
                          +------------------complete-------------------+--> COMPLETE --train--> TRAINED
                          |                                             |
                          +------------------filter---------------------+--> FILTERED

``PARTIAL`` means some responses hold unfinished prefixes that were handed back (a
borrowed replica was reclaimed); they are resumed elsewhere and keep the versions of the
tokens already generated, so staleness still counts from the oldest token.

``FILTERED`` is DAPO's dynamic sampling (``algorithm.filter_groups``): the group completed
but its rewards are all equal (no advantage signal), so it is recorded and never trained;
another group takes its place in its batch (``controller/queue.py``).  Like ``TRAINED`` it
is an outcome: the ledger audit accounts for every group as trained once or filtered once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class GroupState(StrEnum):
    QUEUED = "queued"
    GENERATING = "generating"
    PARTIAL = "partial"
    COMPLETE = "complete"
    TRAINED = "trained"
    FILTERED = "filtered"


_ALLOWED = {
    GroupState.QUEUED: {GroupState.GENERATING},
    GroupState.GENERATING: {GroupState.PARTIAL, GroupState.COMPLETE, GroupState.FILTERED},
    GroupState.PARTIAL: {GroupState.GENERATING},
    GroupState.COMPLETE: {GroupState.TRAINED},
    GroupState.TRAINED: set(),
    GroupState.FILTERED: set(),
}


class LifecycleError(RuntimeError):
    """A group was moved along a transition its lifecycle does not allow."""


@dataclass(slots=True)
class PromptGroup:
    """Identity, position and provenance of one prompt group.

    ``v_first``/``v_last`` are the oldest and newest policy versions that produced any of
    the group's tokens (``None`` until the first token).  ``tokens_generated`` counts
    response tokens generated so far across all responses; it only grows, which is how
    the audit shows that a resumed response was not generated twice.
    """

    group_id: int
    batch: int
    n: int
    prompt_tokens: int = 0
    state: GroupState = GroupState.QUEUED
    v_first: int | None = None
    v_last: int | None = None
    tokens_generated: int = 0
    replica: int | None = None
    interruptions: int = 0
    history: list[tuple[float, GroupState]] = field(default_factory=list)

    def move(self, to: GroupState, t: float) -> None:
        if to not in _ALLOWED[self.state]:
            raise LifecycleError(f"group {self.group_id}: cannot go from {self.state.value} to {to.value}")
        self.state = to
        self.history.append((t, to))

    def note_tokens(self, count: int, version: int) -> None:
        """Record ``count`` new response tokens produced by policy ``version``."""
        if count < 0:
            raise ValueError("token count cannot be negative")
        if count == 0:
            return
        # A resumed prefix may continue on a replica that holds an older version than the
        # borrowed one that started it, so versions need not grow: keep both ends.
        self.v_first = version if self.v_first is None else min(self.v_first, version)
        self.v_last = version if self.v_last is None else max(self.v_last, version)
        self.tokens_generated += count
