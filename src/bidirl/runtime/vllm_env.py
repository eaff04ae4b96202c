"""The environment vLLM reads at import and engine start, set in one place.

Importing this module imports neither vLLM nor torch, so a Ray ``runtime_env`` or a test
conftest can use it before either loads.

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in the calling process
  (with ``distributed_executor_backend="uni"``): no EngineCore subprocess, no core pinning.
- ``TORCH_COMPILE_DISABLE=1``: vLLM compiles one sampler op even in eager mode (~3.5 s per
  engine start). Read when torch loads; :func:`apply_vllm_env` also flips the flag when
  torch is already loaded.
- ``TOKENIZERS_PARALLELISM=false``: no tokenizer thread pool (and no fork warning).
- ``OMP_NUM_THREADS``: one intra-op thread per worker; vLLM replaces
  ``torch.set_num_threads`` process-wide once it loads, so thread counts are fixed before.
"""

from __future__ import annotations

import os
import sys

_FIXED = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_COMPILE_DISABLE": "1",
}


def vllm_env(threads: int | None = 1) -> dict[str, str]:
    """The variables, e.g. for a Ray actor's ``runtime_env``; ``threads=None`` leaves OMP out."""
    env = dict(_FIXED)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(int(threads))
    return env


def apply_vllm_env(threads: int | None = None) -> None:
    """Set the variables in this process where they are not set already (``setdefault``).

    ``threads=None`` leaves ``OMP_NUM_THREADS`` alone: set after torch has loaded it would
    only make vLLM keep torch's current thread count instead of choosing one itself.
    """
    for key, value in vllm_env(threads).items():
        os.environ.setdefault(key, value)
    if "torch" in sys.modules and os.environ["TORCH_COMPILE_DISABLE"] == "1":
        import torch._dynamo

        torch._dynamo.config.disable = True  # the env var is read only when torch loads
