"""The seam between deciding and doing: what a runtime must offer the controller.

A runtime owns the devices.  It executes actions asynchronously and reports what
happened by calling ``Controller.on_event`` — never from inside ``execute`` (a runtime
queues the events an action causes and delivers them after ``execute`` returns), so the
controller is never re-entered.  The simulator (``bidirl.sim.runtime.SimRuntime``)
implements this now; a Ray runtime (replicas are vLLM engines with continuous batching,
the primary trainer runs a step over ordered chunks, devices are lent and reclaimed with
measured costs) will implement the same two methods.
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
