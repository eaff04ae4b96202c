"""The simulated cluster: a SimPy implementation of ``controller.runtime.Runtime``.

``SimRuntime`` carries out the controller's actions through two parts sharing one
``SimContext`` (``sim/context.py``): the rollout replicas (``sim/rollout.py``: assignments,
completions, weight syncs) and the trainer (``sim/trainer.py``: steps in flight, joins).
It keeps what couples them: the start (with a real run's pre-warm), a unit changing
hands (lend, reclaim) and the pump.  Everything the controller learns arrives as events
through an inbox that is drained after each callback, so the controller is never
re-entered from ``execute``; then the replicas are re-planned and re-labelled.  Every
device's activity goes to the ``Recorder``.
"""

from __future__ import annotations

import simpy

from bidirl.controller.actions import AssignGroups, JoinStep, Lend, Reclaim, StartTrainStep, SyncWeights
from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import DeviceLent, DeviceReclaimed, GroupsInterrupted, Started
from bidirl.core.ledger import Role, switch_kind
from bidirl.frame.device_time import IDLE, SWITCHING, Recorder
from bidirl.frame.hosting import Hosting
from bidirl.frame.pump import EventPump
from bidirl.sim.context import WAITING, SimContext, TimingNoise
from bidirl.sim.rollout import RolloutFleet
from bidirl.sim.trainer import SimTrainer
from bidirl.sim.workload import ResponseLengths
from bidirl.sim.world import Truth


class SimRuntime:
    """Carries out the controller's actions on simulated devices."""

    def __init__(self, env: simpy.Environment, spec: ClusterSpec, truth: Truth,
                 lengths: ResponseLengths, controller, recorder: Recorder, seed: int) -> None:
        self.env, self.spec, self.truth, self.lengths = env, spec, truth, lengths
        self.controller, self.rec = controller, recorder
        self.noise = TimingNoise(truth.noise_cv, seed)
        self.hosting = Hosting(spec.n_replicas, spec.n_units)
        self.pump = EventPump(controller)
        self.sim = SimContext(env, spec, truth, self.hosting, recorder, self.noise,
                              at=self._at, deliver=self.pump.deliver, done=env.event())
        self.rollout = RolloutFleet(self.sim, lengths, controller.idle_cause)
        self.trainer = SimTrainer(self.sim)
        self._executors = {
            AssignGroups: self.rollout.assign,
            StartTrainStep: self._train,
            SyncWeights: self.rollout.sync,
            Lend: self._lend,
            Reclaim: self._reclaim,
            JoinStep: self.trainer.join,
        }

    @property
    def wall_s(self) -> float | None:
        """The run's wall time, once its last step has finished."""
        return self.sim.wall_s

    @property
    def done(self) -> simpy.Event:
        """Succeeds when the last step has finished."""
        return self.sim.done

    # -- Runtime protocol -----------------------------------------------------------
    def now(self) -> float:
        return self.env.now

    def execute(self, action) -> None:
        if not self.sim.over:  # after the last step nothing more is carried out
            self._executors[type(action)](action)

    def start(self) -> None:
        if self.truth.prewarmed:
            self._prewarm()
        if self.truth.startup_s > 0:  # a real run's start-up (calibration.startup_s)
            self._at(self.truth.startup_s, self._begin)
        else:
            self._begin()
            self._pump()

    def _prewarm(self) -> None:
        """What a real run's pre-warm measures before its loop, learned by the scheduler as
        there (``Estimates.learn_start_up``): a hot round trip of every unit the policy may
        lend (C_in, C_out at this scenario's costs) and one weight load."""
        policy, n_rep = self.controller.policy, self.spec.n_replicas
        lendable = [u for u in range(self.spec.n_units)
                    if (policy.lends_rollout_devices if u < n_rep else policy.lends_train_devices)]
        switches = []
        for u in lendable:
            kind = switch_kind(Role.AUX_TRAIN if u < n_rep else Role.ROLLOUT)
            switches += [(f"{kind}.{c}", u, self.truth.switch[f"{kind}.{c}"]) for c in ("c_in", "c_out")]
        self.controller.state.est.learn_start_up(switches, [self.truth.weight_sync_s])

    def _begin(self) -> None:
        self.rollout.dirty.update(range(self.spec.n_replicas))
        self.pump.deliver(Started())

    # -- plumbing -------------------------------------------------------------------
    def _at(self, t: float, fn, *args) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: (fn(*args), self._pump()))

    def _pump(self) -> None:
        self.pump.pump()
        if not self.sim.over:
            self.rollout.settle()

    def _train(self, a: StartTrainStep) -> None:
        self.rollout.take_completed(a.step, a.group_ids)
        self.trainer.start(a)

    # -- a unit changing hands --------------------------------------------------------
    def _lend(self, a: Lend) -> None:
        u, now = a.unit, self.env.now
        if u < self.spec.n_replicas and self.rollout.running(u):
            raise RuntimeError(f"replica {u} runs responses; cannot lend it")
        kind = self.hosting.begin_lend(u, a.role, a.colocated)
        cost = (self.truth.colocated_switch_s if a.colocated
                else self.truth.switch[f"{kind}.c_in"]) * self.noise()
        if a.role is Role.AUX_TRAIN:
            self.trainer.ready_at[u] = now + cost
        self.rollout.supersede(u)
        self.rec.set(self.spec.unit_devices(u), now, SWITCHING, a.role.value,
                     "switch" if a.colocated else "C_in", True)
        self._at(now + cost, self._lent, u, cost)

    def _lent(self, u: int, cost: float) -> None:
        now, role = self.env.now, self.hosting.role[u]
        reclaim_waiting = self.hosting.lent(u)
        if role is Role.ROLLOUT:
            self.rollout.host(u, self.trainer.version)
        else:
            self.rec.set(self.spec.unit_devices(u), now, IDLE, "aux_train", WAITING, True)
        self.pump.deliver(DeviceLent(u, role, cost))
        if reclaim_waiting:  # C_in had to finish before C_out could start
            self._reclaim_now(u)

    def _reclaim(self, a: Reclaim) -> None:
        if self.hosting.begin_reclaim(a.unit):
            self._reclaim_now(a.unit)

    def _reclaim_now(self, u: int) -> None:
        now, role = self.env.now, self.hosting.role[u]
        if role is Role.ROLLOUT:
            parts = self.rollout.evict(u)
            if parts:
                self.pump.deliver(GroupsInterrupted(
                    u, tuple(p[0] for p in parts), tuple(p[1] for p in parts),
                    tuple(len(p[2]) for p in parts)))
        self.rollout.supersede(u)
        self.trainer.ready_at.pop(u, None)
        colocated = u in self.hosting.colocated
        cost = (self.truth.colocated_switch_s if colocated
                else self.truth.switch[f"{self.hosting.kind(u)}.c_out"]) * self.noise()
        self.rec.set(self.spec.unit_devices(u), now, SWITCHING, role.value,
                     "switch" if colocated else "C_out", True)
        self._at(now + cost, self._reclaimed, u, cost)

    def _reclaimed(self, u: int, cost: float) -> None:
        role = self.hosting.reclaimed(u)
        if u < self.spec.n_replicas:
            self.rollout.rehome(u)
        else:
            self.rec.set(self.spec.unit_devices(u), self.env.now, IDLE, "train", WAITING)
        self.pump.deliver(DeviceReclaimed(u, role, cost))
