"""Length schedules: lengths that drift over the run, drawn seeded, planned for as a whole."""

import numpy as np
import pytest

from bidirl.perf.scenario import LengthDrift, ResponseLength
from bidirl.planner.lengths import LengthStats
from bidirl.planner.plan import plan, scenario_with_envelope
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError, from_dict
from bidirl.sim.workload import ResponseLengths

GROWING = ResponseLength(median=1000, sigma=0.5, min=16, max=16384, drift=LengthDrift(median=6000))


def test_drifting_lengths_grow_step_by_step_and_follow_the_seed():
    lengths = ResponseLengths(GROWING, 32, 8, seed=3, steps=11)
    medians = [float(np.median(lengths.draw_batch(b))) for b in range(11)]
    assert medians[0] == pytest.approx(1000, rel=0.15) and medians[-1] == pytest.approx(6000, rel=0.15)
    assert medians[5] == pytest.approx(3500, rel=0.15)
    assert all(b > a for a, b in zip(medians, medians[2:]))  # rising (noise aside)
    again = ResponseLengths(GROWING, 32, 8, seed=3, steps=11)
    other = ResponseLengths(GROWING, 32, 8, seed=4, steps=11)
    assert (again.draw_batch(7) == lengths.draw_batch(7)).all()
    assert not (other.draw_batch(7) == lengths.draw_batch(7)).all()
    assert GROWING.params_at(40, 11) == (6000.0, 0.5)  # the drift ends, the lengths stay


def test_the_planner_sees_the_whole_schedule():
    """The drift's statistics are those of its steps pooled: the mean over the horizon of each
    step's mean, between the start's and the end's."""
    class W:
        prompt_tokens, prompts_per_step, group_size = 256, 32, 8
        response_length = GROWING

    steps = 11
    pooled = LengthStats.from_workload(W, steps)
    per_step = []
    for k in range(steps):
        med, sig = GROWING.params_at(k, steps)
        W.response_length = ResponseLength(median=round(med), sigma=sig, min=16, max=16384)
        per_step.append(LengthStats.from_workload(W).mean)
    assert pooled.mean == pytest.approx(sum(per_step) / steps, rel=0.01)
    assert per_step[0] < pooled.mean < per_step[-1]


def _scenario(drift: bool) -> dict:
    rl = {"median": 150, "sigma": 0.6, "min": 16, "max": 8192}
    if drift:
        rl["drift"] = {"median": 3000}
    return from_dict({
        "name": "drift", "hardware": "H100-80GB", "model": "Qwen3-4B", "devices": 32, "staleness": 1,
        "steps": 12, "workload": {"prompts_per_step": 64, "group_size": 8, "prompt_tokens": 256,
                                  "response_length": rl},
        "pools": {"rollout_devices": 16, "train_devices": 16, "train": {"dp": 16}}})


def test_drifting_lengths_change_the_pick_where_they_should():
    """32 devices, responses growing from 150 to 3,000 tokens: planned on the start's lengths,
    the split favours training; planned on the schedule, it gives rollout more devices, and
    on the drifting run that pick is faster (3 seeds)."""
    drifting = _scenario(True)
    pick, start = plan(drifting).envelope, plan(_scenario(False)).envelope
    assert pick.rollout_devices > start.rollout_devices

    def speed(env):
        sc = scenario_with_envelope(drifting, env)
        return np.mean([simulate(sc, "bidirl", seed=s, record_intervals=False).throughput_tokens_per_s
                        for s in range(3)])

    assert speed(pick) > speed(start)


def test_drift_applies_to_lognormal_only():
    with pytest.raises(ScenarioError, match=r"workload\.response_length\.drift"):
        from_dict({"name": "x", "hardware": "H100-80GB", "model": "Qwen3-8B",
                   "workload": {"response_length": {"dist": "uniform", "drift": {"median": 10}}}})
