"""The event inbox and pump both runtimes deliver through.

A runtime reports what happened with ``deliver``; ``pump`` hands the queued events to the
controller one at a time, after the runtime's callback has returned, so the controller is
never re-entered from ``execute`` (the contract of ``controller.runtime.Runtime``).
"""

from __future__ import annotations

from collections import deque


class EventPump:
    def __init__(self, controller) -> None:
        self.controller = controller
        self.inbox: deque = deque()

    def deliver(self, event) -> None:
        self.inbox.append(event)

    def pump(self) -> int:
        """Deliver every queued event (and those their actions cause); returns how many."""
        n = 0
        while self.inbox:
            self.controller.on_event(self.inbox.popleft())
            n += 1
        return n
