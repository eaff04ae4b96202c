"""How the executor reaches device workers: the ``Backend`` seam, and Ray's side of it.

The executor (``runtime/executor.py``) decides nothing and knows no Ray: it submits worker
methods (``host``, ``release``, ``call``) to devices through a backend and learns when they
complete.  ``RayBackend`` carries them to one Ray actor per device; the tests' in-process
fake (``tests/runtime/fake_devices.py``) runs the same calls on fake roles against a
deterministic virtual clock, so every policy's real-runtime logic is tested without Ray.

Contract (both backends): calls to one device run in the order they were submitted
(``poll`` excepted: it runs beside them, see ``worker.STREAM_METHODS``); a
handle returned by ``submit`` may be passed as an argument to a later ``submit`` (on any
device), where it stands for its result; ``get`` raises ``DeviceLost`` if the device died
before the call completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from bidirl.runtime.worker import STREAM_GROUP, STREAM_METHODS


class DeviceLost(RuntimeError):
    """The device's worker died before the call completed."""


class Backend(Protocol):
    def now(self) -> float:
        """Seconds since the run started, on this backend's clock."""
        ...

    def submit(self, device: int, method: str, *args, returns: int = 1, **kwargs) -> Any:
        """Start ``worker.method(*args, **kwargs)`` on ``device``; a handle (a list of
        ``returns`` handles when the method returns several values)."""
        ...

    def wait(self, handles: list, timeout_s: float) -> set:
        """Block until at least one of ``handles`` is done (or the timeout); the done ones."""
        ...

    def get(self, handle) -> Any:
        """The result of a done call (raises ``DeviceLost``)."""
        ...

    def restart(self, device: int) -> None:
        """Replace a dead device's worker with a fresh one hosting nothing."""
        ...


class RayBackend:
    """One Ray actor per device (``runtime/worker.py``)."""

    def __init__(self, workers: dict[int, Any], new_worker: Callable[[int], Any] | None = None) -> None:
        import ray

        self.ray, self.workers, self.new_worker = ray, workers, new_worker
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def submit(self, device: int, method: str, *args, returns: int = 1, **kwargs):
        fn = getattr(self.workers[device], method)
        if returns > 1:
            fn = fn.options(num_returns=returns)
        elif method in STREAM_METHODS:
            fn = fn.options(concurrency_group=STREAM_GROUP)
        return fn.remote(*args, **kwargs)

    def wait(self, handles: list, timeout_s: float) -> set:
        # fetch_local=False: done is enough; a result another worker takes (a gradient chunk
        # for the primary) goes to it from where it was made, not through the driver's node
        ready, _ = self.ray.wait(handles, num_returns=1, timeout=timeout_s, fetch_local=False)
        if not ready:
            return set()
        ready, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0, fetch_local=False)
        return set(ready)

    def get(self, handle):
        try:
            return self.ray.get(handle)
        except self.ray.exceptions.RayActorError as e:
            raise DeviceLost(str(e)) from None

    def restart(self, device: int) -> None:
        if self.new_worker is None:
            raise DeviceLost(f"device {device} died and this backend cannot restart workers")
        self.workers[device] = self.new_worker(device)
