"""A run simple enough to compute by hand: the simulator must agree within 1 %.

One rollout device (one replica) and one train device; every response is exactly ``L``
tokens; staleness 0, so each step is strictly: weight sync -> rollout -> train; no noise.

    rollout   R = G * prefill(P) + L (a + c B + k B P) + k B L (L - 1) / 2,   B = G n
                (each group's prompt is prefilled when it is assigned; then all B
                responses decode together from context P and finish after L steps)
    training  T = sum over micro-batches of (a_m + c_m tok + q_m tok (P + L)) + optimizer
                (dp = 1: no all-reduce; samples of P + L tokens packed up to the budget)
    sync      W = weight_sync_s(hardware, model, spans_nodes=False)
    step      = W + R + T   (for every step after the first)
"""

import math

import pytest

from bidirl.perf.profiles import HARDWARE, MODELS
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel, weight_sync_s
from bidirl.sim.run import simulate
from bidirl.sim.scenario import from_dict

G, N, P, L, M = 4, 4, 128, 512, 4096


def _scenario(policy_devices: int = 2):
    return from_dict({
        "name": "closed-form", "hardware": "H100-80GB", "model": "Qwen3-8B",
        "devices": 2, "staleness": 0, "steps": 4,
        "workload": {"prompts_per_step": G, "group_size": N, "prompt_tokens": P,
                     "response_length": {"dist": "constant", "max": L, "min": 1}},
        "pools": {"rollout_devices": 1, "train_devices": 1, "rollout_tp": 1,
                  "train": {"dp": 1, "tp": 1}},
        "sim": {"timing_noise_cv": 0.0, "micro_batch_tokens": M,
                "allow_oversubscribe": True},  # a trainer on one H100: the timing, not the memory
    })


def _by_hand() -> float:
    hw, m = HARDWARE["H100-80GB"], MODELS["Qwen3-8B"]
    a, c, k = RolloutStageModel(hw, m, 1).decode.theta
    a_p, c_p = RolloutStageModel(hw, m, 1).prefill.theta
    b = G * N
    rollout = G * (a_p + c_p * P) + L * (a + c * b + k * b * P) + k * b * L * (L - 1) / 2
    train = TrainStageModel(hw, m, 1)
    a_m, c_m, q_m = train.micro.theta
    per_micro = M // (P + L)
    sizes = [per_micro] * (b // per_micro) + ([b % per_micro] if b % per_micro else [])
    assert len(sizes) == math.ceil(b / per_micro)
    compute = sum(a_m + c_m * s * (P + L) + q_m * s * (P + L) * (P + L) for s in sizes)
    return weight_sync_s(hw, m, spans_nodes=False) + rollout + compute + train.optimizer_s()


@pytest.mark.parametrize("policy", ["async", "one-step-off"])
def test_step_time_matches_the_analytic_value(policy):
    r = simulate(_scenario(), policy, record_intervals=False)
    expected = _by_hand()
    assert r.borrows == {"roll_on_train": 0, "train_on_roll": 0}
    for step_s in r.step_times_s[1:]:
        assert step_s == pytest.approx(expected, rel=0.01)
