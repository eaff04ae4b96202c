"""A trainer (primary or auxiliary) as a role a device worker hosts.

The primary trainer owns the optimizer and the policy version; an auxiliary trainer is
the same object used only for ``compute_chunk`` after adopting the primary's weights.
Gradients travel as one fp32 numpy array per parameter *per micro-batch*, and the primary
adds them in (chunk, micro-batch) order, so the sum is the same float computation
whichever device produced which chunk: borrowing does not change the update.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from bidirl.algo.aggregation import StepTotals, merge_metrics
from bidirl.engines.lora import LoraSettings
from bidirl.engines.train_batch import GradChunk, TrainSample
from bidirl.engines.trainer_config import from_wire
from bidirl.engines.trainer_torch import TorchTrainer
from bidirl.runtime.checkpoint_integrity import require_finite
from bidirl.runtime.checkpoints import checkpoint_dirs


class TrainerRole:
    def __init__(self, model_dir: str, config: dict[str, Any] | None = None, threads: int = 1,
                 weights: dict | None = None, version: int = 0, process_group=None) -> None:
        """``config`` is ``trainer_wire(...)``'s dict; ``threads`` is the worker's own setting."""
        cfg, algorithm, device, seed = from_wire(config or {}, threads)
        self.trainer = TorchTrainer(model_dir, cfg, process_group=process_group, device=device, seed=seed,
                                    algorithm=algorithm,
                                    freeze_vision_tower=bool((config or {}).get("freeze_vision_tower", False)),
                                    lora=LoraSettings.from_wire((config or {}).get("lora")))
        require_finite(self.trainer.weights, f"model {model_dir}")  # NaN in: every step would be skipped
        if weights is not None:
            self.trainer.set_weights_numpy(weights, version)

    def compute_chunk_ref(self, microbatches: list[list[dict]], totals: StepTotals
                          ) -> tuple[GradChunk, list[tuple[int, int, float]]]:
        """Gradients of explicit micro-batches (lists of sample dicts), in order, every loss
        divided by the whole step's ``totals`` (response tokens, sequences)."""
        grads, metrics, timings = [], {}, []
        for mb in microbatches:
            ts = [TrainSample(**s) for s in mb]
            t0 = time.perf_counter()
            part = self.trainer.compute_chunk_grads([ts], totals, per_microbatch=True)
            took = time.perf_counter() - t0
            grads += part.grads
            merge_metrics(metrics, part.metrics)
            lens = [len(s.prompt_ids) + len(s.response_ids) for s in ts]
            # Features of the micro-batch model: tokens and attention-weighted length.
            timings.append((sum(lens), sum(x * x for x in lens) / max(1, sum(lens)), took))
        n_tok = sum(len(s["response_ids"]) for mb in microbatches for s in mb)
        return GradChunk(grads, n_tok, metrics, self.trainer.version), timings

    def reference_kl(self, microbatches: list[list[dict]], kind: str) -> list[float]:
        """Each sample's summed KL to the reference, in order (``TorchTrainer.reference_kl``)."""
        return self.trainer.reference_kl([[TrainSample(**s) for s in mb] for mb in microbatches], kind)

    def apply_refs(self, nested: list, n_own: int, groups: list[int] | None = None
                   ) -> tuple[dict[str, float], list[float]]:
        """Fetch chunk gradients (object refs, in merge order) and step.

        The first ``n_own`` refs were computed on this device; the others follow in
        ``groups`` (how many refs each executor that computed them holds, in order; None:
        one ref each), and the fetch time of each group is a measured ``C_grad``.
        """
        import ray

        refs = nested[0]
        chunks = ray.get(refs[:n_own]) if n_own else []
        c_grad, k = [], n_own
        for n in (groups if groups is not None else [1] * (len(refs) - n_own)):
            t0 = time.perf_counter()
            chunks += ray.get(refs[k:k + n])
            c_grad.append(time.perf_counter() - t0)
            k += n
        return self.trainer.apply_grads(chunks), c_grad

    def warm_up(self, samples: int, prompt_tokens: int, response_tokens: int) -> float:
        """The start-up pass that keeps the first real micro-batch from being this process's
        first (``TorchTrainer.warm_up``); returns its seconds."""
        return self.trainer.warm_up(samples, prompt_tokens, response_tokens)

    def get_version(self) -> int:
        return self.trainer.version

    def weights(self) -> dict:
        return self.trainer.get_weights_numpy()

    def named_tensors(self) -> dict:
        """The parameters themselves, by their HF names (a collective broadcasts from them)."""
        return {name: p.detach() for name, p in self.trainer.weights.items()}

    def set_weights(self, weights: dict, version: int) -> None:
        self.trainer.set_weights_numpy(weights, version)

    def save(self, ckpt_dir: str) -> str:
        """Checkpoint ``step_<k>/``: ``model/`` (a Hugging Face model directory) and
        ``trainer/`` (optimizer and version)."""
        trainer_dir, model_dir = checkpoint_dirs(ckpt_dir, writing=True)
        return str(self.trainer.save_checkpoint(trainer_dir, model_dir))

    def load(self, ckpt_dir: str) -> int:
        """Read what :meth:`save` wrote (or a checkpoint of the older layout, weights in ``trainer/``)."""
        self.trainer.load_checkpoint(*checkpoint_dirs(ckpt_dir))
        require_finite(self.trainer.weights, f"checkpoint {ckpt_dir}")  # NaN in: every step would be skipped
        return self.trainer.version

    def sleep(self) -> None:
        """Parked auxiliary trainer: drop gradients; weights are refreshed on wake."""
        for p in self.trainer.params.values():
            p.grad = None

    def wake(self) -> None:
        return None

    def release(self) -> None:
        del self.trainer
        gc.collect()
