"""The controller: events in, state updated, policy consulted, actions out.

::

      runtime (sim or Ray)                       controller (pure)
    +----------------------+   events    +-------------------------------------+
    | replicas  (vLLM)     | ----------> | state.observe(event)                |
    | primary trainer      |             |   ledgers, versions, queue, loads,  |
    | aux trainers         |             |   stage models <- StageMeasured     |
    | lend / reclaim       |             |   switch costs <- DeviceLent/...    |
    |                      |   actions   |                                     |
    |   execute(action)    | <---------- | for action in policy.decide(...):   |
    +----------------------+             |     state.commit(action)            |
                                         | then runtime.execute(each action)   |
                                         +-------------------------------------+

    prompt groups:  queue --AssignGroups--> replica --GroupsCompleted--> batch b
                    (a reclaimed borrowed replica: --GroupsInterrupted--> queue front)
    batch b ready:  StartTrainStep(b, chunks) --TrainStepFinished--> version b+1
                    --SyncWeights--> WeightsSynced: batches <= b+1+s may start

The loop below is the whole algorithm; what differs between ``sync``, ``async`` and
``bidirl`` lives in the policy (``bidirl.policy``), what differs between the simulator
and the real cluster lives in the runtime.
"""

from __future__ import annotations

from array import array
from time import perf_counter, thread_time

from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import Event
from bidirl.controller.runtime import Runtime
from bidirl.controller.state import ClusterState


class Controller:
    """Drives one run: owns the cluster state, asks the policy, executes its actions.

    Every event's decision time is kept, runtime work (``execute``) excluded: wall time
    (``decision_s``) and this thread's CPU time (``decision_cpu_s``, which a busy shared
    machine cannot inflate by descheduling the process).
    """

    def __init__(self, spec: ClusterSpec, policy, runtime: Runtime | None = None) -> None:
        self.state = ClusterState(spec)
        self.policy = policy
        self.runtime = runtime
        self.decision_s = array("d")  # controller wall time per event, runtime work excluded
        self.decision_cpu_s = array("d")  # the same in thread CPU time
        self.decision_actions = array("l")  # actions issued per event

    def bind(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def on_event(self, event: Event) -> None:
        """Handle one event: the main loop of the scheduler.

        The policy's actions are committed to the state as they come (so the policy reads
        its own earlier actions) and handed to the runtime once the decision is complete;
        a runtime never reacts synchronously, so the order of effects is the same.
        """
        start, cpu = perf_counter(), thread_time()
        self.state.observe(event, self.runtime.now())
        actions = []
        for action in self.policy.decide(self.state, event):
            self.state.commit(action)
            actions.append(action)
        self.decision_cpu_s.append(thread_time() - cpu)
        self.decision_s.append(perf_counter() - start)
        self.decision_actions.append(len(actions))
        for action in actions:
            self.runtime.execute(action)

    @property
    def finished(self) -> bool:
        return self.state.finished

    def idle_cause(self, unit: int | None) -> str:
        """Why a unit (``None``: the primary trainer) has nothing to do right now."""
        s = self.state
        if unit is None or unit >= s.spec.n_replicas and s.units.status[unit].value == "home":
            return "waiting for data"
        if unit < s.spec.n_replicas and s.units.status[unit].value != "home":
            return "waiting for data"  # an auxiliary trainer between chunks
        if s.phase.value == "syncing" or s.pending_sync is not None:
            return "waiting for weights"
        return "staleness bound" if s.queue.has_work() else "no work"
