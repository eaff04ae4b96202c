"""Test-suite wide hooks: vLLM's environment, and GPU-only tests skipped without CUDA."""

import pytest

from bidirl.runtime.vllm_env import apply_vllm_env

apply_vllm_env()  # before any test module loads torch or vLLM


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
