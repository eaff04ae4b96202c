"""Torch GRPO trainer whose gradient computation is separable from the optimizer step.

Why separable: in BiDiRL an *auxiliary* trainer on a borrowed rollout device computes the
gradients of some micro-batches, and the *primary* trainer (the only owner of the optimizer and
the version counter) merges them. So the unit of work is::

    chunk = trainer.compute_chunk_grads(microbatches, totals)         # anywhere
    trainer.apply_grads([chunk_0, chunk_1, ...])                      # primary only

and :meth:`TorchTrainer.train_step` is literally ``apply_grads([compute_chunk_grads(all)])``.

Ordered, bitwise-reproducible merge: every micro-batch gradient ``g_i`` is computed from zero
(``p.grad = None`` before its backward) and the step's gradient is the left fold
``((g_0 + g_1) + g_2) + ...`` in micro-batch order. A chunk computed with
``per_microbatch=True`` ships its ``g_i`` unsummed, so ``apply_grads`` performs exactly that
fold whatever the partition into chunks and whichever device computed them: borrowing never
changes the trained weights, bit for bit. ``per_microbatch=False`` ships one pre-summed array
per chunk (less traffic, equal only up to float rounding when there are several chunks).

Every loss is divided by the *step's* totals (tokens and sequences of the whole batch,
:class:`~bidirl.algo.aggregation.StepTotals`), passed to every chunk, whatever the
aggregation mode or policy loss (``algorithm.*``): each micro-batch's gradient is then a
plain summand of the step's, so the fold above equals one trainer's for every mode (see
:mod:`bidirl.algo.aggregation`).  Data parallel: each rank holds a different slice of the
batch and the same global totals, so the all-reduce is a SUM (``engines/dp_reduce.py``),
and DP=k reproduces DP=1 up to float rounding.

Sharded (``strategy=fsdp2`` with a group of several ranks, ``engines/sharding.py``): the
master weights, gradients and AdamW state the optimizer steps are each rank's rows; the
passes run on the gathered weights, so a micro-batch's gradient is computed exactly as by
a full-copy trainer (an auxiliary's equals a primary rank's, bit for bit).  ``apply_grads``
folds the per-micro-batch gradients it is given in order, as above, then the ranks' folds
are reduce-scattered with SUM and each rank keeps its rows.  Which rank folds which
micro-batch is the driver's: for a sharded primary, micro-batch ``i`` goes to rank ``i %
ranks`` whoever computed it, a primary rank or an auxiliary (``merges_by_index``), so the
update is one fixed sum of the ``g_i`` however a step was shared out, and reproducible
mode stays bitwise across borrowing.  ``mixed_precision=bf16`` is autocast over the passes
(not FSDP's ``MixedPrecisionPolicy``): the weights a rank holds and ships stay fp32, and an
auxiliary computes the same bf16 operations as the primary.

Non-finite guard: ``apply_grads`` checks the all-reduced loss and gradient norm before the
optimizer step; a NaN/inf skips the step or stops the run (``TrainerConfig.on_nonfinite``),
and no checkpoint or model directory is ever written with non-finite weights.

Gradients and weights cross process boundaries as ``{name: np.ndarray}`` (flat fp32 for
gradients): numpy moves through Ray's object store about 10x faster than torch tensors.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bidirl.algo.aggregation import StepTotals, merge_metrics
from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.algo.objective import policy_objective
from bidirl.engines.dp_reduce import all_reduce_step, global_totals, reduce_metrics
from bidirl.engines.hf_io import auto_model_class, is_vision_language
from bidirl.engines.lora import LoraSettings, adapter_parameters, with_lora
from bidirl.engines.policy_forward import forward_logp, loss_settings, reference_kl_sums, reference_logp
from bidirl.engines.sharding import ShardedModel
from bidirl.engines.torch_setup import set_torch_threads
from bidirl.engines.train_batch import (
    GradChunk,
    Microbatch,
    TrainSample,
    collate,
    count_tokens,
    make_microbatches,
    padding_split,
    step_totals,
)
from bidirl.engines.trainer_config import NonFiniteStepError, TrainerConfig
from bidirl.engines.trainer_files import TrainerFiles
from bidirl.engines.vision_inputs import VisionInputs, vision_parameter_names

__all__ = ["TorchTrainer"]


class TorchTrainer(TrainerFiles):
    """Holds an HF causal LM and its AdamW state; computes and applies GRPO gradients."""

    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None, process_group=None,
                 *, device: str = "cpu", seed: int = 0, algorithm: AlgorithmConfig | None = None,
                 freeze_vision_tower: bool = False, lora: LoraSettings | None = None):
        """``freeze_vision_tower`` (``model.freeze_vision_tower``): a vision-language model's
        vision tower is not trained (no gradient, not in the optimizer; still in its weights
        and every directory written).  ``lora`` (``model.lora_*``): only adapters on the frozen
        model train, and they are the weights sent, loaded and saved (``engines/lora.py``)."""
        self.config = config or TrainerConfig()
        self.algorithm = algorithm or AlgorithmConfig()
        self.loss_settings = loss_settings(self.config, self.algorithm)
        self.device = device
        set_torch_threads(self.config.threads)
        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        model_class = auto_model_class(model_dir)
        self.model = model_class.from_pretrained(str(model_dir), dtype=torch.float32)
        self.lora = lora
        if lora is not None:
            self.model = with_lora(self.model, lora)
        self.model.to(device).train()
        if self.config.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None)
                          or getattr(self.model.config.get_text_config(), "pad_token_id", None) or 0)
        self.vision = VisionInputs(model_dir) if is_vision_language(model_dir) else None
        named = adapter_parameters(self.model) if lora else dict(self.model.named_parameters())
        frozen = set(vision_parameter_names(named)) if freeze_vision_tower else set()
        for name in frozen:
            named[name].requires_grad_(False)
        self.process_group = process_group
        self.rank = torch.distributed.get_rank(process_group) if process_group is not None else 0
        self.sharded = (ShardedModel(self.model, process_group, device) if self.config.strategy == "fsdp2"
                        and process_group is not None and torch.distributed.get_world_size(process_group) > 1
                        else None)
        if self.sharded and lora is not None:  # runtime/config.py refuses the pair first, in one line
            raise ValueError("trainer.strategy=fsdp2 with LoRA: the adapters are small; train them with ddp")
        self.weights = self.sharded.gathered() if self.sharded else named
        """Every parameter whole, by its Hugging Face name (with LoRA: every adapter, by PEFT's
        saved name): what weights are sent, loaded and checked as."""
        self.params = {k: p for k, p in self.weights.items() if k not in frozen}
        """The trained parameters: the passes' gradients are theirs."""
        self.opt_params = [self.sharded.shards[k] for k in self.params] if self.sharded else list(self.params.values())
        """What AdamW steps: the trained parameters, or (sharded) this rank's rows of them."""
        self.optimizer = torch.optim.AdamW(
            self.opt_params, lr=self.config.lr, betas=self.config.betas,
            eps=self.config.adam_eps, weight_decay=self.config.weight_decay, foreach=False,
        )
        # The KL term's reference is the initial policy: the model directory's weights, kept
        # frozen beside the trained copy (one more forward pass per micro-batch).  KL in the
        # reward loads it on its first use (``reference_kl``): only rank 0 is asked, so the
        # other ranks and the auxiliaries hold no copy they never use.
        self.ref_model = None
        if self.algorithm.kl_on(self.config.kl_coef):
            self.ref_model = self._load_reference()
        self.version = 0
        """Training steps taken (the policy version these weights are); a skipped step counts."""
        self.skipped_steps = 0
        """Steps skipped for a non-finite loss or gradient (``on_nonfinite="skip"``)."""

    # ------------------------------------------------------------------ forward passes
    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[TrainSample], micro_batch_size: int = 16) -> list[np.ndarray]:
        """Teacher-forced log-probs of each sample's response tokens under the current weights."""
        out = []
        for mb in make_microbatches(samples, micro_batch_size):
            batch = collate(mb, self.pad_id, self.device)
            with self._autocast():
                logp_B_T = forward_logp(self.model, batch, "none", self._vision(batch))[0].float().cpu()
            out += [logp_B_T[b, s : s + n].numpy().copy() for b, (s, n) in enumerate(batch.spans)]
        return out

    def reference_kl(self, microbatches: Sequence[Microbatch], kind: str) -> list[float]:
        """Each sample's summed per-token KL (``kind``) between its behaviour log-probs and
        the reference model's, micro-batch by micro-batch as given (the same batches give the
        same floats, whoever computes them): ``algorithm.use_kl_in_reward``'s penalty."""
        if not self.algorithm.use_kl_in_reward:
            raise RuntimeError("reference_kl: algorithm.use_kl_in_reward is off, so this trainer keeps no reference")
        if self.ref_model is None:
            self.ref_model = self._load_reference()
        out: list[float] = []
        for mb in microbatches:
            batch = collate(mb, self.pad_id, self.device)
            out += reference_kl_sums(self.ref_model, batch, kind, self._vision(batch))
        return out

    def _load_reference(self):
        ref = auto_model_class(self.model_dir).from_pretrained(str(self.model_dir), dtype=torch.float32)
        return ref.to(self.device).eval().requires_grad_(False)

    # ------------------------------------------------------------------ gradients
    def _microbatch_grads(self, mb: Microbatch, totals: StepTotals) -> tuple[dict[str, np.ndarray], dict]:
        """One micro-batch's gradient, computed as ``padding_split`` sub-batches.

        Every loss term and metric is a sum over sequences divided by the step's ``totals``,
        so the sub-batches' gradients and metrics add up to the whole micro-batch's (up to
        float rounding).  Why:
        a micro-batch padded to its longest sequence costs up to twice its real tokens once
        responses spread out (1-128 tokens), and that cost is not in the stage model's
        features (tokens, sum of squares): BENCHMARKS.md, "padding".
        """
        for p in self.params.values():
            p.grad = None
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in mb]
        metrics: dict[str, float] = {}
        for part in padding_split(lengths, self.config.padding_split_tokens):
            merge_metrics(metrics, self._subbatch_backward([mb[i] for i in part], totals))
        grads = {}
        for name, p in self.params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[name] = g.detach().to("cpu", torch.float32).reshape(-1).numpy().copy()
            p.grad = None
        return grads, metrics

    def _subbatch_backward(self, mb: Microbatch, totals: StepTotals) -> dict[str, float]:
        """Forward and backward of one padded batch (gradients accumulate); its metrics."""
        batch = collate(mb, self.pad_id, self.device)
        settings = self.loss_settings
        vision = self._vision(batch)
        with self._autocast():
            logp_B_T, entropy_B_T = forward_logp(self.model, batch, "grad" if settings.entropy_coeff else "metric",
                                                 vision)
            ref_logp_B_T = batch.ref_logp_B_T
            if ref_logp_B_T is None and settings.kl_coef:
                ref_logp_B_T = reference_logp(self.ref_model, batch, vision)
        out = policy_objective(logp_B_T, batch.old_logp_B_T, batch.adv_B, batch.mask_B_T, totals, settings,
                               ref_logp_B_T, entropy_B_T)
        out.loss.backward()
        metrics = {k: float(v) for k, v in out.metrics.items()}
        metrics["loss"] = float(out.loss.detach())
        return metrics

    def _autocast(self):
        """bf16 autocast over a pass (``mixed_precision=bf16``), else nothing."""
        return torch.autocast(self.device.split(":")[0], torch.bfloat16,
                              enabled=self.config.mixed_precision == "bf16")

    def _vision(self, batch) -> dict | None:
        """The batch's image inputs for the forward (None for a text model or batch)."""
        if self.vision is None or not any(batch.images):
            return None
        return self.vision.forward_kwargs(self.model, batch.input_ids_B_L, batch.attention_mask_B_L, batch.images,
                                          self.device)

    def compute_chunk_grads(
        self, microbatches: Sequence[Microbatch], totals: StepTotals | None = None,
        per_microbatch: bool = True,
    ) -> GradChunk:
        """Gradients of ``microbatches`` (in order) with every loss divided by ``totals``.

        ``totals`` must be the whole step's (all chunks, all DP ranks: ``StepTotals`` of
        its response tokens and sequences); None means "these micro-batches are the whole batch".
        """
        if not microbatches:
            raise ValueError("compute_chunk_grads needs at least one micro-batch")
        if totals is None:
            totals = step_totals(microbatches)
        partials: list[dict[str, np.ndarray]] = []
        metrics: dict[str, float] = {}
        for mb in microbatches:
            grads, mb_metrics = self._microbatch_grads(mb, totals)
            if per_microbatch or not partials:
                partials.append(grads)
            else:
                for name, g in grads.items():
                    partials[0][name] += g  # same left fold as apply_grads
            merge_metrics(metrics, mb_metrics)
        return GradChunk(partials, count_tokens(microbatches), metrics, self.version)

    def warm_up(self, samples: int, prompt_tokens: int, response_tokens: int) -> float:
        """One forward and backward pass of a micro-batch of ``samples`` sequences of
        ``prompt_tokens`` + ``response_tokens``, thrown away.

        Why: a process's first micro-batch ran 1.1-3.9x slower per token than its later ones
        on this CPU machine (new memory is faulted in page by page, kernels initialise), and
        on a device that first hosted a rollout engine the cold pass landed in the run's
        first step (BENCHMARKS.md, "The trainers' first micro-batch").  Done at start-up with
        the largest shape the run commonly meets, the memory stays with the process for the
        real ones.  Nothing is learned: ``compute_chunk_grads`` leaves no gradient on the
        parameters and its result is dropped; the optimizer, the version and the random
        state are untouched.  Returns the seconds it took.
        """
        if samples < 1 or prompt_tokens < 1 or response_tokens < 1:
            raise ValueError(f"warm_up needs samples, prompt_tokens and response_tokens >= 1, got "
                             f"{samples}, {prompt_tokens}, {response_tokens}")
        t0 = time.perf_counter()
        rng = torch.random.get_rng_state()
        token, n = (1 if self.pad_id != 1 else 2), response_tokens
        mb = [TrainSample([token] * prompt_tokens, [token] * n, [0.0] * n, 1.0) for _ in range(samples)]
        self.compute_chunk_grads([mb], per_microbatch=True)
        torch.random.set_rng_state(rng)
        return time.perf_counter() - t0

    def apply_grads(self, chunks: Sequence[GradChunk]) -> dict[str, float]:
        """Sum chunk gradients in the given order, all-reduce over DP, clip, step AdamW.

        Returns step metrics (loss parts summed over chunks and ranks, ``grad_norm`` before
        clipping, the new ``version``, ``skipped`` (1.0 if this step was skipped) and the
        running ``skipped_steps``).  A non-finite loss or grad norm never reaches the
        optimizer: the step is skipped (weights and AdamW state untouched, the version still
        advances) or, with ``on_nonfinite="stop"``, :class:`NonFiniteStepError` is raised
        with the version unchanged.
        """
        partials = [g for chunk in chunks for g in chunk.grads]
        if not partials and self.process_group is None:
            raise ValueError("apply_grads needs at least one gradient chunk")
        stale = sorted({c.version for c in chunks} - {self.version})
        if stale:  # gradients of other weights would silently corrupt the update
            raise ValueError(f"chunks computed at version(s) {stale}; trainer is at version {self.version}")
        if not partials:  # a data-parallel rank the step's plan left without micro-batches: it adds zero
            partials = [{name: np.zeros(tuple(p.shape), np.float32) for name, p in self.params.items()}]
        total = {name: g.copy() for name, g in partials[0].items()}
        for grads in partials[1:]:
            for name, g in grads.items():
                total[name] += g
        metrics: dict[str, float] = {}
        for chunk in chunks:
            merge_metrics(metrics, chunk.metrics)
        full = {name: torch.from_numpy(total[name]).view_as(p).to(p.device) for name, p in self.params.items()}
        if self.sharded:  # each rank its rows of the ranks' SUM
            self.sharded.reduce_scatter_grads(full, list(self.params))
            metrics = reduce_metrics(metrics, self.process_group)
        else:
            for name, p in self.params.items():
                p.grad = full[name]
            metrics = all_reduce_step(self.opt_params, metrics, self.process_group)
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.opt_params, self.config.max_grad_norm, foreach=False)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.opt_params]))
        # Decided on the reduced gradient and metrics, which every DP rank holds alike: all
        # ranks skip (or stop) together, and none waits in a collective for another.
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        loss = float(metrics.get("loss", 0.0))
        finite = math.isfinite(grad_norm) and math.isfinite(loss)
        lr = self.config.lr_at(self.version)  # the schedule follows the version, so it survives a resume
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if finite:
            self.optimizer.step()
        for p in self.opt_params:
            p.grad = None
        if finite and self.sharded:
            self.sharded.regather()  # the new weights whole on every rank (a collective)
        if not finite:
            what = f"loss {loss}, grad norm {grad_norm}"
            if self.config.on_nonfinite == "stop":
                raise NonFiniteStepError(
                    f"step {self.version}: non-finite {what}; stopped before the optimizer step "
                    "(trainer.on_nonfinite=stop): no weight was changed or written; resume from the last "
                    "checkpoint with bidirl train --resume RUN_DIR, or set trainer.on_nonfinite=skip")
            self.skipped_steps += 1
        self.version += 1  # a skipped step still counts: its weights are the previous version's
        metrics.update(grad_norm=grad_norm, version=self.version, skipped=float(not finite),
                       skipped_steps=self.skipped_steps, lr=lr)
        return metrics

    def global_totals(self, microbatches: Sequence[Microbatch]) -> StepTotals:
        """The whole step's totals: this rank's, summed over the DP group."""
        return global_totals(microbatches, self.process_group)

    def train_step(
        self, batch: Sequence[TrainSample] | Sequence[Microbatch], totals: StepTotals | None = None
    ) -> dict[str, float]:
        """One optimizer step over this rank's share of the batch: micro-batches, or a flat
        list of samples split by ``micro_batch_size``.

        Exactly ``apply_grads([compute_chunk_grads(microbatches, totals)])`` with the global
        totals, so it is bitwise equal to any chunked computation of the same step.
        """
        if batch and isinstance(batch[0], TrainSample):
            batch = make_microbatches(batch, self.config.micro_batch_size)  # type: ignore[arg-type]
        microbatches = list(batch)  # type: ignore[arg-type]
        if totals is None:
            totals = self.global_totals(microbatches)
        chunk = self.compute_chunk_grads(microbatches, totals, per_microbatch=False)
        return self.apply_grads([chunk])
