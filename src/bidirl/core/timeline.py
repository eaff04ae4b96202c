"""Device-time intervals: what every device was doing, when.

Both runtimes (simulated and real) record one ``Interval`` per stretch of a device's
time.  The records feed the Perfetto trace, the timeline plot, the idle ratios and the
device-time conservation check (busy + idle + switching = devices x wall time), so they
live in the pure core and carry no rendering logic.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Activity(StrEnum):
    """What a device spends a stretch of time on."""

    BUSY = "busy"  # doing the work of the role it hosts
    IDLE = "idle"  # hosts a role but has nothing to do (a bubble)
    SWITCHING = "switching"  # bringing a borrowed role up (C_in) or down (C_out)


@dataclass(frozen=True, slots=True)
class Interval:
    """One stretch ``[start_s, end_s)`` of one device's time.

    ``pool`` is the pool that owns the device (``rollout`` or ``train``); ``role`` is the
    role it hosted (``rollout``, ``train``, ``aux_train``, ``none``); ``borrowed`` is true
    when the role is the other pool's stage (the device was lent).  ``label`` is free text
    shown in traces (e.g. ``step 3``, ``C_in``, ``waiting for batch 4``).
    """

    device: int
    pool: str
    role: str
    activity: Activity
    start_s: float
    end_s: float
    label: str = ""
    borrowed: bool = False

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s
