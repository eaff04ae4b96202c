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
