"""Hardware and model profiles: the numbers the stage-time priors are built from.

Figures are vendor datasheet values (dense bf16 tensor throughput, memory bandwidth) and
the models' published configs.  They give *priors*; the online calibration in
``stage_models`` fits the real behaviour.  ``cpu-core`` describes one core of this
project's CPU machines, so the real runtime starts from a sensible prior too.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    memory_gib: float
    peak_tflops: float  # dense bf16 (fp32 for cpu-core)
    hbm_gbps: float  # device memory bandwidth, GB/s
    intra_node_gbps: float  # per-direction device-to-device bandwidth inside a node
    inter_node_gbps: float  # per-device network bandwidth across nodes
    host_gbps: float  # host <-> device copy bandwidth (offload / onload)
    devices_per_node: int = 8
    decode_efficiency: float = 0.6  # fraction of roofline reached in decode
    train_mfu: float = 0.4  # model-flops utilisation in training
    engine_wake_s: float = 3.0  # fixed cost to wake a slept inference engine (+ graphs)
    trainer_wake_s: float = 2.5  # fixed cost to bring an auxiliary trainer up

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


HARDWARE: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("A6000-48GB", 48, 154.8, 768, 56, 12.5, 20),
        HardwareProfile("H100-80GB", 80, 989.0, 3350, 450, 50, 50),
        HardwareProfile("H200-141GB", 141, 989.0, 4800, 450, 50, 50),
        HardwareProfile("A100-80GB", 80, 312.0, 2039, 300, 25, 25),
        HardwareProfile(
            "cpu-core", 8, 0.05, 10, 5, 1, 10, devices_per_node=2,
            decode_efficiency=0.5, train_mfu=0.3, engine_wake_s=0.5, trainer_wake_s=0.2,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    params: float  # parameter count
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bytes_per_param: int = 2  # bf16

    @property
    def weights_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer, one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token from the dense weights (2 x params)."""
        return 2.0 * self.params

    def attention_flops_per_token(self, context: float) -> float:
        """Forward attention-score FLOPs for one token attending to ``context`` tokens."""
        return 4.0 * self.layers * self.heads * self.head_dim * context


MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("Qwen3-4B", 4.02e9, 36, 2560, 32, 8, 128, 151936),
        ModelProfile("Qwen3-8B", 8.19e9, 36, 4096, 32, 8, 128, 151936),
        ModelProfile("Qwen2.5-7B", 7.62e9, 28, 3584, 28, 4, 128, 152064),
        ModelProfile("Qwen3-14B", 14.8e9, 40, 5120, 40, 8, 128, 151936),
        ModelProfile("Qwen3-32B", 32.8e9, 64, 5120, 64, 8, 128, 151936),
        # The model bidirl builds for CPU runs (2 layers, hidden 128, fp32).
        ModelProfile("tiny-qwen2", 0.5e6, 2, 128, 4, 2, 32, 64, bytes_per_param=4),
    )
}


def lookup(table: dict, name: str, what: str):
    """Find a profile by name or fail with the allowed names."""
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; allowed: {', '.join(sorted(table))}") from None
