"""A trainer (primary or auxiliary) as a role a device worker hosts.

The primary trainer owns the optimizer and the policy version; an auxiliary trainer is
the same object used only for ``compute_chunk`` after adopting the primary's weights.
Gradients travel as one fp32 numpy array per parameter *per micro-batch*, and the primary
adds them in (chunk, micro-batch) order, so the sum is the same float computation
whichever device produced which chunk: borrowing does not change the update.
"""

from __future__ import annotations

import time
from typing import Any

from bidirl.engines.trainer_torch import GradChunk, TorchTrainer, TrainerConfig, TrainSample


class TrainerRole:
    def __init__(self, model_dir: str, config: dict[str, Any] | None = None, threads: int = 1,
                 weights: dict | None = None, version: int = 0, process_group=None) -> None:
        cfg = TrainerConfig(**{**(config or {}), "num_threads": threads})
        self.trainer = TorchTrainer(model_dir, cfg, process_group=process_group)
        if weights is not None:
            self.trainer.set_weights_numpy(weights, version)

    @property
    def version(self) -> int:
        return self.trainer.version

    def compute_chunk(self, samples: list[dict], micro_batch_size: int, total_tokens: int
                      ) -> tuple[GradChunk, list[tuple[int, int, float]]]:
        """Gradients of ``samples`` (already in batch order), one entry per micro-batch.

        Also returns ``(tokens, max_seq_len, seconds)`` per micro-batch: the features and
        measurement of the training stage-time model.
        """
        ts = [TrainSample(**s) for s in samples]
        mbs = [ts[i:i + micro_batch_size] for i in range(0, len(ts), micro_batch_size)]
        grads, metrics, timings = [], {}, []
        for mb in mbs:
            t0 = time.perf_counter()
            part = self.trainer.compute_chunk_grads([mb], total_tokens, per_microbatch=True)
            took = time.perf_counter() - t0
            grads += part.grads
            for k, v in part.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
            tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in mb)
            seq = max(len(s.prompt_ids) + len(s.response_ids) for s in mb)
            timings.append((tokens, seq, took))
        n_tok = sum(len(s.response_ids) for s in ts)
        return GradChunk(grads, n_tok, metrics, self.trainer.version), timings

    def apply(self, chunks: list[GradChunk]) -> dict[str, float]:
        """Sum chunks in the given order and step the optimizer (primary only)."""
        return self.trainer.apply_grads(chunks)

    def weights(self) -> dict:
        return self.trainer.get_weights_numpy()

    def set_weights(self, weights: dict, version: int) -> None:
        self.trainer.set_weights_numpy(weights, version)

    def save(self, ckpt_dir: str) -> str:
        return str(self.trainer.save_checkpoint(ckpt_dir))

    def load(self, ckpt_dir: str) -> int:
        self.trainer.load_checkpoint(ckpt_dir)
        return self.trainer.version

    def abort_all(self) -> None:
        return None

    def release(self) -> None:
        import gc

        del self.trainer
        gc.collect()
