"""Per-device memory model of each role, and of what sits in host memory while a device is lent.

Bytes per device (``P`` parameters, ``shard`` = devices one copy of the state is split over)::

    rollout replica (tp)      weights 2P/tp + KV(concurrency x context)/tp + reserve 5 %
    primary trainer           params 2P/shard + grads 4P/shard + AdamW 12P/shard
      shard = tp x dp (FSDP)  (fp32 master, m, v) + gathered layers (FSDP: 2 layers in
      or tp (DDP)             flight) + activations of one micro-batch / tp
    auxiliary trainer         params 2P/group + fp32 grad accumulator 4P/group + gathered
      (group devices, FSDP)   layers + activations of one micro-batch / tp.  No optimizer:
                              the primary trainer is the sole optimizer.
    activations per token     checkpointed layer inputs (layers x hidden x 2 B) + one layer
                              recomputed (16 x hidden x 2 B) + fp32 logits (vocab x 4 B)

Every role gets ``KV_MEMORY_FRACTION`` (90 %) of the device, as vLLM's default
``gpu_memory_utilization`` does; the remaining 10 % is the framework's (CUDA context,
allocator slack).  The rollout reserve of 5 % matches ``perf.stage_models.max_concurrency``
so that the planner's concurrency is the one the stage-time models use.

While a device is lent, its own role's state waits in host memory: a trainer device
offloads params and optimizer state (gradients are empty between steps, when lending
happens); a rollout device offloads its weights shard (its KV cache is discarded: a lent
replica holds no running sequences).  Host memory per device is not in the hardware
profiles; ``HOST_MEMORY_GIB_PER_DEVICE`` holds the planner's assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.perf.profiles import GIB, HardwareProfile, ModelProfile
from bidirl.perf.stage_models import KV_MEMORY_FRACTION, MAX_NUM_SEQS

ROLLOUT_RESERVE_FRACTION = 0.05
ADAM_BYTES_PER_PARAM = 12  # fp32 master weights, first and second moments
GRAD_BYTES_PER_PARAM = 4  # fp32 gradients (as TrainStageModel's all-reduce assumes)
LAYER_WORKSET_HIDDENS = 16  # hidden-sized bf16 tensors alive while one layer is recomputed
FSDP_LAYERS_IN_FLIGHT = 2  # the gathered layer and the prefetched next one
# Typical GPU servers carry 1-2 TB of host memory per 8 devices; a CPU "device" is a core
# of a small machine.
HOST_MEMORY_GIB_PER_DEVICE = {"cpu-core": 4.0}
DEFAULT_HOST_MEMORY_GIB = 128.0


def usable_bytes(hw: HardwareProfile) -> float:
    return hw.memory_bytes * KV_MEMORY_FRACTION


def host_bytes(hw: HardwareProfile) -> float:
    return HOST_MEMORY_GIB_PER_DEVICE.get(hw.name, DEFAULT_HOST_MEMORY_GIB) * GIB


@dataclass(frozen=True)
class MemoryNeed:
    """What one device of ``role`` needs, part by part, against what it has."""

    role: str
    parts: dict[str, float]
    budget: float

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def describe(self) -> str:
        parts = " + ".join(f"{k} {v / GIB:.2f}" for k, v in self.parts.items() if v > 0)
        return (f"{self.role} needs {self.total / GIB:.2f} GiB/device ({parts}) {'<=' if self.fits else '>'} "
                f"{self.budget / GIB:.2f} GiB usable")


def rollout_need(hw: HardwareProfile, m: ModelProfile, tp: int, concurrency: int,
                 context_tokens: float) -> MemoryNeed:
    kv = m.kv_bytes_per_token * concurrency * context_tokens / tp
    return MemoryNeed(
        f"rollout replica (tp={tp}, {concurrency} seqs x {context_tokens:.0f} tokens)",
        {"weights": m.weights_bytes / tp, "kv": kv,
         "reserve": hw.memory_bytes * ROLLOUT_RESERVE_FRACTION},
        usable_bytes(hw))


def rollout_concurrency(hw: HardwareProfile, m: ModelProfile, tp: int,
                        context_tokens: float) -> int:
    """Sequences of ``context_tokens`` a replica holds at once (0: weights do not fit)."""
    free = tp * (usable_bytes(hw) - hw.memory_bytes * ROLLOUT_RESERVE_FRACTION) - m.weights_bytes
    return max(0, min(MAX_NUM_SEQS, int(free // (m.kv_bytes_per_token * context_tokens))))


def activation_bytes(m: ModelProfile, micro_tokens: float, tp: int) -> dict[str, float]:
    per_token = (m.layers + LAYER_WORKSET_HIDDENS) * m.hidden * 2
    return {"activations": micro_tokens * per_token / tp,
            "logits": micro_tokens * m.vocab * 4 / tp}


def trainer_need(hw: HardwareProfile, m: ModelProfile, dp: int, tp: int, sharded: bool,
                 micro_tokens: float) -> MemoryNeed:
    shard = tp * (dp if sharded else 1)
    gathered = (FSDP_LAYERS_IN_FLIGHT * 2 * m.params / (m.layers * tp)
                if sharded and dp > 1 else 0.0)
    parts = {"params": 2 * m.params / shard, "grads": GRAD_BYTES_PER_PARAM * m.params / shard,
             "optimizer": ADAM_BYTES_PER_PARAM * m.params / shard, "gathered": gathered,
             **activation_bytes(m, micro_tokens, tp)}
    return MemoryNeed(f"trainer (dp={dp}, tp={tp}, {'fsdp' if sharded else 'ddp'})", parts, usable_bytes(hw))


def aux_trainer_need(hw: HardwareProfile, m: ModelProfile, group: int, tp: int,
                     micro_tokens: float) -> MemoryNeed:
    gathered = FSDP_LAYERS_IN_FLIGHT * 2 * m.params / (m.layers * tp) if group > tp else 0.0
    parts = {"params": 2 * m.params / group, "grads": GRAD_BYTES_PER_PARAM * m.params / group,
             "gathered": gathered, **activation_bytes(m, micro_tokens, tp)}
    return MemoryNeed(f"auxiliary trainer ({group} devices, tp={tp})", parts, usable_bytes(hw))


def trainer_offload_bytes(need: MemoryNeed) -> float:
    """Host bytes a lent trainer device parks: params and optimizer state."""
    return need.parts["params"] + need.parts["optimizer"]


def rollout_offload_bytes(m: ModelProfile, tp: int) -> float:
    """Host bytes a lent rollout device parks: its weights shard."""
    return m.weights_bytes / tp


# -- the real trainer's state against a device's budget (cluster.device_memory_gib) ------------------
FP32_BYTES = 4  # the runtime trainer keeps weights, gradients and AdamW's moments in fp32


def trainer_state_bytes(params: float, strategy: str, ranks: int) -> dict[str, float]:
    """Bytes one primary rank of the runtime trainer (``engines/trainer_torch.py``) holds for
    ``params`` parameters, part by part.

    ``ddp`` (or ``fsdp2`` on one rank, which has nothing to shard): weights, gradients and
    AdamW's two moments, whole.  ``fsdp2`` over ``ranks``: the master weights' rows and the
    moments' rows (``1/ranks`` each), plus what stays whole because a rank computes
    micro-batches on its own (``engines/sharding.py``): the gathered weights and one
    micro-batch's gradient.  Activations are not counted (they depend on the micro-batch,
    and ``trainer.activation_checkpointing`` trims them)."""
    if strategy not in ("ddp", "fsdp2"):
        raise ValueError(f"trainer strategy {strategy!r}; allowed: ddp, fsdp2")
    whole = FP32_BYTES * params
    if strategy == "ddp" or ranks <= 1:
        return {"weights": whole, "grads": whole, "adamw": 2 * whole}
    return {"gathered weights": whole, "grads": whole, "weight shard": whole / ranks,
            "adamw shard": 2 * whole / ranks}


def trainer_budget_problem(params: float, strategy: str, ranks: int, budget_gib: float | None,
                           field: str = "cluster.device_memory_gib") -> str | None:
    """Why the primary trainer's state does not fit a device's budget (one line naming
    ``field`` and what would fit), or None; no budget (None): no check."""
    if budget_gib is None:
        return None
    parts = trainer_state_bytes(params, strategy, ranks)
    need = sum(parts.values())
    if need <= budget_gib * GIB:
        return None
    shown = " + ".join(f"{k} {v / GIB:.3g}" for k, v in parts.items())
    what = (f"{field}={budget_gib:g}: the trainer's state needs {need / GIB:.3g} GiB per device ({shown}) with "
            f"trainer.strategy={strategy} over {ranks} rank(s)")
    sharded = sum(trainer_state_bytes(params, "fsdp2", ranks).values())
    if strategy == "ddp" and ranks > 1 and sharded <= budget_gib * GIB:
        return f"{what}; set trainer.strategy=fsdp2 (each rank then needs {sharded / GIB:.3g} GiB)"
    hint = "trainer.strategy=fsdp2 and more" if strategy == "ddp" else "more"
    return (f"{what}; use {hint} cluster.train_devices (the shards shrink, the gathered weights and one "
            "gradient do not), or a larger budget")
