"""A multi-turn run's ``scenario.yaml`` (``runtime/calibrated_workload.py``): its turns per
trajectory, its time off the replicas per environment turn, its environment tokens per reply
and its per-turn response lengths, as the rollout driver measured them; it loads, simulates
every policy and predicts the run.

The runs are the real executor on fake devices with a multi-turn hub (as in
``test_trajectories_fake.py``).  On the fake's virtual clock a trajectory's time in its
environment is the decode steps its replica ran meanwhile in real time: it varies with the
machine's load from run to run, and it is long when the replica is full and nothing when it
is idle, which no constant tool latency describes.  So the prediction is checked on the
train-heavy run alone (its tools are a small part of its time), in a looser band than a
real run's; where the tools dominate (rollout-heavy) the simulator predicted 0.72-0.90 of
the fake's throughput over a few runs.  A real run (vLLM on CPU, ``data.task=guess_number``)
is the check that counts: docs/simulator.md.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fake_run import run_fake
from test_trajectories_fake import TRAIN_HEAVY, CountingEnv, hub_of

from bidirl.policy import policy_names
from bidirl.runtime import calibrated_scenario
from bidirl.runtime.calibrated_workload import workload_turns
from bidirl.sim.run import simulate
from bidirl.sim.scenario import load


def _export(tmp_path, policy: str, kw: dict):
    run = run_fake(policy, hub=hub_of(CountingEnv, turn_tokens=kw["max_new"] // 2), **kw)
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy=policy), run=SimpleNamespace(seed=0))
    return run, calibrated_scenario.write(tmp_path, cfg, run.executor, run.intervals)


def test_the_scenario_holds_the_runs_turns_tool_time_and_per_turn_lengths(tmp_path):
    run, path = _export(tmp_path, "async", TRAIN_HEAVY)
    stats = run.executor.rollout.trajectory_stats
    assert len(stats) == run.spec.total_groups * run.spec.group_size
    recs = [json.loads(line) for line in (tmp_path / "profile.jsonl").read_text().splitlines()]
    assert sum(r["event"] == "TrajectoryEnded" for r in recs) == len(stats)
    sc = load(path)
    t, rl = sc.workload.turns, sc.workload.response_length
    assert t.dist == "empirical" and sorted(t.values) == sorted(s[0] for s in stats)
    assert set(t.values) == {1, 2, 3}  # CountingEnv: 1 + group % 3 turns
    waits = sum(s[4] for s in stats)
    assert all(s[4] >= 0 for s in stats) and waits > 0
    assert t.tool_latency_s == pytest.approx(waits / sum(s[0] for s in stats), rel=1e-4)
    assert t.env_tokens == round(sum(s[3] for s in stats) / sum(s[0] - 1 for s in stats))
    assert rl.dist == "empirical" and rl.order == "sample"
    assert sorted(rl.values) == sorted(max(1, round(s[2] / s[0])) for s in stats)
    assert "multi-turn" in sc.description and "environment turns" in sc.description
    # the prompt is reset's: the environment's tokens are in the turns, not counted in it too
    prompts = [len(r.prompt_ids) for r in run.responses.values()]
    assert sc.workload.prompt_tokens == round(sum(prompts) / len(prompts))
    for policy in policy_names():
        r = simulate(sc, policy, record_intervals=False)
        assert r.groups_lost == 0 and r.extra["ledger_ok"], policy


def test_a_single_turn_run_writes_no_turns():
    recs = [{"event": "TrajectoryEnded", "turns": 1, "env_s": 0.1, "model_tokens": 9, "env_tokens": 0}]
    assert workload_turns(recs, 64) is None and workload_turns([], 64) is None


def test_the_environment_seconds_stand_in_when_no_wait_was_measured():
    recs = [{"event": "TrajectoryEnded", "turns": 3, "env_s": 0.9, "model_tokens": 30, "env_tokens": 20},
            {"event": "TrajectoryEnded", "turns": 1, "env_s": 0.3, "model_tokens": 7, "env_tokens": 0}]
    got = workload_turns(recs, 64)
    assert got["turns"] == {"dist": "empirical", "values": [3, 1], "tool_latency_s": 0.3, "env_tokens": 10}
    assert got["response_length"]["values"] == [10, 7]


def test_the_scenario_predicts_the_multi_turn_run_it_came_from(tmp_path):
    run, path = _export(tmp_path, "async", TRAIN_HEAVY)
    steps = run.executor.steps.values()
    measured = sum(r.total_tokens for r in steps) / max(r.finished_s for r in steps)
    predicted = simulate(load(path), "async", record_intervals=False).throughput_tokens_per_s
    assert predicted / measured == pytest.approx(1.0, abs=0.25)
