"""Test-suite wide hooks.

* vLLM's environment is applied before any test module loads torch or vLLM.
* GPU-only tests are skipped, not failed, on machines without CUDA.
* Hypothesis draws the same examples on every run (``derandomize``): a property test
  passes or fails the same way on every machine and in any order, and a failure it finds
  is reproduced by the next run.  ``HYPOTHESIS_PROFILE=explore`` draws random examples
  instead (new ones each run, with the example database), to look for counterexamples.
"""

import os

import pytest
from hypothesis import settings

from bidirl.runtime.vllm_env import apply_vllm_env

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

apply_vllm_env()  # before any test module loads torch or vLLM


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """A Qwen2.5-0.5B-shaped directory (tied embeddings, 14/2 heads of 32, BPE, ChatML), small."""
    pytest.importorskip("transformers")
    from bidirl.models import make_model

    return make_model(tmp_path_factory.mktemp("models") / "qwen2.5-0.5b-small", "qwen2.5-0.5b", small=True)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A Llama-3-shaped directory (untied, 8/2 heads of 32, BPE, Llama 3's template), small."""
    pytest.importorskip("transformers")
    from bidirl.models import make_model

    return make_model(tmp_path_factory.mktemp("models") / "llama-3.1-8b-small", "llama-3.1-8b", small=True)


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory):
    """A tiny SmolVLM-shaped (Idefics3) directory with its PIL processor (``models/tiny_vl.py``)."""
    pytest.importorskip("transformers")
    from bidirl.models.tiny_vl import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("models") / "tiny-vl")


@pytest.fixture(autouse=True)
def _no_cleanup_of_other_runs(request, monkeypatch):
    """``bidirl``'s CLI first cleans up after this machine's dead runs (``runtime/leftovers.py``)
    and says so on stderr; in the suite those runs are other tests' (or an earlier suite's), so
    the line would land in whichever CLI test runs next (CI failed once on exactly that).  The
    cleanup itself is tested in ``test_leftovers.py``; ``@pytest.mark.cleans_leftovers`` keeps it."""
    if "cleans_leftovers" not in request.keywords:
        import bidirl.cli

        monkeypatch.setattr(bidirl.cli, "clean_stale_runs", lambda: [])


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
