"""Per-unit bookkeeping: what each unit is doing, as the controller believes it.

A unit is one rollout replica (ids ``0..n_replicas-1``) or one trainer unit (the ids
after).  Kept apart from ``ClusterState`` because these lists are what the placement
greedy (``ClusterState.plan_fill``) and every lending rule read per event, and they must
stay consistent with each other: a load change must reach the least-loaded heap, the set
of idle replicas and the total in the same step.  Only ``set_load`` and
``set_accepting`` change those, so that holds by construction (``plan_fill`` also moves
heap entries in place, ahead of the ``AssignGroups`` commits that make them true).

Unit status (the controller's optimistic copy of ``frame.hosting``, changed when an
action is committed, not when the runtime confirms it)::

    HOME --Lend--> LENDING --DeviceLent--> LENT --Reclaim--> RECLAIMING --DeviceReclaimed--> HOME

The least-loaded replica comes from ``heap``, a heap of ``(load, unit)`` with lazy
deletion: an entry is valid while the unit accepts groups and its load still agrees, so a
load change is one push, never a search.
"""

from __future__ import annotations

import heapq
from enum import StrEnum

from bidirl.controller.cluster import ClusterSpec
from bidirl.core.ledger import Pool


class UnitStatus(StrEnum):
    HOME = "home"
    LENDING = "lending"
    LENT = "lent"
    RECLAIMING = "reclaiming"


class Units:
    """Status, version held, load and running groups of every unit (see module docstring)."""

    def __init__(self, spec: ClusterSpec) -> None:
        n, r = spec.n_units, spec.n_replicas
        self.spec = spec
        self.n_replicas = r
        self.status = [UnitStatus.HOME] * n
        self.colocated = [False] * n  # lent with its home role kept resident
        self.version = [0] * n  # the policy version each unit holds (state.version: newest)
        self.load = [0] * n  # responses running
        self.accepting = [u < r for u in range(n)]  # may be given groups
        self.groups: list[set[int]] = [set() for _ in range(n)]  # groups running on it
        self.draining: set[int] = set()  # policy wants these emptied (no new groups)
        # Replicas coming home from a borrowed role (C_out), and trainer units on their way
        # in as rollout replicas (C_in): filling leaves them their share.
        self.returning: set[int] = set()
        self.arriving: set[int] = set()
        self.heap = [(0, u) for u in range(r)]  # (load, unit), lazily deleted
        self.idle_replicas: set[int] = set(range(r))  # home, empty replicas
        self.total_load = 0  # responses running on all units
        self.away = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}  # units not home, per owner pool

    # -- queries -------------------------------------------------------------------
    def trainer_home(self) -> bool:
        """No trainer unit is lent (or on its way out or back)."""
        return self.away[Pool.TRAIN] == 0

    def home_replicas(self) -> int:
        """Rollout replicas at home (lent ones excluded, until they are back)."""
        return self.n_replicas - self.away[Pool.ROLLOUT]

    # -- load and acceptance ---------------------------------------------------------
    def unload(self, unit: int, gid: int, responses: int) -> None:
        """Group ``gid`` left ``unit`` (done or interrupted), ``responses`` with it."""
        self.groups[unit].discard(gid)
        self.set_load(unit, max(0, self.load[unit] - responses))

    def set_load(self, unit: int, load: int) -> None:
        self.total_load += load - self.load[unit]
        self.load[unit] = load
        if self.accepting[unit]:
            heapq.heappush(self.heap, (load, unit))
        if unit < self.n_replicas:
            if load == 0 and self.status[unit] is UnitStatus.HOME:
                self.idle_replicas.add(unit)
            else:
                self.idle_replicas.discard(unit)

    def set_accepting(self, unit: int, on: bool) -> None:
        self.accepting[unit] = on
        if on:
            heapq.heappush(self.heap, (self.load[unit], unit))
        if unit < self.n_replicas:
            if on and self.load[unit] == 0:
                self.idle_replicas.add(unit)
            elif not on:
                self.idle_replicas.discard(unit)

    # -- status transitions (the diagram above) --------------------------------------
    def begin_lend(self, u: int, colocated: bool, hosts_rollout: bool = False) -> None:
        """``Lend`` committed: HOME -> LENDING; it takes no new groups.  A trainer unit that
        will host a rollout replica (``hosts_rollout``, not a colocated phase switch) is
        ``arriving`` until it is up."""
        if self.status[u] is not UnitStatus.HOME:
            raise ValueError(f"unit {u} is {self.status[u].value}; only a home unit can be lent")
        if u < self.n_replicas and self.load[u]:
            raise ValueError(f"replica {u} still runs {self.load[u]} responses; drain it first")
        self.status[u] = UnitStatus.LENDING
        self.away[self.spec.unit_pool(u)] += 1
        self.colocated[u] = colocated
        self.draining.discard(u)
        self.set_accepting(u, False)
        if hosts_rollout and u >= self.n_replicas and not colocated:
            self.arriving.add(u)

    def arrived(self, u: int) -> None:
        """``DeviceLent``: the unit is up in its borrowed role."""
        self.arriving.discard(u)

    def begin_reclaim(self, u: int) -> None:
        """``Reclaim`` committed: LENDING/LENT -> RECLAIMING; a replica starts returning."""
        if self.status[u] not in (UnitStatus.LENDING, UnitStatus.LENT):
            raise ValueError(f"unit {u} is {self.status[u].value}; cannot reclaim")
        self.status[u] = UnitStatus.RECLAIMING
        self.arriving.discard(u)
        if u < self.n_replicas and not self.colocated[u]:
            self.returning.add(u)
        self.set_accepting(u, False)

    def back_home(self, u: int, version: int) -> None:
        """``DeviceReclaimed``: RECLAIMING -> HOME; a replica holds ``version`` and accepts."""
        self.status[u] = UnitStatus.HOME
        self.returning.discard(u)
        self.arriving.discard(u)
        self.away[self.spec.unit_pool(u)] -= 1
        self.colocated[u] = False
        if u < self.n_replicas:
            self.version[u] = version
            self.set_accepting(u, True)
