"""Synthetic device schedules for the observability tests (generator: ``bench/schedules.py``)."""

from __future__ import annotations

import pytest

from bench.schedules import make_schedule


@pytest.fixture
def schedule():
    """Factory fixture: ``schedule(n_rollout=..., n_train=..., wall_s=..., ...)``."""
    return make_schedule
