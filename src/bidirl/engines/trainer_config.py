"""The trainer's configuration: one class for the train config's ``trainer`` section and
for ``TorchTrainer`` (torch-free, so the config loader and ``--help`` need no torch).

Why these defaults: they are what ``bidirl train`` ran with before the two trainer
configs were merged, so the default run does not change.  The session passed the train
config's ``lr`` (1e-3), ``clip_eps_high`` (0.28, DAPO's clip-higher), ``clip_eps_low``,
``max_grad_norm``, ``kl_coef`` and ``weight_decay`` to the torch trainer, whose own
defaults (lr 1e-4, clip_eps_high 0.2) therefore never applied to a run; ``betas`` and
``adam_eps`` were the torch trainer's and are kept.  ``micro_batch_size`` (16) sizes the
scheduler's micro-batches; the runtime hands the trainer explicit micro-batches, so the
torch trainer's old default (8) only ever applied to direct ``train_step(samples)`` calls.
Device and seed are not trainer settings: they come from ``cluster.device`` and
``run.seed`` (``trainer_wire`` below is the one place the runtime bundles them).

``on_nonfinite`` is what happens when a step's loss or gradient norm is not finite (a
NaN reward that got through, an overflow): ``skip`` leaves the weights and the optimizer
state as they were and counts the step (``actor/skipped_steps``); ``stop`` raises
:class:`NonFiniteStepError`, so the run ends with its last checkpoint intact.  The
exceptions live here, torch-free, so the CLI can map them to one-line errors.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.core.typed_config import as_dict, build, check_fields, option


class NonFiniteError(RuntimeError):
    """Training met a non-finite loss, gradient or weight (reported in one line)."""


class NonFiniteStepError(NonFiniteError):
    """A step's loss or gradient norm was not finite and ``on_nonfinite`` is ``stop``."""


class NonFiniteWeightsError(NonFiniteError):
    """Refused to write (save) weights that hold NaN or inf."""


@dataclass(frozen=True)
class TrainerConfig:
    """GRPO trainer settings (AdamW, PPO-style clipping, optional KL to the reference).

    The rest of the objective (estimator, loss, aggregation, KL estimator, entropy,
    off-policy correction) is the train config's ``algorithm`` section
    (``algo/algorithm_config.py``), which is not resume-safe as this section is."""

    lr: float = option(1e-3, "AdamW learning rate (the peak, with a warm-up or schedule)", gt=0, lt=1)
    lr_warmup_steps: int = option(0, "steps of linear warm-up from lr/warmup to lr", ge=0)
    lr_schedule: Literal["constant", "cosine", "linear"] = option(
        "constant", "after the warm-up: keep lr, or decay it (cosine or linear) to lr * lr_min_ratio at "
        "lr_decay_steps")
    lr_min_ratio: float = option(0.0, "the decayed schedules' final lr, as a fraction of lr", ge=0, le=1)
    lr_decay_steps: int | None = option(None, "the step where a decaying schedule ends; null: run.steps", ge=1)
    micro_batch_size: int = option(16, "sequences per micro-batch (gradient accumulation)", ge=1)
    padding_split_tokens: int | None = option(
        64, "a micro-batch is computed as the length-sorted sub-batches that minimise padded tokens + "
        "this many tokens per sub-batch (the cost of one more pass); null: one batch padded to its "
        "longest sequence", ge=0)
    max_grad_norm: float | None = option(1.0, "global grad-norm clip after the DP all-reduce; null disables",
                                         gt=0)
    clip_eps_low: float = option(0.2, "lower PPO clip: ratio >= 1 - clip_eps_low", ge=0, lt=1)
    clip_eps_high: float = option(0.28, "upper PPO clip: ratio <= 1 + clip_eps_high (clip-higher)", ge=0)
    kl_coef: float = option(0.0, "weight of the KL to the reference (initial) policy (estimator: "
                            "algorithm.kl_loss_type); 0 disables", ge=0)
    weight_decay: float = option(0.0, "AdamW weight decay", ge=0)
    betas: tuple[float, float] = option((0.9, 0.999), "AdamW betas")
    adam_eps: float = option(1e-8, "AdamW epsilon", gt=0)
    threads: int = option(1, "torch intra-op threads per device worker", ge=1)
    strategy: Literal["ddp", "fsdp2"] = option(
        "ddp", "how the primary trainer's ranks (cluster.train_devices) hold the model: ddp, a full copy each "
        "(gradients all-reduced); fsdp2, torch's fully_shard per decoder layer + root (fp32 master weights, "
        "gradients and AdamW state sharded over the ranks; auxiliaries stay full copies)")
    mixed_precision: Literal["none", "bf16"] = option(
        "none", "bf16: forward and backward under bf16 autocast (weights, gradients and AdamW stay fp32); "
        "none: fp32 throughout")
    activation_checkpointing: bool = option(
        False, "recompute each decoder layer's activations in the backward (HF gradient checkpointing): "
        "less memory per micro-batch, about one more forward pass of time")
    on_nonfinite: Literal["skip", "stop"] = option(
        "skip", "a step whose loss or grad norm is NaN/inf: skip it (weights and optimizer state "
        "unchanged, counted in actor/skipped_steps) or stop the run (the last checkpoint stays good)")

    def __post_init__(self) -> None:
        check_fields(self)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based: the trainer's version before it).

        A function of the step alone, so a resumed trainer (whose version is restored from
        its checkpoint) continues the schedule where it was.  Warm-up: ``lr * (step + 1) /
        lr_warmup_steps`` for the first ``lr_warmup_steps`` steps; then ``constant`` keeps
        ``lr``, ``cosine`` and ``linear`` go from ``lr`` to ``lr * lr_min_ratio`` between the
        end of the warm-up and ``lr_decay_steps`` (staying there after it).
        """
        warm = self.lr_warmup_steps
        if step < warm:
            return self.lr * (step + 1) / warm
        if self.lr_schedule == "constant":
            return self.lr
        end = self.lr_decay_steps
        if end is None:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} needs lr_decay_steps (the runtime sets run.steps)")
        span = max(1, end - warm)
        progress = min(1.0, max(0.0, (step - warm) / span))
        if self.lr_schedule == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            shape = 1.0 - progress
        return self.lr * (self.lr_min_ratio + (1.0 - self.lr_min_ratio) * shape)


def trainer_wire(cfg: TrainerConfig, device: str, seed: int, steps: int | None = None,
                 algorithm: AlgorithmConfig | None = None, max_new_tokens: int | None = None,
                 freeze_vision_tower: bool = False, lora: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a device worker is sent to build a trainer: plain data (it crosses Ray).

    ``steps`` (``run.steps``) fills ``lr_decay_steps`` when it is null; ``algorithm`` (the
    train config's ``algorithm`` section; None: the defaults) goes along, its null
    ``loss_scale_factor`` filled with ``max_new_tokens`` (``rollout.max_new_tokens``).
    ``freeze_vision_tower`` is ``model.freeze_vision_tower`` (sent only when set), ``lora``
    the ``model.lora_*`` fields (``LoraSettings.wire()``; sent only when LoRA is on)."""
    if steps is not None and cfg.lr_decay_steps is None:
        cfg = dataclasses.replace(cfg, lr_decay_steps=steps)
    algorithm = algorithm or AlgorithmConfig()
    if max_new_tokens is not None and algorithm.loss_scale_factor is None:
        algorithm = dataclasses.replace(algorithm, loss_scale_factor=max_new_tokens)
    wire = {"config": as_dict(cfg), "algorithm": as_dict(algorithm), "device": device, "seed": seed}
    if freeze_vision_tower:
        wire["freeze_vision_tower"] = True
    if lora:
        wire["lora"] = lora
    return wire


def from_wire(wire: dict[str, Any], threads: int | None = None
              ) -> tuple[TrainerConfig, AlgorithmConfig, str, int]:
    """``trainer_wire``'s inverse; ``threads`` (the worker's own setting) wins if given."""
    unknown = sorted(set(wire) - {"config", "algorithm", "device", "seed", "freeze_vision_tower", "lora"})
    if unknown:  # e.g. a flat {"lr": ...}: silently dropping it would train with defaults
        raise ValueError(f"trainer wire: unknown keys {unknown}; build it with trainer_wire(...)")
    data = dict(wire.get("config", {}))
    if threads is not None:
        data["threads"] = threads
    return (build(TrainerConfig, data, "trainer"), build(AlgorithmConfig, dict(wire.get("algorithm", {})), "algorithm"),
            wire.get("device", "cpu"), int(wire.get("seed", 0)))


def merges_by_index(wire: dict[str, Any] | None, ranks: int) -> bool:
    """Whether a step's micro-batch ``i`` is merged by rank ``i % ranks`` whoever computed it
    (a sharded primary: ``strategy=fsdp2`` over several ranks), so that the update does not
    depend on which micro-batches auxiliaries took (``TorchTrainer``'s docstring)."""
    return ranks > 1 and ((wire or {}).get("config") or {}).get("strategy") == "fsdp2"
