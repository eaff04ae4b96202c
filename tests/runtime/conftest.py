"""Fixtures for real-runtime tests."""

import pytest


@pytest.fixture(scope="session")
def real_runtime_available():
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    pytest.importorskip("torch")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from bidirl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def ray_local():
    pytest.importorskip("ray")
    from bidirl.runtime.cluster import ray_session

    with ray_session(num_cpus=3) as ray:
        yield ray
