"""What every part of the simulated runtime shares: the clock, the cluster, the ground
truth, the hosting state, the recorder, the timing noise and the two ways a part acts
(``at``: call later, ``deliver``: tell the controller).

``SimRuntime`` (``sim/runtime.py``) builds one and hands it to its parts, the rollout
replicas (``sim/rollout.py``) and the trainer (``sim/trainer.py``); each part keeps its
own state and reaches the others only through the runtime.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from bidirl.controller.cluster import ClusterSpec
from bidirl.frame.device_time import Recorder
from bidirl.frame.hosting import Hosting
from bidirl.sim.world import Truth

WAITING = "waiting for data"


class TimingNoise:
    """Multiplicative lognormal noise of mean 1 on every simulated duration (seeded)."""

    def __init__(self, cv: float, seed: int) -> None:
        self._rng = random.Random(f"bidirl-sim:{seed}")
        self._sigma = math.sqrt(math.log1p(cv * cv))

    def __call__(self) -> float:
        if self._sigma == 0:
            return 1.0
        return math.exp(self._rng.gauss(-0.5 * self._sigma * self._sigma, self._sigma))


@dataclass
class SimContext:
    """The simulated cluster as its parts see it.

    ``at(t, fn, *args)`` calls ``fn`` at absolute time ``t``, then lets the controller react
    to what it delivered; ``deliver(event)`` queues an event for the controller.  ``wall_s``
    is set once the last step has finished: from then on nothing more is carried out.
    """

    env: simpy.Environment
    spec: ClusterSpec
    truth: Truth
    hosting: Hosting
    rec: Recorder
    noise: TimingNoise
    at: Callable[..., None]
    deliver: Callable[[object], None]
    done: simpy.Event
    wall_s: float | None = None

    @property
    def over(self) -> bool:
        return self.wall_s is not None

    def finish(self) -> None:
        """The last step has finished: the run's wall time is now."""
        self.wall_s = self.env.now
        self.rec.finish(self.wall_s)
        self.done.succeed()
