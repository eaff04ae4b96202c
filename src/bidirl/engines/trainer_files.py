"""A trainer's weights and files: weights in and out as numpy, checkpoints, model directories.

The half of :class:`~bidirl.engines.trainer_torch.TorchTrainer` that touches no gradient,
kept apart so the trainer's module stays about computing and applying them.  Sharded
(``trainer.strategy=fsdp2``), every rank holds the weights whole between steps
(``engines/sharding.py``): what is shipped or written as a model directory is rank 0's,
written with no collective; the optimizer is written as one file of rows per rank.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch

from bidirl.engines.hf_io import auto_model_class, check_finite, load_weights, write_model_dir
from bidirl.engines.lora import read_adapter, save_adapter, write_merged
from bidirl.engines.sharding import load_optimizer, save_optimizer

__all__ = ["TrainerFiles"]


class TrainerFiles:
    """Mixed into ``TorchTrainer``, whose ``__init__`` sets what these methods read: ``model``,
    ``model_dir``, ``device``, ``weights``, ``lora``, ``sharded``, ``rank``, ``optimizer``, ``opt_params``,
    ``config``, ``version``, ``skipped_steps``."""

    def get_weights_numpy(self) -> dict[str, np.ndarray]:
        """Checkpoint-named fp32 copies of all parameters, a frozen vision tower's included
        (with LoRA the adapters alone; safe to ship; not views)."""
        # Copied before .numpy(): a tensor numpy has seen cannot be resized, and FSDP frees and
        # re-allocates the gathered weights' storage at every step.
        return {name: p.detach().to("cpu", copy=True).numpy() for name, p in self.weights.items()}

    @torch.no_grad()
    def set_weights_numpy(self, weights: dict[str, np.ndarray], version: int | None = None) -> None:
        """Overwrite parameters (an auxiliary trainer adopting the primary's weights; sharded,
        every rank at once: the shards are regathered)."""
        missing = set(self.weights) - set(weights)
        if missing:
            raise KeyError(f"weights missing parameters: {sorted(missing)[:5]}")
        with warnings.catch_warnings():  # arrays from Ray's object store are read-only; copy_ only reads them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            whole = {name: torch.from_numpy(np.asarray(weights[name])).view_as(p) for name, p in self.weights.items()}
            if self.sharded:
                self.sharded.set_full(whole)
            else:
                for name, p in self.weights.items():
                    p.copy_(whole[name])
        if version is not None:
            self.version = int(version)

    def save_checkpoint(self, ckpt_dir: str | Path, model_dir: str | Path | None = None) -> Path:
        """The optimizer (``engines/sharding.py:save_optimizer``) and version
        (``trainer_state.json``) in ``ckpt_dir``; the weights as a Hugging Face model
        directory (:meth:`save_pretrained`) in ``model_dir``, by default ``ckpt_dir`` itself.
        Every rank is called: rank 0 writes all but a sharded rank's own optimizer rows; a
        full-copy rank other than 0 writes nothing.

        Refuses (``NonFiniteWeightsError``, before writing anything) weights with NaN or inf.
        """
        ckpt_dir = Path(ckpt_dir)
        if self.rank == 0:
            self.save_pretrained(Path(model_dir) if model_dir is not None else ckpt_dir, where=ckpt_dir)
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            (ckpt_dir / "trainer_state.json").write_text(
                json.dumps({"version": self.version, "skipped_steps": self.skipped_steps}))
        if self.rank == 0 or self.sharded:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            save_optimizer(self.optimizer, ckpt_dir, self.sharded)
        return ckpt_dir

    def _state(self) -> dict[str, torch.Tensor]:
        """The whole weights by state-dict name (sharded: the gathered parameters; the
        module's own ``state_dict`` would reshard it on this rank alone)."""
        if self.sharded:
            return {k: v.detach() for k, v in self.weights.items()}
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def load_checkpoint(self, ckpt_dir: str | Path, model_dir: str | Path | None = None) -> None:
        """What :meth:`save_checkpoint` wrote, by either strategy and any rank count: the
        weights from ``model_dir`` (default ``ckpt_dir``), the optimizer and version from
        ``ckpt_dir`` (sharded: every rank at once)."""
        ckpt_dir = Path(ckpt_dir)
        model_dir = Path(model_dir) if model_dir is not None else ckpt_dir
        if self.lora is not None:
            self.set_weights_numpy(read_adapter(model_dir))
        elif self.sharded:
            saved = auto_model_class(model_dir).from_pretrained(str(model_dir), dtype=torch.float32)
            self.sharded.set_full({k: v.detach() for k, v in saved.named_parameters()})
            del saved
        else:
            load_weights(self.model, model_dir, self.device)
        load_optimizer(self.optimizer, ckpt_dir, self.sharded, self.opt_params)
        # The saved param groups carry the hyperparameters they were saved with; this trainer's
        # config wins (a resume may change trainer.lr and the rest: docs/runtime.md).
        for group in self.optimizer.param_groups:
            group.update(lr=self.config.lr, betas=self.config.betas, eps=self.config.adam_eps,
                         weight_decay=self.config.weight_decay)
        state = json.loads((ckpt_dir / "trainer_state.json").read_text())
        self.version = int(state["version"])
        self.skipped_steps = int(state.get("skipped_steps", 0))

    def save_pretrained(self, out_dir: str | Path, where: Path | None = None, merged: bool = False) -> Path:
        """A complete Hugging Face model directory: ``config.json``, ``generation_config.json``,
        ``model.safetensors`` (tied embeddings stored once, as ``transformers`` stores them),
        and the base model's tokenizer files and chat template; ``AutoModelForCausalLM``,
        ``AutoTokenizer`` and ``vllm.LLM`` load it as is.  Sharded, rank 0 writes it from its
        gathered weights, with no collective.  With LoRA, PEFT's adapter directory
        (``adapter_config.json``, ``adapter_model.safetensors``), or with ``merged`` the full
        directory of the base with the adapters merged in.

        Refuses weights with NaN or inf (naming ``where``, default ``out_dir``)."""
        out_dir = Path(out_dir)
        if self.lora is not None:
            check_finite({k: p.detach() for k, p in self.weights.items()}, where or out_dir, self.version)
            return write_merged(self.model, out_dir, self.model_dir) if merged else save_adapter(self.model, out_dir)
        state = self._state()
        check_finite(state, where or out_dir, self.version)
        return write_model_dir(self.model, out_dir, self.model_dir, state if self.sharded else None)
