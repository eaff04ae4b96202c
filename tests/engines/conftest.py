"""A tiny model built once per test session (about a second), never downloaded."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from bidirl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tiny_model")
