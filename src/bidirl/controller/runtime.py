"""The seam between deciding and doing: what a runtime must offer the controller.

A runtime owns the devices.  It executes actions asynchronously and reports what
happened by calling ``Controller.on_event`` — never from inside ``execute`` (a runtime
queues the events an action causes and delivers them after ``execute`` returns), so the
controller is never re-entered.  Two runtimes implement it, around the shared frame
(``bidirl.frame``: event pump, hosting state machine, device-time recorder): the simulator
(``bidirl.sim.runtime.SimRuntime``) and the real runtime's executor
(``bidirl.runtime.executor.DeviceExecutor``, over Ray actors or the tests' fakes).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bidirl.controller.actions import Action


@runtime_checkable
class Runtime(Protocol):
    def now(self) -> float:
        """Seconds since the run started, on the runtime's clock."""
        ...

    def execute(self, action: Action) -> None:
        """Start carrying out ``action``; report its effects later as events."""
        ...
