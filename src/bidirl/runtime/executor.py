"""The real runtime: carries out the controller's actions on device workers.

::

    driver process                                     device workers (Ray actors, or
    +----------------------------------------+         the tests' in-process fakes)
    | Controller (pure)                      |         +---------------------------+
    |   on_event(e) -> policy -> actions     |         | DeviceWorker              |
    | DeviceExecutor                         | Backend |   roles: rollout (vLLM),  |
    |   execute(action) --- calls.issue ---- | ------> |          train (torch),   |
    |   run(): calls.dispatch -> callbacks   | <------ |          aux_train        |
    |          -> pump.deliver(events)       | results |   host / release (timed)  |
    |   Hosting, Recorder (runtime frame)    |         |   call(role, method, ...) |
    | GroupStore: prompts, responses,        |         +---------------------------+
    |   partial prefixes, rewards            |
    +----------------------------------------+

``execute`` never delivers an event itself: it issues calls (or queues an event) and
returns; ``run`` pumps queued events one at a time, so the controller is never
re-entered.  This module knows no Ray: the backend (``runtime/backend.py``) carries the
calls, which is what lets the fast suite run every policy through this code on fakes.
Rollout calls live in ``rollout_driver.py``, training steps in ``train_driver.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.controller.actions import AssignGroups, JoinStep, Lend, Reclaim, StartTrainStep, SyncWeights
from bidirl.controller.events import (
    DeviceLent,
    DeviceReclaimed,
    GroupsCompleted,
    StageMeasured,
    Started,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.controller.units import UnitStatus
from bidirl.core.ledger import Role
from bidirl.core.timeline import Activity
from bidirl.frame.device_time import Recorder
from bidirl.frame.hosting import Hosting
from bidirl.frame.pump import EventPump
from bidirl.runtime.calls import CallBook
from bidirl.runtime.exits import primary_trainer_lost
from bidirl.runtime.group_ids import GroupIds
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.rollout_driver import RolloutDriver
from bidirl.runtime.sync_driver import SyncDriver
from bidirl.runtime.train_driver import TrainDriver

ENV_POLL_S = 0.02  # how often the loop looks at the episodes while one is in its environment (multi-turn)
_PROFILED = (StageMeasured, WeightsSynced, GroupsCompleted, TrainStepFinished)


@dataclass
class Job:
    """What the run generates and trains: data, reward, role arguments, resume offsets."""

    store: GroupStore
    new_group: Callable[[int], None]  # create group ``gid`` (global id) in the store
    reward_fn: Callable
    decode: Callable[[list[int]], str]
    rollout_kwargs: dict
    trainer_kwargs: dict  # model_dir, config: what an auxiliary trainer is brought up with
    ids: GroupIds = field(default_factory=GroupIds)  # resume: controller ids are local, the store's global
    version_offset: int = 0
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # the advantage estimator's settings
    hub: Any = None  # multi-turn: the run's ``runtime/trajectories.TrajectoryHub``; None: one turn per response
    weight_sync: tuple = ("object_store", False, None)  # (transport, delta, rendezvous()): runtime/sync_driver.py


@dataclass
class DeviceState:
    """What the executor tracks of each device beside its calls, by device id."""

    unit: dict[int, int]  # device -> the unit it is
    # a unit's other devices (rollout.tensor_parallel_size > 1) -> the unit: their time is the unit's
    members: dict[int, int] = field(default_factory=dict)
    switching: dict[int, str] = field(default_factory=dict)  # device -> what it is switching through
    last_work_s: dict[int, float] = field(default_factory=dict)  # device -> its longest last piece of work


class PolicyWeights:
    """Which policy version is where: the primary trainer's newest, each auxiliary trainer's,
    and the primary's weights as a handle, fetched once per version (``fetch``)."""

    def __init__(self, version: int, fetch: Callable[[], object]) -> None:
        self.version = version  # the primary trainer's newest version
        self.aux: dict[int, int] = {}  # device -> version its auxiliary trainer holds
        self._fetch = fetch
        self._fetched: tuple[int, object] | None = None  # (version, handle)

    def primary(self):
        if self._fetched is None or self._fetched[0] != self.version:
            self._fetched = (self.version, self._fetch())
        return self._fetched[1]


@dataclass
class Layout:
    """Which device each unit lives on, and which devices are the primary trainer."""

    unit_device: Callable[[int], int]
    train_devices: list[int]
    pools: dict[int, str] = field(default_factory=dict)  # device -> owner pool


class DeviceExecutor:
    """The ``Runtime`` protocol over a ``Backend`` (see the module docstring)."""

    def __init__(self, controller, backend, job: Job, layout: Layout) -> None:
        self.controller, self.backend = controller, backend
        self.job, self.layout = job, layout
        spec = self.spec
        if not layout.pools:
            layout.pools = {d: "rollout" for d in spec.rollout_devices()}
            layout.pools.update({d: "train" for d in layout.train_devices})
        self.pump = EventPump(controller)
        self.hosting = Hosting(spec.n_replicas, spec.n_units)
        self.calls = CallBook(backend, layout.pools)
        self.clock = Recorder(layout.pools, keep=True)
        self.devices = DeviceState({layout.unit_device(u): u for u in range(spec.n_units)},
                                   members={d: u for u in range(spec.n_units) for d in spec.unit_devices(u)[1:]})
        self.weights = PolicyWeights(job.version_offset, lambda: self.backend.submit(
            self.layout.train_devices[0], "call", "train", "weights"))
        self.switches: list[tuple[str, float]] = []  # (kind, seconds), measured
        self.reclaim_waits: list[dict] = []
        self.lost_devices: list[tuple[int, float]] = []
        # (time, event) of what the run measured: the profile ``runtime/calibrated_scenario.py``
        # writes as a scenario for the simulator
        self.profile: list[tuple[float, object]] = []
        self.on_step: Callable | None = None  # the reporter's hook, per finished step
        self.validator = None  # runtime/validation.Validator when the run validates
        self.sync_seconds: list[float] = []  # every weight sync's duration (timing_s/update_weights)
        self.rollout = RolloutDriver(self)
        self.trainer = TrainDriver(self)
        self.sync = SyncDriver(self, *job.weight_sync)

    @property
    def spec(self):
        """The cluster the controller schedules (``ClusterSpec``)."""
        return self.controller.state.spec

    # -- Runtime protocol -------------------------------------------------------------
    def now(self) -> float:
        return self.backend.now()

    def execute(self, action) -> None:
        {AssignGroups: self.rollout.assign, StartTrainStep: self.trainer.start, SyncWeights: self._sync,
         Lend: self._lend, Reclaim: self._reclaim, JoinStep: self.trainer.join}[type(action)](action)

    @property
    def steps(self) -> dict:
        return self.trainer.records

    # -- the loop -----------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        self.pump.deliver(Started())
        while True:
            self.rollout.pump_trajectories()
            if self.validator is not None:
                self.validator.pump()
            self.pump.pump()
            self._refresh_clock()
            if self.controller.finished or should_stop():
                return
            # An episode in its environment hands over work without a call finishing: look again soon.
            in_env = self.rollout.waiting_on_environment() or (
                self.validator is not None and self.validator.waiting_on_environment())
            if not self.calls:
                if in_env:
                    time.sleep(ENV_POLL_S)
                    continue
                st = self.controller.state
                raise RuntimeError(
                    f"runtime stalled: nothing in flight and the run is not finished (next step {st.next_step}, "
                    f"phase {st.phase.value}, running groups {st.running}, done per batch {st.queue.done[:8]})"
                    + self.rollout.stall_state())
            if not self.calls.dispatch(ENV_POLL_S if in_env else 5.0, self._device_lost):
                time.sleep(0.001)
            self._refresh_clock()

    def finish(self) -> list:
        """Close every device's last interval; the run's intervals, by device and time.

        The replicas' decode steps since their last measurement go to the profile
        (``rollout_driver.DECODE_REMAINDER``), for the run's calibrated scenario."""
        self.profile.extend((self.now(), m) for m in self.rollout.take_remainders())
        self.sync.close()  # shm: the segment is unlinked
        self.clock.finish(self.now())
        return self.clock.sorted_intervals()

    # -- helpers the drivers share ------------------------------------------------------
    def deliver(self, event) -> None:
        if isinstance(event, _PROFILED):
            self.profile.append((self.now(), event))
        self.pump.deliver(event)

    def primary_weights(self):
        """The primary's current weights (a handle): fetched once per version and kept, so
        that an auxiliary lent while the trainer computes does not queue behind its calls."""
        return self.weights.primary()

    def unit_device(self, u: int) -> int:
        return self.layout.unit_device(u)

    def call_now(self, device: int, method: str, *args, **kwargs) -> Any:
        """A call the driver waits for (checkpoints): queued behind the device's others."""
        return self.backend.get(self.backend.submit(device, method, *args, **kwargs))

    # -- weights ------------------------------------------------------------------------
    def _sync(self, a: SyncWeights) -> None:
        t_start = self.now()
        targets = [u for u in range(self.spec.n_units) if self.hosting.serves_rollout(u)]
        version = a.version + self.job.version_offset
        pending = {"n": len(targets), "load": []}

        def done(load_s):
            pending["n"] -= 1
            if isinstance(load_s, tuple):  # a collective's (device seconds, bytes received)
                load_s, pending["bytes"] = load_s
            if isinstance(load_s, (int, float)) and load_s > 0:  # the device's own timing
                pending["load"].append(float(load_s))
            if pending["n"] == 0:
                self.weights.version = version
                self.sync_seconds.append(self.now() - t_start)
                loads = pending["load"]
                self.deliver(WeightsSynced(a.version, self.now() - t_start, max(loads) if loads else None,
                                           pending.get("bytes")))

        if not targets:
            self.weights.version = version
            self.deliver(WeightsSynced(a.version, 0.0))
        for u in targets:
            self.rollout.version[u] = version
        if not self.sync.push(targets, version, done):
            w = self.primary_weights()
            for u in targets:
                self.calls.issue(self.unit_device(u), done, ("rollout", "weight sync"), "call",
                                 "rollout", "update_weights", w, version, on_lost=lambda: done(None))
        self.replica_weights_changed()

    def replica_weights_changed(self) -> None:
        """A replica was given new weights (its update call is queued): a validation waiting
        for that version may go (behind it on the device)."""
        if self.validator is not None:
            self.validator.poke()

    # -- borrowing ----------------------------------------------------------------------
    def _lend(self, a: Lend) -> None:
        u, dev = a.unit, self.unit_device(a.unit)
        kind = self.hosting.begin_lend(u, a.role, a.colocated)
        role = "rollout" if a.role is Role.ROLLOUT else "aux_train"
        job = self.job
        kwargs = dict(job.rollout_kwargs) if role == "rollout" else {
            "model_dir": job.trainer_kwargs["model_dir"], "config": job.trainer_kwargs.get("config")}
        version = self.weights.version
        kwargs.update(weights=[self.primary_weights()], version=version)  # fetched inside the timed C_in
        self.devices.switching[dev] = "C_in"
        if role == "aux_train":
            # A chunk issued before C_in ends runs after it, on these weights: without this the
            # step would fetch the weights again, behind the primary's own chunk on its device,
            # and the auxiliary would start only when the primary is done.
            self.weights.aux[dev] = version

        def done(seconds: float) -> None:
            self.devices.switching.pop(dev, None)
            if role == "rollout":
                self.rollout.version[u] = version
            else:  # the version its weights were fetched at, not today's
                self.weights.aux[dev] = version
            self.switches.append((f"{kind}.c_in", seconds))
            reclaim_waiting = self.hosting.lent(u)
            self.deliver(DeviceLent(u, a.role, seconds))
            if reclaim_waiting:
                self._release(u)

        self.calls.issue(dev, done, None, "host", role, **kwargs)

    def _reclaim(self, a: Reclaim) -> None:
        if self.hosting.begin_reclaim(a.unit):
            self._release(a.unit)

    def _release(self, u: int) -> None:
        dev, role_enum, kind = self.unit_device(u), self.hosting.role[u], self.hosting.kind(u)
        role = "rollout" if role_enum is Role.ROLLOUT else "aux_train"
        t_issue = self.now()
        self.devices.switching[dev] = "C_out"

        def done(out) -> None:
            seconds, partials = out
            self.reclaim_waits.append({
                "unit": u, "role": role, "wait_s": max(0.0, self.now() - t_issue - seconds), "c_out_s": seconds,
                "last_work_s": self.devices.last_work_s.get(dev, 0.0)})
            self.devices.switching.pop(dev, None)
            self.hosting.reclaimed(u)
            self.switches.append((f"{kind}.c_out", seconds))
            if u < self.spec.n_replicas:  # back to its native role, which stayed resident
                self.rollout.catch_up(u)
            if role == "rollout":
                self.rollout.reclaimed(u, partials or [])
            self.deliver(DeviceReclaimed(u, role_enum, seconds))

        self.calls.issue(dev, done, None, "release", role)

    # -- faults ---------------------------------------------------------------------------
    def _device_lost(self, dev: int, handlers: list[Callable[[], None]]) -> None:
        """A device's worker died: redo its work elsewhere, restart it in its own pool's role.

        Only rollout-pool devices can be lost and recovered: their native role (a replica)
        holds no state that the run needs.  The primary trainer's devices hold the
        optimizer; losing one ends the run, and ``--resume`` restarts from the checkpoint.
        """
        if self.layout.pools[dev] == "train":
            raise primary_trainer_lost(dev, sys.exc_info()[1])  # one line naming the run directory
        u = self.devices.unit[dev]
        self.lost_devices.append((dev, self.now()))
        print(f"[bidirl] device {dev} (unit {u}) died; redoing its work and restarting it", file=sys.stderr)
        self.backend.restart(dev)
        self.sync.forget()  # its end of the weight group died with it
        self.devices.switching[dev] = "restart"  # shown as switching until the replica is back
        self.calls.issue(dev, lambda _: self.devices.switching.pop(dev, None), None, "host", "rollout",
                         **{**self.job.rollout_kwargs, "weights": [self.primary_weights()],
                            "version": self.weights.version})
        self.rollout.version[u] = self.weights.version
        self.replica_weights_changed()
        self.weights.aux.pop(dev, None)
        was = self.hosting.status[u]
        role = self.hosting.lost(u)
        for h in handlers:
            h()
        if role is not None:  # it was (being) lent or reclaimed: it is home now
            if was is UnitStatus.LENDING:
                self.deliver(DeviceLent(u, role, 0.0))
            self.deliver(DeviceReclaimed(u, role, 0.0))
        self.rollout.lost(u)

    # -- device time ----------------------------------------------------------------------
    def _refresh_clock(self) -> None:
        t = self.now()
        for dev, pool in self.layout.pools.items():
            u = self.devices.unit.get(dev)
            if dev in self.devices.members and self._as_unit(self.devices.members[dev]):
                continue  # recorded with its unit's first device, below
            devs = self.spec.unit_devices(u) if u is not None and self._as_unit(u) else (dev,)
            role = self.hosting.current_role(u).value if u is not None else pool
            borrowed = role != pool and not (pool == "rollout" and role == "rollout")
            busy = self.calls.label(dev)
            if dev in self.devices.switching:
                self.clock.set(devs, t, Activity.SWITCHING, role, self.devices.switching[dev], borrowed)
            elif busy is not None:
                self.clock.set(devs, t, Activity.BUSY, busy[0], busy[1], borrowed)
            else:
                replica = pool == "rollout" or role == "rollout"
                cause = self.controller.idle_cause(u if replica else None)
                self.clock.set(devs, t, Activity.IDLE, role, cause, borrowed)

    def _as_unit(self, u: int) -> bool:
        """Whether unit ``u``'s devices work as one now: a replica always (one engine over them),
        a training unit while it is lent (each rank its own at home)."""
        return u < self.spec.n_replicas or self.hosting.status[u] is not UnitStatus.HOME
