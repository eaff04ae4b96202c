"""Small scenarios and custom hardware for the planner tests (no I/O, no simulator)."""

from __future__ import annotations

import dataclasses

import pytest

from bidirl.perf.profiles import GIB, HARDWARE
from bidirl.planner.context import PlanContext
from bidirl.sim.scenario import Costs, Pools, ResponseLength, Scenario, TrainLayout, Workload


def _make_scenario(devices: int = 16, hardware: str = "H100-80GB", model: str = "Qwen3-8B",
                  staleness: int = 1, max_len: int = 8192, dist: str = "lognormal",
                  costs: Costs | None = None, steps: int = 10, **workload) -> Scenario:
    rl = ResponseLength(dist, median=max(1, max_len // 5), sigma=0.9, min=16, max=max_len)
    w = Workload(**{"prompts_per_step": 64, "group_size": 8, "prompt_tokens": 256,
                    "response_length": rl, **workload})
    half = devices // 2
    return Scenario(name=f"test-{devices}", hardware=hardware, devices=devices, model=model,
                    staleness=staleness, steps=steps, workload=w, costs=costs or Costs(),
                    pools=Pools(devices - half, half, 1, TrainLayout(half, 1)))


def _with_memory(ctx: PlanContext, memory_gib: float, **hw_changes) -> PlanContext:
    """The context on a copy of its hardware with ``memory_gib`` per device."""
    hw = dataclasses.replace(ctx.hw, memory_gib=memory_gib, **hw_changes)
    return dataclasses.replace(ctx, hw=hw, _memo={})


@pytest.fixture
def make_scenario():
    return _make_scenario


@pytest.fixture
def with_memory():
    return _with_memory


@pytest.fixture
def h100_ctx() -> PlanContext:
    return PlanContext.from_scenario(_make_scenario())


@pytest.fixture
def gib() -> float:
    return GIB


@pytest.fixture
def hardware():
    return HARDWARE
