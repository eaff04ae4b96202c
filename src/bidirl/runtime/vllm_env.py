"""The environment vLLM reads at import and engine start, set in one place.

Importing this module imports neither vLLM nor torch, so a Ray ``runtime_env`` or a test
conftest can use it before either loads.

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in the calling process
  (with ``distributed_executor_backend="uni"``): no EngineCore subprocess, no core pinning.
- ``TORCH_COMPILE_DISABLE=1``: vLLM compiles one sampler op even in eager mode (~3.5 s per
  engine start). Read when torch loads; :func:`apply_vllm_env` also flips the flag when
  torch is already loaded.
- ``VLLM_CPU_OMP_THREADS_BIND=nobind``: a tensor-parallel replica's shard processes
  (``rollout.tensor_parallel_size``) keep the thread counts set here instead of vLLM
  binding each to a NUMA node of its own (which a one-node machine refuses).
- ``TOKENIZERS_PARALLELISM=false``: no tokenizer thread pool (and no fork warning).
- ``OMP_NUM_THREADS``: one intra-op thread per worker; vLLM replaces
  ``torch.set_num_threads`` process-wide once it loads, so thread counts are fixed before.
- ``VLLM_LOGGING_LEVEL`` (``run.worker_log_level``, WARNING by default): no INFO lines from
  vLLM's model loading.  The level travels as ``BIDIRL_WORKER_LOG_LEVEL`` too.  (Hugging
  Face's progress bars are switched off by the worker itself:
  ``engines/hf_io.quiet_hf_progress_bars``.)

Above INFO, :func:`quiet_known_warnings` also drops, at their loggers, the vLLM warnings
this configuration always produces and that say nothing about the run: the
consequences of ``enforce_eager``/``TORCH_COMPILE_DISABLE``, Triton or tcmalloc not being
installed on a CPU machine, the thread-binding notice, and per weight sync
``RotaryEmbedding: Failed to load weights`` (rotary caches are computed, never loaded),
``ParallelLMHead: Failed to load weights`` (a tied model's head is its embedding: the
trainer sends the embedding alone, and an untied head always comes with the weights)
and ``Failed to reset prefix cache`` (prefix caching is off).  Every other warning shows.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

_FIXED = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
LOG_LEVELS = ("debug", "info", "warning", "error")

# (logger, message pattern): what quiet_known_warnings drops, and why it may (module doc).
KNOWN_WARNINGS: tuple[tuple[str, str], ...] = (
    ("vllm.model_executor.model_loader.reload.layerwise", r"(\w*Rotary\w*|ParallelLMHead): Failed to load weights"),
    ("vllm.v1.core.block_pool", r"Failed to reset prefix cache because some blocks"),
    ("vllm.engine.arg_utils", r"The global random seed is set to"),
    ("vllm.config.vllm", r"Enforce eager set|TORCH_COMPILE_DISABLE is set|Inductor compilation was disabled|"
                         r"Model Runner V2 requires Triton"),
    ("vllm.platforms.cpu", r"Triton is not installed|Reset SSM cache type"),
    ("vllm.triton_utils.importing", r"Triton is installed, but doesn't include CPU backend"),
    ("vllm.v1.worker.cpu_worker", r"\w+ is not found in LD_PRELOAD|CPU backend doesn't allow to use "
                                  r"`torch.set_num_threads`"),
    ("vllm.v1.engine.input_processor", r"Passing raw prompts to InputProcessor is deprecated"),
)


class _DropKnown(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not self.pattern.match(record.getMessage())


def quiet_known_warnings() -> None:
    """Drop the :data:`KNOWN_WARNINGS` at their loggers (idempotent; vLLM need not be loaded).

    Logger filters stay when vLLM later installs its own handlers.  Also silences one
    ``FutureWarning`` vLLM's Triton shim raises by touching ``torch.distributed.reduce_op``.
    """
    for name, pattern in KNOWN_WARNINGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(pattern))
    warnings.filterwarnings("ignore", message=r"`torch.distributed.reduce_op` is deprecated",
                            category=FutureWarning)


def vllm_env(threads: int | None = 1, log_level: str | None = None) -> dict[str, str]:
    """The variables, e.g. for a Ray actor's ``runtime_env``; ``threads=None`` leaves OMP out,
    ``log_level`` (one of :data:`LOG_LEVELS`) adds the logging ones."""
    env = dict(_FIXED)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(int(threads))
    if log_level is not None:
        if log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {log_level!r}")
        env.update(VLLM_LOGGING_LEVEL=log_level.upper(), BIDIRL_WORKER_LOG_LEVEL=log_level)
    return env


def apply_vllm_env(threads: int | None = None, log_level: str | None = None) -> None:
    """Set the variables in this process where they are not set already (``setdefault``).

    ``threads=None`` leaves ``OMP_NUM_THREADS`` alone: set after torch has loaded it would
    only make vLLM keep torch's current thread count instead of choosing one itself.
    Unless the log level (``log_level``, else ``BIDIRL_WORKER_LOG_LEVEL``, else warning) is
    debug or info, the known harmless warnings are dropped (:func:`quiet_known_warnings`).
    """
    for key, value in vllm_env(threads, log_level).items():
        os.environ.setdefault(key, value)
    if os.environ.get("BIDIRL_WORKER_LOG_LEVEL", log_level or "warning") not in ("debug", "info"):
        quiet_known_warnings()
    if "torch" in sys.modules and os.environ["TORCH_COMPILE_DISABLE"] == "1":
        import torch._dynamo

        torch._dynamo.config.disable = True  # the env var is read only when torch loads
