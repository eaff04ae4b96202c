"""Hardware and model profiles: the numbers the stage-time priors are built from.

Figures are vendor datasheet values (dense bf16 tensor throughput, memory bandwidth) and
the models' published configs.  They give *priors*; the online calibration in
``stage_models`` fits the real behaviour.  ``cpu-core`` describes one core of this
project's CPU machines, so the real runtime starts from a sensible prior too.
"""

from __future__ import annotations

import math
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
    intra_node_latency_us: float = 5.0  # one hop of a collective inside a node (NVLink / PCIe)
    inter_node_latency_us: float = 10.0  # one hop of a collective across nodes (network)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    def link(self, spans_nodes: bool) -> tuple[float, float]:
        """(bytes/s, seconds per hop) of a collective inside a node or across nodes."""
        if spans_nodes:
            return self.inter_node_gbps * 1e9, self.inter_node_latency_us * 1e-6
        return self.intra_node_gbps * 1e9, self.intra_node_latency_us * 1e-6

    def all_reduce_s(self, nbytes: float, ranks: int, spans_nodes: bool, calls: int = 1) -> float:
        """An all-reduce of ``nbytes`` in total over ``ranks``, issued as ``calls`` collectives.

        ``calls x hops x latency + 2 (n-1)/n x bytes / bandwidth``: the bytes as a ring moves
        them; the latency of ``hops = 2 min(n - 1, ceil(log2 n))`` link crossings, the
        cheaper of a ring and a tree (NCCL picks per message size)."""
        if ranks <= 1:
            return 0.0
        bw, lat = self.link(spans_nodes)
        return calls * collective_hops(ranks) * lat + 2 * (ranks - 1) / ranks * nbytes / bw


def collective_hops(ranks: int) -> int:
    """Link crossings on the critical path of one all-reduce over ``ranks`` (ring or tree)."""
    return 2 * min(ranks - 1, math.ceil(math.log2(ranks))) if ranks > 1 else 0


HARDWARE: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("A6000-48GB", 48, 154.8, 768, 56, 12.5, 20, intra_node_latency_us=10.0,
                        inter_node_latency_us=20.0),
        HardwareProfile("H100-80GB", 80, 989.0, 3350, 450, 50, 50),
        HardwareProfile("H200-141GB", 141, 989.0, 4800, 450, 50, 50),
        HardwareProfile("A100-80GB", 80, 312.0, 2039, 300, 25, 25),
        HardwareProfile(
            "cpu-core", 8, 0.05, 10, 5, 1, 10, devices_per_node=2,
            decode_efficiency=0.5, train_mfu=0.3, engine_wake_s=0.5, trainer_wake_s=0.2,
            intra_node_latency_us=20.0, inter_node_latency_us=50.0,
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
    active_params: float = 0.0  # parameters one token runs through (experts; a VL model's text part); 0: params
    # A vision-language model's vision tower (0: none); ``perf/vision.py`` prices an image with them.
    vision_params: float = 0.0  # the tower's parameters, counted in ``params``
    vision_merger_params: float = 0.0  # of which the patch mergers, run once per merged token
    vision_hidden: int = 0
    vision_attention_layers: int = 0  # tower layers attending over the whole image (not windowed)
    vision_patch: int = 0  # pixels per patch side
    vision_merge: int = 1  # patches merged per side into one language-model token

    @property
    def weights_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer, one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token from the weights it runs through (2 x active params)."""
        return 2.0 * (self.active_params or self.params)

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
        # Vision-language models: config.json of Qwen/Qwen3-VL-4B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct.
        # The text parts are Qwen3-4B's and Qwen2.5-7B's (active_params: what a text token runs
        # through); the towers' parameters are counted by transformers on the meta device
        # (Qwen3VLVisionModel: 24 blocks of hidden 1024, patch 16, 2 x 2 merge, 3 deepstack
        # mergers; Qwen2_5_VisionTransformerPretrainedModel: 32 blocks of hidden 1280, patch 14,
        # window attention except in 4 layers), the mergers' share from their shapes.
        ModelProfile("Qwen3-VL-4B", 4.02e9 + 415_347_712, 36, 2560, 32, 8, 128, 151936, active_params=4.02e9,
                     vision_params=415_347_712, vision_merger_params=109_105_152, vision_hidden=1024,
                     vision_attention_layers=24, vision_patch=16, vision_merge=2),
        ModelProfile("Qwen2.5-VL-7B", 7.62e9 + 676_550_144, 28, 3584, 28, 4, 128, 152064, active_params=7.62e9,
                     vision_params=676_550_144, vision_merger_params=44_574_464, vision_hidden=1280,
                     vision_attention_layers=4, vision_patch=14, vision_merge=2),
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


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def hf_shape(config: dict) -> dict:
    """The fields of a ``ModelProfile`` from a Hugging Face ``config.json`` (parsed).

    Dense decoders (Llama, Qwen2/3, Mistral, ...) and mixtures of experts (``num_experts`` or
    ``num_local_experts`` with ``num_experts_per_tok``); a multimodal config's
    ``text_config`` is read.  Parameters are counted from the shapes: embeddings (twice
    unless ``tie_word_embeddings``), per layer the attention projections, the (gated) MLP
    or its experts and router, and the norms.  A missing key raises ``KeyError`` naming it.
    """
    c = config.get("text_config", config) if "hidden_size" not in config else config

    def need(key: str):
        if key not in c:
            raise KeyError(key)
        return c[key]

    hidden, layers, heads = int(need("hidden_size")), int(need("num_hidden_layers")), int(need("num_attention_heads"))
    kv = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    vocab = int(need("vocab_size"))
    attn = hidden * head_dim * (2 * heads + 2 * kv)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or 0)
    if experts:
        inter = int(c.get("moe_intermediate_size") or need("intermediate_size"))
        top = int(need("num_experts_per_tok"))
        shared = 3 * hidden * int(c.get("shared_expert_intermediate_size") or 0)
        mlp, active_mlp = experts * 3 * hidden * inter + hidden * experts + shared, top * 3 * hidden * inter + shared
    else:
        mlp = active_mlp = 3 * hidden * int(need("intermediate_size"))
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    params = embed + layers * (attn + mlp + 2 * hidden) + hidden
    active = embed + layers * (attn + active_mlp + 2 * hidden) + hidden
    dtype = str(c.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return {"params": float(params), "active_params": float(active) if experts else 0.0, "layers": layers,
            "hidden": hidden, "heads": heads, "kv_heads": kv, "head_dim": head_dim, "vocab": vocab,
            "bytes_per_param": DTYPE_BYTES.get(dtype, 2)}
