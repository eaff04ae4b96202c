"""Calls in flight, per device, completed in the order they were issued.

The executor issues a call with a callback; ``dispatch`` waits on the backend and runs the
callbacks of finished calls, a device's calls strictly in issue order (an actor runs one
call at a time, so a later call's result never overtakes an earlier one's).  A call may
carry a busy label (what the device is doing while it runs, for the device-time
recorder) and an ``on_lost`` handler for when the device dies first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from bidirl.runtime.backend import Backend, DeviceLost


class CallBook:
    def __init__(self, backend: Backend, devices) -> None:
        self.backend = backend
        self.fifo: dict[int, deque] = {d: deque() for d in devices}
        self.busy: dict[int, dict[Any, tuple[str, str]]] = {d: {} for d in devices}
        self._pending: dict[Any, tuple[Callable, list | None, Callable | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def issue(self, device: int, cb: Callable, busy: tuple[str, str] | None, method: str, *args,
              returns: int = 1, on_lost: Callable[[], None] | None = None, **kwargs):
        """Submit ``method`` on ``device``; ``cb(result)`` runs when it completes in order.

        ``on_lost`` runs instead if the device dies before the call completes.  Returns the
        backend's handle (a list of handles when ``returns > 1``).
        """
        h = self.backend.submit(device, method, *args, returns=returns, **kwargs)
        refs = h if returns > 1 else None
        last = h[-1] if returns > 1 else h
        self._pending[last] = (cb, refs, on_lost)
        self.fifo[device].append(last)
        if busy is not None:
            self.busy[device][last] = busy
        return h

    def dispatch(self, timeout_s: float, on_device_lost: Callable[[int, list[Callable]], None]) -> bool:
        """Wait for calls to finish and run their callbacks; False if none finished.

        When a device turns out dead, every call in flight on it is dropped and
        ``on_device_lost(device, their on_lost handlers in issue order)`` runs instead.
        """
        ready = self.backend.wait(list(self._pending), timeout_s)
        progressed = False
        for dev, q in list(self.fifo.items()):
            while q and q[0] in ready:
                h = q.popleft()
                cb, refs, on_lost = self._pending.pop(h)
                self.busy[dev].pop(h, None)
                try:
                    result = [self.backend.get(r) for r in refs] if refs else self.backend.get(h)
                except DeviceLost:
                    handlers = [on_lost] + [self._pending.pop(x)[2] for x in q]
                    q.clear()
                    self.busy[dev].clear()
                    on_device_lost(dev, [f for f in handlers if f is not None])
                    progressed = True
                    break
                cb(result)
                progressed = True
        return progressed

    def label(self, device: int) -> tuple[str, str] | None:
        """(role, label) of the newest busy call on ``device``, if any."""
        busy = self.busy[device]
        return next(reversed(busy.values())) if busy else None
