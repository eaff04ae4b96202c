"""Events: what happened in the cluster, reported by a runtime to the controller.

Events are facts in the past tense.  A runtime (simulated or real) reports each one once,
in the order it happened; the controller never asks a runtime what its state is.  All
times are the runtime's clock (``Runtime.now()``) at the moment the event is delivered.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.core.ledger import Role


@dataclass(frozen=True, slots=True)
class Started:
    """The runtime is up; the controller may issue its first actions."""


@dataclass(frozen=True, slots=True)
class GroupsCompleted:
    """Every response of these prompt groups finished on ``replica``.

    ``response_lengths[i]`` are the response lengths (tokens) of ``group_ids[i]`` in
    response order; the trainer's micro-batches are packed from them.

    ``filtered[i]`` (DAPO's dynamic sampling, ``algorithm.filter_groups``): the runtime
    judged ``group_ids[i]``'s rewards all equal, so it is recorded and not trained, and the
    controller queues another group for its batch.  The runtime judges because it holds
    the rewards (the real one scores them, ``algo/dynamic_sampling.py``; the simulator draws
    from its keep-rate model); empty: every group is kept.
    """

    replica: int
    group_ids: tuple[int, ...]
    response_lengths: tuple[tuple[int, ...], ...]
    filtered: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupsInterrupted:
    """A reclaimed replica handed these groups back as partial prefixes.

    The runtime keeps the prefixes (token ids, log-probs) keyed by group id and resumes
    them when the group is assigned again; the controller only needs counts:
    ``tokens_done[i]`` response tokens were generated so far and ``responses_left[i]``
    responses are unfinished.
    """

    replica: int
    group_ids: tuple[int, ...]
    tokens_done: tuple[int, ...]
    responses_left: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChunkComputed:
    """Auxiliary trainer ``unit`` computed its chunk of ``step``; its gradient is on the way.

    The unit has nothing left to do for the step: it may go home before the merge.
    """

    unit: int
    step: int


@dataclass(frozen=True, slots=True)
class TrainStepFinished:
    """The primary trainer merged every chunk of ``step`` and stepped: ``version`` exists."""

    step: int
    version: int
    seconds: float


@dataclass(frozen=True, slots=True)
class WeightsSynced:
    """Every rollout replica now holds ``version``.

    ``seconds``: from the sync's issue to the last replica's load, as the driver saw it;
    ``load_s``: where the runtime timed the load on the devices (the slowest replica's,
    without the wait for a decode step in progress or behind other calls), the weight-sync
    model's measurement when given (the simulator's ``seconds`` is the load itself);
    ``bytes_moved``: what crossed to each replica (a delta's changed tensors; None: the whole
    weights), the per-byte feature of that model.
    """

    version: int
    seconds: float
    load_s: float | None = None
    bytes_moved: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceLent:
    """Unit ``unit`` now hosts ``role`` (the other pool's stage); C_in took ``seconds``."""

    unit: int
    role: Role
    seconds: float


@dataclass(frozen=True, slots=True)
class DeviceReclaimed:
    """Unit ``unit`` is back in its own pool's role; C_out took ``seconds``."""

    unit: int
    role: Role  # the borrowed role that was released
    seconds: float


@dataclass(frozen=True, slots=True)
class StageMeasured:
    """A measured stage time, fed to the online-calibrated stage-time models.

    ``stage`` is one of ``decode``, ``prefill``, ``train_micro``, ``aux_micro``,
    ``train_sync``, ``weight_sync``, ``train_on_roll.c_grad``.  ``features`` match the
    stage model's linear features (sums of them when a runtime aggregates several
    measurements: the models are linear, so sums are exact).
    """

    stage: str
    features: tuple[float, ...]
    seconds: float


Event = (Started | GroupsCompleted | GroupsInterrupted | TrainStepFinished | WeightsSynced
         | DeviceLent | DeviceReclaimed | StageMeasured)
