"""What the controller knows about the cluster before the run: units, layouts, workload.

A runtime builds a ``ClusterSpec`` from its own configuration (the simulator from a
``Scenario`` and ``Pools``; the Ray runtime from its placement) and hands it to the
controller.  It is plain data: no I/O, no device handles.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.core.ledger import Pool
from bidirl.perf.profiles import HARDWARE, MODELS, HardwareProfile, ModelProfile, lookup


@dataclass(frozen=True)
class ClusterSpec:
    """Topology and workload shape.

    ``replica_devices[r]`` are the devices of primary rollout replica ``r``;
    ``train_units[u]`` are the train-pool devices of lendable unit ``n_replicas + u``
    (``rollout_tp`` devices each, so each can host one borrowed rollout replica).
    ``replica_cap`` is the number of responses a replica runs at once (continuous batching
    concurrency, from KV-cache memory).  ``total_groups = steps * groups_per_step``: the
    groups trained; with dynamic sampling more are generated (``controller/queue.py``).
    """

    hardware: str
    model: str
    devices: int
    replica_devices: tuple[tuple[int, ...], ...]
    train_devices: tuple[int, ...]
    train_units: tuple[tuple[int, ...], ...]
    rollout_tp: int
    train_dp: int
    train_tp: int
    train_spans_nodes: bool
    replica_cap: int
    groups_per_step: int
    group_size: int
    prompt_tokens: int
    staleness: int
    steps: int
    micro_batch_tokens: int
    max_response_tokens: int = 8192
    # Sequences per micro-batch, a cap beside the tokens (the trainer's ``micro_batch_size``);
    # None: tokens alone.  Without it, responses far shorter than the token target assumed
    # pack a whole batch into one micro-batch, and a step that is one micro-batch cannot be
    # split with an auxiliary trainer.
    micro_batch_samples: int | None = None
    aux_trainers: bool = True  # a rollout unit can hold an auxiliary trainer (memory)
    devices_per_node: int = 8
    prior_scale: float = 1.0  # how far the scheduler's stage-model priors start off
    # A scenario's own device or model (``perf.profile_spec``); None: the catalogue entry
    # ``hardware`` / ``model`` names.
    hw_profile: HardwareProfile | None = None
    model_profile: ModelProfile | None = None
    # Reproducible mode (policy/reproducible.py): batch b is generated at exactly version
    # max(0, b - staleness), weights move at batch boundaries only.
    reproducible: bool = False
    # Images in the prompt: the vision encoder's prior seconds per prompt prefilled on one
    # replica (``perf/vision.vision_prefill_s``); 0: text prompts.
    prompt_vision_s: float = 0.0
    # DAPO's dynamic sampling: the runtime judges every completed group
    # (``GroupsCompleted.filtered``), so the controller keeps which groups of each batch are
    # generating, for a short batch to trade one for a later batch's kept group
    # (``controller/batches.py``); and at most ``max_gen_batches`` batches' worth of groups
    # (x groups_per_step) are generated for one step, filtered ones included, the run
    # stopping (``GenerationCapError``) when a batch would need more (0: no cap, veRL's
    # max_num_gen_batches).
    filter_groups: bool = False
    max_gen_batches: int = 0

    def profiles(self) -> tuple[HardwareProfile, ModelProfile]:
        """The device and model profiles the priors are built from."""
        hw = self.hw_profile or lookup(HARDWARE, self.hardware, "hardware")
        return hw, self.model_profile or lookup(MODELS, self.model, "model")

    @property
    def n_replicas(self) -> int:
        return len(self.replica_devices)

    @property
    def n_units(self) -> int:
        return len(self.replica_devices) + len(self.train_units)

    @property
    def total_groups(self) -> int:
        return self.steps * self.groups_per_step

    def rollout_devices(self) -> tuple[int, ...]:
        return tuple(d for devs in self.replica_devices for d in devs)

    def unit_devices(self, unit: int) -> tuple[int, ...]:
        if unit < self.n_replicas:
            return self.replica_devices[unit]
        return self.train_units[unit - self.n_replicas]

    def unit_pool(self, unit: int) -> Pool:
        return Pool.ROLLOUT if unit < self.n_replicas else Pool.TRAIN

    def train_unit_ids(self) -> range:
        return range(self.n_replicas, self.n_units)


def device_layout(rollout_devices: int, train_devices: int, tp: int, per_node: int) -> dict:
    """The topology fields of a ``ClusterSpec``: replicas of ``tp`` devices on ``0 .. R-1``,
    the training pool on ``R .. R+T-1``, cut into lendable units of ``tp`` devices."""
    r = rollout_devices
    train = tuple(range(r, r + train_devices))
    return dict(replica_devices=tuple(tuple(range(i * tp, (i + 1) * tp)) for i in range(r // tp)),
                train_devices=train, train_units=tuple(train[i * tp:(i + 1) * tp] for i in range(len(train) // tp)),
                rollout_tp=tp, train_spans_nodes=len({d // per_node for d in train}) > 1, devices_per_node=per_node)
