"""The staleness rule: a version gap counted from the oldest token.

Policy versions count optimizer steps: version 0 is the initial policy; the update that
trains batch ``b`` produces version ``b + 1``.  A sample whose tokens were produced by
versions ``v_first..v_last`` may be trained in batch ``b`` only if ``b - v_first <= s``.

Because batch ``b`` is fixed by the group's position in the data order (see
``batch_of``), the rule can be enforced *before* any token is generated: a group may
start on a rollout replica holding version ``v`` only if ``b - v <= s``.  Every later
token carries a version ``>= v``, so the gap at training time can only be smaller.
Nothing is generated only to be thrown away (AReaL's capacity rule does the same).
"""

from __future__ import annotations


class StalenessError(ValueError):
    """A sample would be trained with a version gap above the bound."""


def batch_of(group_id: int, groups_per_step: int) -> int:
    """The training batch a prompt group belongs to (fixed by data order, not timing)."""
    if groups_per_step <= 0:
        raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
    return group_id // groups_per_step


def may_start(batch: int, rollout_version: int, bound: int, exact: bool = False) -> bool:
    """Admission: can a group of ``batch`` start on a replica holding ``rollout_version``?

    ``exact`` (reproducible mode): only at version ``generation_version(batch, bound)``.
    """
    if exact:
        return rollout_version == generation_version(batch, bound)
    return batch - rollout_version <= bound


def generation_version(batch: int, bound: int) -> int:
    """Reproducible mode: the one version batch ``batch`` is generated at, ``max(0, b - s)``."""
    return max(0, batch - bound)


def staleness_at_training(batch: int, v_first: int) -> int:
    """The version gap of a sample when batch ``batch`` is trained."""
    return batch - v_first


def check_trainable(batch: int, v_first: int, bound: int, what: str = "sample") -> int:
    """Return the gap, or raise ``StalenessError`` naming the offending sample."""
    gap = staleness_at_training(batch, v_first)
    if gap > bound:
        raise StalenessError(
            f"{what}: oldest token from version {v_first}, trained in batch {batch}: "
            f"gap {gap} exceeds staleness bound {bound}"
        )
    if gap < 0:
        raise StalenessError(
            f"{what}: token version {v_first} is newer than the policy being trained "
            f"(batch {batch}); versions must only grow"
        )
    return gap
