"""``roll-borrow``: ``async`` + idle trainer units host extra rollout replicas.

Rollouter-on-TrainPool (veRL's dynamic resource scheduling is the one-direction peer).
When the trainer has nothing to do because its batch is not complete, its devices come
up as rollout replicas holding the newest weights (C_in) and take queued groups like any
replica (least-loaded first).  When the batch is complete the trainer reclaims them
(C_out); their unfinished responses go back as partial prefixes and are resumed by
primary replicas, so nothing is lost or generated twice.

``RollLending`` is the mechanism, shared with ``bidirl`` (guided) and
``bidirl-opportunistic`` (``guided=False``: lend whenever the trainer idles and there is
work).  Guided lending asks ``admission.roll_on_train`` once per idle window and gives a
borrowed replica back early when it runs dry, so C_out leaves the critical path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from bidirl.controller.actions import Action, Lend, Reclaim
from bidirl.controller.events import Event, GroupsCompleted
from bidirl.controller.state import ClusterState, Phase, UnitStatus
from bidirl.core.ledger import Role
from bidirl.policy import admission, predict, reproducible
from bidirl.policy.asynchronous import AsyncPolicy
from bidirl.policy.base import register


class RollLending:
    """Lend idle trainer units as rollout replicas while the trainer waits for data."""

    def __init__(self, guided: bool = True) -> None:
        self.guided = guided
        self._window = -1  # the step whose idle window was already judged

    def actions(self, s: ClusterState, event: Event) -> Iterator[Action]:
        if self.guided and isinstance(event, GroupsCompleted):
            yield from self._release_dry(s, event.replica)
        if self._window == s.next_step or not self._trainer_waits(s):
            return
        self._window = s.next_step
        decision = self.judge(s)
        s.admissions.append(decision)
        if decision.admit:
            for u in s.est.nearest_first("roll_on_train.c_in", s.spec.train_unit_ids())[:decision.units]:
                yield Lend(u, Role.ROLLOUT)

    def judge(self, s: ClusterState) -> admission.AdmissionDecision:
        """How many units to lend, and whether the model says it pays."""
        spec, est = s.spec, s.est
        limit = min(spec.steps - 1, s.version + spec.staleness)
        feedable = math.ceil(predict.groups_to_generate(s, limit) * spec.group_size / spec.replica_cap)
        units = min(len(spec.train_units), feedable)
        if not self.guided:
            return admission.AdmissionDecision("roll_on_train", s.t, units, 0.0, 0.0,
                                               units > 0, guided=False)
        b = s.next_step
        # the slowest C_in of the units it would lend (their node pairs' measurements)
        c_in = max((est.switch_s("roll_on_train.c_in", u)
                    for u in est.nearest_first("roll_on_train.c_in", spec.train_unit_ids())[:units]),
                   default=est.switch.estimate("roll_on_train.c_in"))
        # Borrowed replicas take the queue's head: judge every step up to its batch (the
        # next one at s = 1, up to b + s at larger bounds), not only the next two.
        head = s.head_batch()
        last = max(b + 1, min(limit, head if head is not None else b + 1))

        def ready(add: int, delay: float) -> tuple[float, ...]:
            return tuple(predict.ready_in(s, k, add, delay) for k in range(b, last + 1))

        return admission.roll_on_train(
            s.t, units, est.step_s.value + est.weight_sync_s(), ready(0, 0.0),
            ready(units, 0.0), ready(units, c_in), est.switch.estimate("roll_on_train.c_out"),
            error=est.admission_error("roll_on_train"))

    def _trainer_waits(self, s: ClusterState) -> bool:
        return (s.phase is Phase.IDLE and not s.finished
                and (s.pending_sync is None or reproducible.trainer_waits_for_sync(s))
                and bool(s.spec.train_units) and not s.queue.batch_ready(s.next_step)
                and s.units.trainer_home() and s.queue.has_work())

    def _release_dry(self, s: ClusterState, unit: int) -> Iterator[Action]:
        """A borrowed replica with nothing left to run goes home now, not at step start."""
        if (unit >= s.spec.n_replicas and s.units.status[unit] is UnitStatus.LENT
                and s.units.load[unit] == 0 and s.next_group(unit, s.spec.steps - 1) is None):
            yield Reclaim(unit)


@register("roll-borrow")
class RollBorrowPolicy(AsyncPolicy):
    lends_train_devices = True

    def __init__(self) -> None:
        self.roll = RollLending(guided=True)
