"""Ledgers: who owns each device and what it hosts; what happened to each prompt group.

The *device ledger* makes borrowing a transaction: a device keeps its owner pool for
life, hosts exactly one role at a time, and every lend and reclaim is recorded with the
switch cost that was charged (simulated) or measured (real).  The *group ledger* is the
audit trail that proves every prompt group was trained exactly once and none was lost;
with DAPO's dynamic sampling a group may instead be *filtered* (all its rewards equal), an
outcome recorded like training: each group is trained once or filtered once, never both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from bidirl.core.samples import GroupState, LifecycleError, PromptGroup
from bidirl.core.staleness import check_trainable


class Pool(StrEnum):
    ROLLOUT = "rollout"
    TRAIN = "train"


class Role(StrEnum):
    """What a device hosts.  ``AUX_TRAIN`` is an auxiliary trainer on a rollout device."""

    ROLLOUT = "rollout"
    TRAIN = "train"
    AUX_TRAIN = "aux_train"
    NONE = "none"  # between roles while a switch is under way


NATIVE_ROLE = {Pool.ROLLOUT: Role.ROLLOUT, Pool.TRAIN: Role.TRAIN}
BORROWED_ROLE = {Pool.ROLLOUT: Role.AUX_TRAIN, Pool.TRAIN: Role.ROLLOUT}


class LedgerError(RuntimeError):
    """A lend or reclaim that breaks the ledger's rules."""


@dataclass(frozen=True, slots=True)
class Transaction:
    kind: str  # "lend" or "reclaim"
    device: int
    role: Role  # the borrowed role being brought up (lend) or released (reclaim)
    t: float
    cost_s: float


@dataclass(slots=True)
class DeviceRecord:
    device: int
    pool: Pool
    node: int
    role: Role

    @property
    def lent(self) -> bool:
        return self.role not in (NATIVE_ROLE[self.pool], Role.NONE)


@dataclass
class DeviceLedger:
    """Owner pool and hosted role of every device, and the lend/reclaim history."""

    devices: dict[int, DeviceRecord] = field(default_factory=dict)
    transactions: list[Transaction] = field(default_factory=list)

    @classmethod
    def build(cls, rollout: list[int], train: list[int], devices_per_node: int = 8):
        if set(rollout) & set(train):
            raise LedgerError(f"devices in both pools: {sorted(set(rollout) & set(train))}")
        ledger = cls()
        for pool, ids in ((Pool.ROLLOUT, rollout), (Pool.TRAIN, train)):
            for d in ids:
                ledger.devices[d] = DeviceRecord(d, pool, d // devices_per_node, NATIVE_ROLE[pool])
        return ledger

    def lent(self, pool: Pool) -> list[int]:
        return [d for d, r in self.devices.items() if r.pool == pool and r.lent]

    def lend(self, device: int, t: float, cost_s: float) -> Role:
        """Move ``device`` to the other pool's role.  Returns that role."""
        rec = self._get(device)
        if rec.role != NATIVE_ROLE[rec.pool]:
            raise LedgerError(f"device {device} ({rec.pool.value} pool) hosts {rec.role.value}; "
                              "only a device hosting its native role can be lent")
        rec.role = BORROWED_ROLE[rec.pool]
        self.transactions.append(Transaction("lend", device, rec.role, t, cost_s))
        return rec.role

    def reclaim(self, device: int, t: float, cost_s: float) -> None:
        rec = self._get(device)
        if not rec.lent:
            raise LedgerError(f"device {device} is not lent (hosts {rec.role.value})")
        self.transactions.append(Transaction("reclaim", device, rec.role, t, cost_s))
        rec.role = NATIVE_ROLE[rec.pool]

    def counts(self) -> dict[str, int]:
        lends = Counter(switch_kind(x.role) for x in self.transactions if x.kind == "lend")
        return {kind: lends[kind] for kind in ("roll_on_train", "train_on_roll")}

    def switch_time_s(self) -> float:
        return sum(x.cost_s for x in self.transactions)

    def _get(self, device: int) -> DeviceRecord:
        try:
            return self.devices[device]
        except KeyError:
            raise LedgerError(f"unknown device {device}") from None


@dataclass
class AuditReport:
    """What the audit found: ``groups_lost`` have no outcome, ``trained_twice`` were
    trained more than once, ``filtered_twice`` were filtered more than once or both
    filtered and trained."""

    groups_total: int
    groups_trained: int
    groups_lost: list[int]
    trained_twice: list[int]
    staleness_violations: list[str]
    max_staleness: int
    mean_staleness: float
    groups_filtered: int = 0
    filtered_twice: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.groups_lost or self.trained_twice or self.filtered_twice or self.staleness_violations)

    @property
    def keep_rate(self) -> float:
        """Trained over trained + filtered (1.0 when nothing was judged)."""
        judged = self.groups_trained + self.groups_filtered
        return self.groups_trained / judged if judged else 1.0


@dataclass
class GroupLedger:
    """Every prompt group the run created, and how many times each was trained."""

    groups: dict[int, PromptGroup] = field(default_factory=dict)
    trained_count: Counter = field(default_factory=Counter)
    staleness: dict[int, int] = field(default_factory=dict)
    filtered_count: Counter = field(default_factory=Counter)

    def add(self, group: PromptGroup) -> None:
        if group.group_id in self.groups:
            raise LedgerError(f"group {group.group_id} created twice")
        self.groups[group.group_id] = group

    def mark_trained(self, group_id: int, batch: int, bound: int, t: float) -> int:
        """Record that ``group_id`` went into the update of ``batch``; returns its gap."""
        g = self.groups[group_id]
        if g.state != GroupState.COMPLETE:
            raise LifecycleError(f"group {group_id} trained while {g.state.value}")
        if g.batch != batch:
            raise LedgerError(f"group {group_id} belongs to batch {g.batch}, not {batch}")
        gap = check_trainable(batch, g.v_first if g.v_first is not None else batch, bound,
                              what=f"group {group_id}")
        g.move(GroupState.TRAINED, t)
        self.trained_count[group_id] += 1
        self.staleness[group_id] = gap
        return gap

    def mark_filtered(self, group_id: int, t: float) -> None:
        """Record that ``group_id`` completed with all rewards equal and is not trained."""
        self.groups[group_id].move(GroupState.FILTERED, t)
        self.filtered_count[group_id] += 1

    def audit(self, bound: int, through_batch: int | None = None) -> AuditReport:
        """Check every group up to ``through_batch`` (all if None) was trained exactly once
        or filtered exactly once."""
        due = [g.group_id for g in self.groups.values()
               if through_batch is None or g.batch <= through_batch]
        return audit_trained(due, self.trained_count, self.staleness, bound, self.filtered_count)


def audit_trained(expected: Iterable[int], trained_count: Counter, staleness: dict[int, int],
                  bound: int, filtered_count: Counter | None = None) -> AuditReport:
    """The one ledger audit: each expected group trained exactly once (within ``bound``) or
    filtered exactly once (``filtered_count``, DAPO's dynamic sampling), never both.

    The controller's ``GroupLedger`` and a real run's ``trained_groups.jsonl`` (which spans
    resumes) are both checked here, so the two can never disagree on what "ok" means.
    """
    due = list(expected)
    filtered = filtered_count if filtered_count is not None else Counter()
    lost = sorted(g for g in due if trained_count[g] == 0 and filtered[g] == 0)
    twice = sorted(g for g, c in trained_count.items() if c > 1)
    filtered_twice = sorted(g for g, c in filtered.items() if c > 1 or (c and trained_count[g]))
    violations = [f"group {g}: gap {gap} > bound {bound}" for g, gap in staleness.items() if gap > bound]
    gaps = list(staleness.values())
    return AuditReport(
        groups_total=len(due),
        groups_trained=sum(1 for g in due if trained_count[g] >= 1),
        groups_lost=lost,
        trained_twice=twice,
        staleness_violations=violations,
        max_staleness=max(gaps, default=0),
        mean_staleness=(sum(gaps) / len(gaps)) if gaps else 0.0,
        groups_filtered=sum(1 for g in due if filtered[g] >= 1),
        filtered_twice=filtered_twice,
    )


def switch_kind(role: Role, colocated: bool = False) -> str:
    """The name of a lend direction, as stage models, metrics and results spell it.

    ``roll_on_train``: a train-pool unit hosts a rollout replica; ``train_on_roll``: a
    rollout unit hosts an auxiliary trainer; ``colocated``: the synchronous baseline's
    phase switch.  The only place the mapping is written.
    """
    if colocated:
        return "colocated"
    return "roll_on_train" if role is Role.ROLLOUT else "train_on_roll"
