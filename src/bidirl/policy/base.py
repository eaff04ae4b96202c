"""What a policy is, the registry of policies by name, and helpers shared by all of them.

A policy is a pure object with one method, ``decide(state, event)``, a generator of
actions.  The controller commits each action to the state before the generator resumes,
so a policy always reads the state as it will be after its earlier actions.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Sequence

from bidirl.controller.actions import PRIMARY, Action, Chunk, MicroBatch, Reclaim, StartTrainStep
from bidirl.controller.events import Event
from bidirl.controller.state import ClusterState, UnitStatus
from bidirl.policy.batching import pack_micro_batches
from bidirl.policy.split import AuxExecutor, plan_chunks

_REGISTRY: dict[str, type[Policy]] = {}

# The policy modules, in the order of the paper's comparison table.  Importing one
# registers its policy; the names themselves live only in the ``@register`` decorators.
_MODULES = ("sync", "one_step_off", "asynchronous", "roll_borrow", "train_borrow",
            "bidirl_opportunistic", "bidirl")


class Policy:
    """Base class: subclasses set ``name`` (via ``@register``) and implement ``decide``.

    ``lends_train_devices`` / ``lends_rollout_devices`` say which pool's devices the
    policy may lend to the other role; the runtime prewarms those roles (one warm start
    per lendable device) and tests use them instead of lists of names.

    ``max_staleness`` is the most version gap the policy keeps whatever bound it is given
    (``None``: the bound itself).  Reproducible mode generates batch ``b`` at version
    ``b - staleness``, so the train config refuses a bound above it there.
    """

    name = "base"
    lends_train_devices = False
    lends_rollout_devices = False
    max_staleness: int | None = None

    def decide(self, s: ClusterState, event: Event) -> Iterator[Action]:
        raise NotImplementedError


def register(name: str):
    """Class decorator: make a policy constructible by name (``make_policy``)."""

    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def policy_class(name: str) -> type[Policy]:
    """The registered class for ``name`` (its lending flags without building one)."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; allowed: {', '.join(policy_names())}") \
            from None


def make_policy(name: str) -> Policy:
    return policy_class(name)()


def policy_max_staleness(name: str) -> int | None:
    """``Policy.max_staleness`` of the policy called ``name``."""
    return policy_class(name).max_staleness


def policy_names() -> list[str]:
    """Registered names, in the order of the paper's comparison table (``_MODULES``)."""
    _load_all()

    def rank(n: str) -> tuple[int, str]:
        mod = _REGISTRY[n].__module__.rsplit(".", 1)[-1]
        return (_MODULES.index(mod) if mod in _MODULES else len(_MODULES), n)

    return sorted(_REGISTRY, key=rank)


def _load_all() -> None:
    for m in _MODULES:
        importlib.import_module(f"bidirl.policy.{m}")


AWAY = (UnitStatus.LENDING, UnitStatus.LENT)  # a unit lent, or on its way to its borrowed role


def reclaim_away(s: ClusterState, units: Iterable[int]) -> Iterator[Reclaim]:
    """Reclaim each of ``units`` that is away from its own role, in the given order."""
    for u in units:
        if s.units.status[u] in AWAY:
            yield Reclaim(u)


def batch_micro_batches(s: ClusterState) -> list[MicroBatch]:
    """Micro-batches of batch ``s.next_step``: its (kept) groups in id order, packed by tokens
    (and capped in samples where the spec says so)."""
    spec = s.spec
    return pack_micro_batches((s.lengths[g] for g in s.batch_groups(s.next_step)), spec.prompt_tokens,
                              spec.micro_batch_tokens, spec.micro_batch_samples)


def micro_means(s: ClusterState, mbs: Sequence[MicroBatch]) -> tuple[float, float]:
    """Predicted mean micro-batch time on a primary rank and on an auxiliary trainer.

    The models are linear in (1, tokens, tokens * seq_len), so the mean time is the
    time of the mean features: O(micro-batches) sums, one prediction each.
    """
    if not mbs:
        return 0.0, 0.0
    n = len(mbs)
    feats = (1.0, sum(mb.tokens for mb in mbs) / n, sum(mb.tokens * mb.seq_len for mb in mbs) / n)
    return s.est.train.micro.predict(feats), s.est.aux.micro.predict(feats)


def micro_times(s: ClusterState, mbs: Sequence[MicroBatch]) -> tuple[list[float], list[float]]:
    """Predicted time of each micro-batch on a primary rank and on an auxiliary trainer."""
    return [s.est.micro_s(mb) for mb in mbs], [s.est.micro_s(mb, aux=True) for mb in mbs]


def primary_ranks(step: StartTrainStep, dp: int) -> list[list[int]]:
    """The micro-batch indices of the primary's chunk, dealt round-robin to its ``dp`` ranks
    (how both runtimes deal them, and which rank merges each)."""
    own = [i for c in step.chunks if c.executor == PRIMARY for i in c.micro_batches]
    return [own[r::dp] for r in range(dp)]


def build_step(s: ClusterState, mbs: Sequence[MicroBatch], aux: Sequence[AuxExecutor]) -> StartTrainStep:
    """The training step for batch ``s.next_step``, its micro-batches split by ``plan_chunks``.

    The primary keeps the first micro-batches, the auxiliaries take the rest in unit
    order: chunk order = micro-batch order = merge order.
    """
    spec, b = s.spec, s.next_step
    gids = s.batch_groups(b)
    p_s, a_s = micro_means(s, mbs)
    plan = plan_chunks(len(mbs), p_s, spec.train_dp, aux, a_s)
    chunks = [Chunk(PRIMARY, tuple(range(plan.primary)))]
    start = plan.primary
    for a, n in zip(aux, plan.aux):
        if n:
            chunks.append(Chunk(a.unit, tuple(range(start, start + n))))
            start += n
    return StartTrainStep(b, gids, tuple(mbs), tuple(chunks))
