"""Resource envelopes: the split and parallel layout the planner chooses before a job starts.

An envelope fixes, for a budget of ``g`` devices (rollout pool first, devices ``0..R-1``;
training pool after, ``R..g-1``; consecutive devices share a node)::

    rollout pool  R devices = (R / rollout_tp) replicas x rollout_tp devices
    train pool    T devices = train_dp ranks x train_tp devices   (sharded: FSDP over dp)
    borrowing     a train device group hosts replicas of rollout_tp devices;
                  a lent rollout replica (rollout_tp devices) hosts one auxiliary trainer
    budgets       rollout_memory_bytes / train_memory_bytes: what each role needs per device

It is plain data, convertible to the scenario schema's ``Pools`` (which has no field
for ``train_sharded``, ``aux_group`` or the budgets: they are decisions the simulator's
stage-time models do not distinguish, recorded so the real runtime can honour them).
The schema lives in the inner ring (``bidirl.perf.scenario``), so the planner never
imports the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bidirl.perf.profiles import GIB
from bidirl.perf.scenario import Pools, TrainLayout


@dataclass(frozen=True, slots=True)
class Envelope:
    rollout_devices: int
    train_devices: int
    rollout_tp: int
    train_dp: int
    train_tp: int
    train_sharded: bool = True  # optimizer, gradients and params sharded over dp (FSDP)
    aux_group: int = 0  # devices of one auxiliary trainer (a lent replica); 0 = unsized
    rollout_concurrency: int = 0  # sequences one replica holds at the planned context
    rollout_memory_bytes: float = 0.0  # per device, rollout role (M_r)
    train_memory_bytes: float = 0.0  # per device, trainer role (M_t)

    @property
    def devices(self) -> int:
        return self.rollout_devices + self.train_devices

    @property
    def rollout_replicas(self) -> int:
        """``d_r``: primary rollout replicas."""
        return self.rollout_devices // self.rollout_tp

    @property
    def borrowable_replicas(self) -> int:
        """Rollout replicas the whole training pool can host when lent."""
        return self.train_devices // self.rollout_tp

    @property
    def aux_trainer_ranks(self) -> int:
        """Auxiliary trainers the rollout pool can host when lent: one per replica."""
        return self.rollout_replicas if self.aux_group > 0 else 0

    def key(self) -> tuple[int, int, int, int]:
        return (self.rollout_devices, self.rollout_tp, self.train_dp, self.train_tp)

    def label(self) -> str:
        # Sharding is decided when the envelope is sized (DDP if it fits, else FSDP).
        shard = "" if not self.rollout_concurrency else (
            " fsdp" if self.train_sharded else " ddp")
        return (f"R{self.rollout_devices}/T{self.train_devices} roll tp{self.rollout_tp} "
                f"x{self.rollout_replicas}, train dp{self.train_dp} tp{self.train_tp}{shard}")

    def to_pools(self) -> Pools:
        """The scenario ``Pools`` for this envelope."""
        return Pools(rollout_devices=self.rollout_devices, train_devices=self.train_devices,
                     rollout_tp=self.rollout_tp,
                     train=TrainLayout(dp=self.train_dp, tp=self.train_tp))

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_devices": self.rollout_devices,
            "train_devices": self.train_devices,
            "rollout_tp": self.rollout_tp,
            "rollout_replicas": self.rollout_replicas,
            "train_layout": {"dp": self.train_dp, "tp": self.train_tp,
                             "sharded": self.train_sharded},
            "aux_group": self.aux_group,
            "rollout_concurrency": self.rollout_concurrency,
            "memory_gib_per_device": {
                "rollout": round(self.rollout_memory_bytes / GIB, 2),
                "train": round(self.train_memory_bytes / GIB, 2),
            },
        }


def envelope_of(scenario) -> Envelope:
    """The envelope a scenario's own ``pools`` describe (budgets not yet sized)."""
    p = scenario.pools
    return Envelope(p.rollout_devices, p.train_devices, p.rollout_tp, p.train.dp, p.train.tp)


def scenario_with_envelope(scenario, envelope: Envelope):
    """``scenario`` with its pools (and device count) replaced by ``envelope``'s."""
    return scenario.replace(pools=envelope.to_pools(), devices=envelope.devices)

