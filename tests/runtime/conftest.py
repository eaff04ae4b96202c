"""Fixtures for real-runtime tests."""

import pytest


@pytest.fixture(scope="session")
def real_runtime_available():
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    pytest.importorskip("torch")
