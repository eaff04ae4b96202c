"""What a policy is, the registry of policies by name, and helpers shared by all of them.

A policy is a pure object with one method, ``decide(state, event)``, a generator of
actions.  The controller commits each action to the state before the generator resumes,
so a policy always reads the state as it will be after its earlier actions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from bidirl.controller.actions import PRIMARY, Action, Chunk, MicroBatch, StartTrainStep
from bidirl.controller.events import Event
from bidirl.controller.state import ClusterState
from bidirl.policy.batching import pack_micro_batches
from bidirl.policy.split import AuxExecutor, plan_chunks

_REGISTRY: dict[str, Callable[[], Policy]] = {}


class Policy:
    """Base class: subclasses set ``name`` and implement ``decide``."""

    name = "base"

    def decide(self, s: ClusterState, event: Event) -> Iterator[Action]:
        raise NotImplementedError


def register(name: str):
    """Class decorator: make a policy constructible by name (``make_policy``)."""

    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def make_policy(name: str) -> Policy:
    _load_all()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; allowed: {', '.join(policy_names())}") \
            from None


ORDER = ("sync", "one-step-off", "async", "roll-borrow", "train-borrow",
         "bidirl-opportunistic", "bidirl")


def policy_names() -> list[str]:
    """Registered names, in the order of the paper's comparison table."""
    _load_all()
    return sorted(_REGISTRY, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def _load_all() -> None:
    # Importing the modules registers them; the order is the paper's table order.
    from bidirl.policy import (  # noqa: F401
        asynchronous,
        bidirl,
        bidirl_opportunistic,
        one_step_off,
        roll_borrow,
        sync,
        train_borrow,
    )


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def batch_micro_batches(s: ClusterState) -> list[MicroBatch]:
    """Micro-batches of batch ``s.next_step``: its groups in id order, packed by tokens."""
    spec, b = s.spec, s.next_step
    gids = range(b * spec.groups_per_step, (b + 1) * spec.groups_per_step)
    return pack_micro_batches((s.lengths[g] for g in gids), spec.prompt_tokens,
                              spec.micro_batch_tokens)


def micro_means(s: ClusterState, mbs: Sequence[MicroBatch]) -> tuple[float, float]:
    """Predicted mean micro-batch time on a primary rank and on an auxiliary trainer.

    The models are linear in (1, tokens, tokens * seq_len), so the mean time is the
    time of the mean features: O(micro-batches) sums, one prediction each.
    """
    if not mbs:
        return 0.0, 0.0
    n = len(mbs)
    tok = sum(mb.tokens for mb in mbs) / n
    att = sum(mb.tokens * mb.seq_len for mb in mbs) / n
    feats = (1.0, tok, att)
    return s.est.train.micro.predict(feats), s.est.aux.micro.predict(feats)


def build_step(s: ClusterState, mbs: Sequence[MicroBatch], aux: Sequence[AuxExecutor],
               ) -> StartTrainStep:
    """The training step for batch ``s.next_step``, its micro-batches split by ``plan_chunks``.

    The primary keeps the first micro-batches, the auxiliaries take the rest in unit
    order: chunk order = micro-batch order = merge order.
    """
    spec, b = s.spec, s.next_step
    gids = tuple(range(b * spec.groups_per_step, (b + 1) * spec.groups_per_step))
    p_s, a_s = micro_means(s, mbs)
    plan = plan_chunks(len(mbs), p_s, spec.train_dp, aux, a_s)
    chunks = [Chunk(PRIMARY, tuple(range(plan.primary)))]
    start = plan.primary
    for a, n in zip(aux, plan.aux):
        if n:
            chunks.append(Chunk(a.unit, tuple(range(start, start + n))))
            start += n
    return StartTrainStep(b, gids, tuple(mbs), tuple(chunks))
