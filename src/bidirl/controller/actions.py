"""Actions: what the controller asks a runtime to do.

Actions are imperative and coarse (groups, steps, chunks, devices), never tokens, so that
the simulator and the Ray runtime can carry out the same decisions.  A runtime answers
each action later with events (``events.py``); it never replies synchronously.

Units.  Devices that host one role together form a *unit*: unit ``r < n_replicas`` is
primary rollout replica ``r`` (``rollout_tp`` rollout-pool devices); units from
``n_replicas`` on are groups of ``rollout_tp`` train-pool devices that can host a
borrowed rollout replica.  ``ClusterSpec.unit_devices`` maps a unit to its devices.
A lent rollout unit hosts an auxiliary trainer whose executor id is the unit id.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.core.ledger import Role

PRIMARY = "primary"
Executor = int | str  # PRIMARY or the unit id of an auxiliary trainer


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """A micro-batch of the training batch: ``samples`` sequences of ``tokens`` in all.

    ``seq_len`` is the attention-weighted length sum(L^2) / sum(L), so that
    ``tokens * seq_len`` is the attention work of the micro-batch.
    """

    tokens: int
    seq_len: float
    samples: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Micro-batches (indices into ``StartTrainStep.micro_batches``) for one executor."""

    executor: Executor
    micro_batches: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AssignGroups:
    """Start (or resume, for partial groups) these prompt groups on ``replica``."""

    replica: int
    group_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartTrainStep:
    """Train batch ``step`` (its groups in group-id order) and produce version ``step + 1``.

    ``chunks`` are in merge order: the primary sums the chunks' gradients in this order,
    so the update does not depend on which executor finished first.
    """

    step: int
    group_ids: tuple[int, ...]
    micro_batches: tuple[MicroBatch, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True, slots=True)
class SyncWeights:
    """Push ``version`` from the primary trainer to every rollout replica."""

    version: int


@dataclass(frozen=True, slots=True)
class Lend:
    """Bring up ``role`` (the other pool's stage) on ``unit``.

    ``colocated`` marks the synchronous baseline's phase switch (offload one stage,
    onload the other), which costs the colocated switch time instead of C_in/C_out and
    whose auxiliary trainers are plain data-parallel ranks (no C_grad).
    """

    unit: int
    role: Role
    colocated: bool = False


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Release the borrowed role on ``unit``; a rollout replica hands back its groups."""

    unit: int


@dataclass(frozen=True, slots=True)
class JoinStep:
    """Auxiliary trainer ``unit`` (up, with the step's weights) joins ``step`` in progress.

    It takes the primary's micro-batches that no rank has started yet, from the tail, one
    at a time as it becomes free, while the primary ranks keep taking theirs from the
    head (``policy.split.steal_schedule``): the two meet, and the step ends about when
    the work of both is done.  Each micro-batch is still merged where the plan put it,
    so the update is the same bit for bit.  When there is nothing left to take, the
    runtime answers ``ChunkComputed`` at once.
    """

    unit: int
    step: int


Action = AssignGroups | StartTrainStep | SyncWeights | Lend | Reclaim | JoinStep
