"""Each unit's hosting state machine, as the runtime (not the controller) sees it::

    HOME --begin_lend--> LENDING --lent--> LENT --begin_reclaim--> RECLAIMING --reclaimed--> HOME

The controller keeps its own, optimistic copy (``ClusterState.units.status``, changed
when it *asks*); this one changes when the runtime *does*.  A reclaim that arrives while
the lend's ``C_in`` is still under way waits for it: ``lent`` then says to start the
reclaim.
"""

from __future__ import annotations

from collections import Counter

from bidirl.controller.units import UnitStatus
from bidirl.core.ledger import Role, switch_kind

HOME, LENDING, LENT, RECLAIMING = (UnitStatus.HOME, UnitStatus.LENDING, UnitStatus.LENT,
                                   UnitStatus.RECLAIMING)


class HostingError(RuntimeError):
    """A lend or reclaim the unit's state does not allow."""


class Hosting:
    def __init__(self, n_replicas: int, n_units: int) -> None:
        self.n_replicas = n_replicas
        self.status = [HOME] * n_units
        self.role: list[Role | None] = [None] * n_units  # the borrowed role, while away
        self.colocated: set[int] = set()
        self._reclaim_waits: set[int] = set()
        self.lends: Counter = Counter({"roll_on_train": 0, "train_on_roll": 0, "colocated": 0})

    # -- queries -------------------------------------------------------------------
    def native(self, u: int) -> Role:
        return Role.ROLLOUT if u < self.n_replicas else Role.TRAIN

    def current_role(self, u: int) -> Role:
        """The role a unit works in now: its borrowed one while away, else its native one."""
        return self.role[u] if self.status[u] is not HOME else self.native(u)

    def serves_rollout(self, u: int) -> bool:
        """Home replicas and lent train units hosting a replica (not on their way out)."""
        if u < self.n_replicas:
            return self.status[u] is HOME
        return self.status[u] is LENT and self.role[u] is Role.ROLLOUT

    def kind(self, u: int) -> str:
        return switch_kind(self.role[u], u in self.colocated)

    # -- transitions ---------------------------------------------------------------
    def begin_lend(self, u: int, role: Role, colocated: bool = False) -> str:
        if self.status[u] is not HOME:
            raise HostingError(f"unit {u} is {self.status[u].value}; cannot lend it")
        self.status[u], self.role[u] = LENDING, role
        if colocated:
            self.colocated.add(u)
        kind = switch_kind(role, colocated)
        self.lends[kind] += 1
        return kind

    def lent(self, u: int) -> bool:
        """C_in is done; returns True if a reclaim was waiting for it (start it now)."""
        if self.status[u] is not LENDING:
            raise HostingError(f"unit {u} is {self.status[u].value}; it was not being lent")
        if u in self._reclaim_waits:
            self._reclaim_waits.discard(u)
            self.status[u] = RECLAIMING
            return True
        self.status[u] = LENT
        return False

    def begin_reclaim(self, u: int) -> bool:
        """True: release now.  False: the lend is still under way; ``lent`` will say when."""
        if self.status[u] is LENDING:
            self._reclaim_waits.add(u)
            return False
        if self.status[u] is not LENT:
            raise HostingError(f"unit {u} is {self.status[u].value}; cannot reclaim it")
        self.status[u] = RECLAIMING
        return True

    def reclaimed(self, u: int) -> Role:
        """C_out is done: the unit is home; returns the borrowed role it released."""
        if self.status[u] is not RECLAIMING:
            raise HostingError(f"unit {u} is {self.status[u].value}; it was not being reclaimed")
        role = self.role[u]
        self.status[u], self.role[u] = HOME, None
        self.colocated.discard(u)
        return role

    def lost(self, u: int) -> Role | None:
        """The unit's device died: whatever it was doing, it is home now (restarted)."""
        role = self.role[u] if self.status[u] is not HOME else None
        self.status[u], self.role[u] = HOME, None
        self.colocated.discard(u)
        self._reclaim_waits.discard(u)
        return role
