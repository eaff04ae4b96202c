"""vLLM's environment comes from one module, importable without vLLM or torch."""

from __future__ import annotations

import os
import subprocess
import sys

from bidirl.runtime.vllm_env import vllm_env


def test_the_variables_the_worker_sets():
    assert vllm_env() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
                          "TORCH_COMPILE_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                          "OMP_NUM_THREADS": "1"}
    assert vllm_env(threads=3)["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in vllm_env(threads=None)


def test_apply_keeps_what_is_set_and_imports_neither_vllm_nor_torch():
    code = ("import os, sys\n"
            "from bidirl.runtime.vllm_env import apply_vllm_env\n"
            "apply_vllm_env(threads=2)\n"
            "print(os.environ['OMP_NUM_THREADS'], os.environ['TORCH_COMPILE_DISABLE'],"
            " os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'], 'vllm' in sys.modules, 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in vllm_env()}
    env["TORCH_COMPILE_DISABLE"] = "0"  # set by the caller: kept
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "0", "0", "False", "False"]


def test_apply_disables_compile_when_torch_is_already_loaded():
    code = ("import torch\n"
            "from bidirl.runtime.vllm_env import apply_vllm_env\n"
            "apply_vllm_env()\n"
            "import torch._dynamo\n"
            "print(torch._dynamo.config.disable)")
    env = {k: v for k, v in os.environ.items() if k not in vllm_env()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "True"


def test_log_level_variables():
    env = vllm_env(threads=1, log_level="warning")
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert env["BIDIRL_WORKER_LOG_LEVEL"] == "warning"


def test_known_harmless_vllm_warnings_are_dropped_at_their_loggers_and_others_kept():
    import logging

    from bidirl.runtime.vllm_env import quiet_known_warnings

    quiet_known_warnings()
    quiet_known_warnings()  # idempotent
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    pool = logging.getLogger("vllm.v1.core.block_pool")
    for lg in (layerwise, pool):
        lg.addHandler(Keep())
        lg.propagate = False
    try:
        layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")
        layerwise.warning("%s: Failed to load weights", "ParallelLMHead")  # a tied head: nothing to load
        layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real problem: kept
        layerwise.error("%s: Failed to load weights", "RotaryEmbedding")  # errors always show
        pool.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", 1)
    finally:
        for lg in (layerwise, pool):
            lg.handlers.clear()
            lg.propagate = True
    assert seen == ["QKVParallelLinear: Failed to load weights", "RotaryEmbedding: Failed to load weights"]
