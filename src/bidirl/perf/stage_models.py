"""Stage-time models: how long a decode step, a prefill, a micro-batch or a sync takes.

Every model is linear in physical features so that it can be calibrated online
(``calibration.LinearTimeModel``); the priors are rooflines from the hardware and model
profiles::

    decode step  t = a + c * b + k * S          b = running sequences, S = sum of contexts
                 a: read the weights shard once (memory bound) + fixed step overhead
                    (+ the latency of the tensor-parallel all-reduces, 2 per layer)
                 c: dense FLOPs per token (+ the all-reduces' bytes per token)
                 k: read one token's KV cache (memory bound)
    prefill      t = a_p + c_p * tokens
                 (images in the prompt: the vision encoder's seconds per prompt, ``perf/vision.py``,
                 spread over the prompt's tokens: exact for whole prompts, the case of every new
                 group; a resumed prefix or a re-prefill is priced as if its tokens were prompt tokens)
    micro-batch  t = a_m + c_m * tokens + q_m * tokens * seq_len     (fwd + bwd = 3x fwd;
                 tp > 1: 4 all-reduces per layer, latency in a_m, bytes per token in c_m)
    step sync    t = a_s + wire,  wire = buckets x hops x latency + grad bytes / bandwidth
                 (data-parallel all-reduce in ``GRAD_BUCKET_BYTES`` buckets)

Collectives cost ``HardwareProfile.all_reduce_s``: a latency per link crossing and the
bytes over the bandwidth, inside a node or across nodes.
    weight sync  t = a_w + bytes_moved / bandwidth   (bytes_moved: a delta's, else weights_bytes)

A replica's throughput follows from the decode model, so long tails appear by
themselves when a few long responses keep a replica stepping at tiny batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bidirl.perf.calibration import LinearTimeModel
from bidirl.perf.profiles import HardwareProfile, ModelProfile

STEP_OVERHEAD_S = 1.5e-3  # scheduler + launch overhead per decode step on a GPU engine
KV_MEMORY_FRACTION = 0.9  # vLLM's gpu_memory_utilization default
MAX_NUM_SEQS = 256  # vLLM's default cap on concurrent sequences per replica
GRAD_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default gradient bucket
TP_ALL_REDUCES_TRAIN = 4  # per layer and micro-batch: 2 forward (attention, MLP), 2 backward


def _tp_spans(hw: HardwareProfile, tp: int) -> bool:
    return tp > hw.devices_per_node


def decode_prior(hw: HardwareProfile, m: ModelProfile, tp: int) -> tuple[float, float, float]:
    bw = hw.hbm_gbps * 1e9 * hw.decode_efficiency
    flops = hw.peak_tflops * 1e12 * hw.decode_efficiency
    a = m.weights_bytes / tp / bw + STEP_OVERHEAD_S * (hw.name != "cpu-core")
    c = m.flops_per_token / tp / flops
    if tp > 1:  # two all-reduces of the hidden state per layer: latency per step, bytes per token
        spans = _tp_spans(hw, tp)
        a += hw.all_reduce_s(0.0, tp, spans, calls=2 * m.layers)
        c += hw.all_reduce_s(2 * m.layers * m.hidden * m.bytes_per_param, tp, spans) - \
            hw.all_reduce_s(0.0, tp, spans)
    k = m.kv_bytes_per_token / tp / bw + m.attention_flops_per_token(1) / tp / flops
    return (a, c, k)


def train_prior(hw: HardwareProfile, m: ModelProfile, tp: int) -> tuple[float, float, float]:
    flops = hw.peak_tflops * 1e12 * hw.train_mfu
    a = 5e-3
    c = 3 * m.flops_per_token / tp / flops
    q = 3 * m.attention_flops_per_token(1) / tp / flops / 2  # causal: half the square
    if tp > 1:  # the tensor-parallel all-reduces of the activations, forward and backward
        spans, calls = _tp_spans(hw, tp), TP_ALL_REDUCES_TRAIN * m.layers
        a += hw.all_reduce_s(0.0, tp, spans, calls=calls)
        c += hw.all_reduce_s(calls * m.hidden * m.bytes_per_param, tp, spans) - hw.all_reduce_s(0.0, tp, spans)
    return (a, c, q)


@dataclass
class RolloutStageModel:
    """Decode and prefill time of one rollout replica (``tp`` devices)."""

    hw: HardwareProfile
    model: ModelProfile
    tp: int = 1
    prior_scale: float = 1.0  # >1: a deliberately pessimistic prior (tests calibration)
    decode: LinearTimeModel = field(init=False)
    prefill: LinearTimeModel = field(init=False)
    refit_every: int = 1
    vision_s_per_prompt: float = 0.0  # the vision encoder's seconds per prompt (perf/vision.py)
    prompt_tokens: float = 0.0  # tokens of a prompt, its image tokens included

    def __post_init__(self) -> None:
        p = tuple(x * self.prior_scale for x in decode_prior(self.hw, self.model, self.tp))
        self.decode = LinearTimeModel("decode", p, refit_every=self.refit_every)
        flops = self.hw.peak_tflops * 1e12 * max(self.hw.train_mfu, 0.3)
        vision = self.vision_s_per_prompt / self.prompt_tokens if self.prompt_tokens > 0 else 0.0
        pp = (2e-3 * self.prior_scale,
              (self.model.flops_per_token / self.tp / flops + vision) * self.prior_scale)
        self.prefill = LinearTimeModel("prefill", pp, refit_every=self.refit_every)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        return self.decode.predict((1.0, batch, context_tokens))

    def prefill_s(self, tokens: float) -> float:
        return self.prefill.predict((1.0, tokens)) if tokens > 0 else 0.0

    def tokens_per_s(self, batch: int, mean_context: float) -> float:
        """Steady decode throughput of the replica at a given running batch."""
        if batch <= 0:
            return 0.0
        return batch / self.decode_step_s(batch, batch * mean_context)


def max_concurrency(hw: HardwareProfile, m: ModelProfile, tp: int, context_tokens: float,
                    max_num_seqs: int = MAX_NUM_SEQS) -> int:
    """Sequences a replica can hold at once when each needs ``context_tokens`` of KV.

    0 means the weights shard does not even fit.  The activation reserve is 5 % of memory.
    """
    budget = hw.memory_bytes * tp * (KV_MEMORY_FRACTION - 0.05) - m.weights_bytes
    if budget <= 0:
        return 0
    per_seq = m.kv_bytes_per_token * max(context_tokens, 1.0)
    return max(0, min(max_num_seqs, int(budget // per_seq)))


@dataclass
class TrainStageModel:
    """Time of one training micro-batch on one data-parallel rank, and of step sync."""

    hw: HardwareProfile
    model: ModelProfile
    tp: int = 1
    prior_scale: float = 1.0
    micro: LinearTimeModel = field(init=False)
    sync: LinearTimeModel = field(init=False)
    refit_every: int = 1

    def __post_init__(self) -> None:
        p = tuple(x * self.prior_scale for x in train_prior(self.hw, self.model, self.tp))
        self.micro = LinearTimeModel("train_micro", p, refit_every=self.refit_every)
        self.sync = LinearTimeModel("train_sync", (0.05 * self.prior_scale, self.prior_scale),
                                    refit_every=self.refit_every)

    def microbatch_s(self, tokens: float, seq_len: float) -> float:
        return self.micro.predict((1.0, tokens, tokens * seq_len))

    def grad_wire_s(self, dp: int, spans_nodes: bool) -> float:
        """The gradients' all-reduce over ``dp`` ranks on the wire: its buckets' latency
        and its bytes over the bandwidth (``HardwareProfile.all_reduce_s``)."""
        if dp <= 1:
            return 0.0
        grad_bytes = self.model.params * 4 / self.tp  # fp32 gradients
        buckets = max(1, math.ceil(grad_bytes / GRAD_BUCKET_BYTES))
        return self.hw.all_reduce_s(grad_bytes, dp, spans_nodes, calls=buckets)

    def sync_s(self, dp: int, spans_nodes: bool) -> float:
        if dp <= 1:
            return 0.0
        return self.sync.predict((1.0, self.grad_wire_s(dp, spans_nodes)))

    def optimizer_s(self) -> float:
        """AdamW reads/writes ~16 bytes per parameter (fp32 master, m, v, grad)."""
        return 16 * self.model.params / self.tp / (self.hw.hbm_gbps * 1e9 * 0.7)

    def step_s(self, micro_tokens: list[float], seq_len: float, dp: int,
               spans_nodes: bool = False) -> float:
        """Predicted step time: micro-batches dealt round-robin to ``dp`` ranks."""
        if dp <= 0:
            raise ValueError("dp must be >= 1")
        per_rank = [0.0] * dp
        for i, tok in enumerate(micro_tokens):
            per_rank[i % dp] += self.microbatch_s(tok, seq_len)
        return max(per_rank) + self.sync_s(dp, spans_nodes) + self.optimizer_s()


def weight_sync_prior(hw: HardwareProfile, spans_nodes: bool = True,
                      s_per_gb: float | None = None) -> tuple[float, float]:
    """(latency s, seconds per GB moved) of pushing weights to the replicas: the weight-sync
    model's coefficients; ``s_per_gb`` a measured transport's (``bench/weight_sync.py``,
    ``costs.weight_sync_s_per_gb``) instead of the link's bandwidth."""
    if s_per_gb is None:
        s_per_gb = 1.0 / (hw.inter_node_gbps if spans_nodes else hw.intra_node_gbps)
    return 0.2, s_per_gb


def weight_sync_s(hw: HardwareProfile, m: ModelProfile, spans_nodes: bool = True,
                  s_per_gb: float | None = None) -> float:
    """Prior for pushing new weights from the trainer to the rollout replicas (broadcast)."""
    latency, per_gb = weight_sync_prior(hw, spans_nodes, s_per_gb)
    return latency + m.weights_bytes / 1e9 * per_gb

