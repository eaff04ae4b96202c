"""Multi-turn trajectories in the simulator (``workload.turns``, ``sim/turns.py``): turns
decode on the replicas, tool waits hold no slot, reclaimed mid-turn prefixes resume, groups
complete when every trajectory has ended and train over model and environment tokens."""

from __future__ import annotations

import pytest

from bidirl.policy import policy_names
from bidirl.sim import turns as turns_mod
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError, from_dict, load
from bidirl.sim.world import build


def tiny(turns: dict, length: dict | None = None, **top) -> object:
    d = load("tiny-cpu").to_dict()
    d["workload"]["turns"] = turns
    if length is not None:
        d["workload"]["response_length"] = length
    d.update(top)
    return from_dict(d)


def test_defaults_are_single_turn_and_checks_name_the_field():
    w = load("default").workload
    assert w.turns.count == 1 and not w.turns.multi and w.turns.tool_latency_s == 0
    assert not tiny({"dist": "uniform", "min": 1, "max": 1}).workload.turns.multi
    with pytest.raises(ScenarioError, match=r"^workload\.turns\.min: must be <= max"):
        tiny({"dist": "uniform", "min": 3, "max": 2})
    with pytest.raises(ScenarioError, match=r"^workload\.turns\.values: must list"):
        tiny({"dist": "empirical"})
    with pytest.raises(ScenarioError, match=r"workload\.turns\.tool_latency_s"):
        tiny({"count": 2, "tool_latency_s": -1})
    with pytest.raises(ScenarioError, match=r"workload\.turns\.dist"):
        tiny({"dist": "poisson"})


def test_tokens_trained_are_every_turn_and_environment_reply():
    # 3 turns of 20 tokens, 2 environment replies of 10: 80 tokens after the 32-token prompt
    sc = tiny({"count": 3, "tool_latency_s": 0.5, "env_tokens": 10}, {"dist": "constant", "max": 20})
    for pol in ("sync", "roll-borrow", "bidirl"):
        r = simulate(sc, pol, record_intervals=False)
        assert r.extra["ledger_ok"] and r.groups_lost == 0
        assert r.tokens_trained == sc.steps * 4 * 4 * (32 + 3 * 20 + 2 * 10)


def test_turn_lengths_are_drawn_per_turn_and_deterministic():
    sc = tiny({"dist": "uniform", "min": 1, "max": 5}, {"dist": "lognormal", "median": 30, "sigma": 0.8,
                                                           "min": 4, "max": 64})
    _, truth, lengths = build(sc)
    d = truth.turns
    assert d.counts(5) == build(sc)[1].turns.counts(5)
    assert all(1 <= c <= 5 for g in range(40) for c in d.counts(g))
    assert [d.length(g, 0, 0) for g in range(8)] == [lengths.lengths(g)[0] for g in range(8)]
    turn_lengths = [d.length(g, i, j) for g in range(40) for i in range(4) for j in range(1, 4)]
    assert len(set(turn_lengths)) > 20  # later turns are drawn afresh, not copies of turn 0
    assert all(4 <= n <= 64 for n in turn_lengths)


def test_tool_waits_are_on_the_critical_path_but_free_the_replica():
    fast = tiny({"count": 4, "tool_latency_s": 0.0}, {"dist": "constant", "max": 16})
    slow = tiny({"count": 4, "tool_latency_s": 2.0}, {"dist": "constant", "max": 16})
    rf, rs = simulate(fast, "sync"), simulate(slow, "sync")
    # sync: every step waits for its slowest trajectory, a tool wait of 2 s after each of its 4 turns
    assert rs.wall_s - rf.wall_s == pytest.approx(slow.steps * 4 * 2.0, rel=0.15)
    waits = [iv for iv in rs.intervals if iv.label == "tool wait"]
    assert waits and all(iv.activity == "idle" for iv in waits)
    assert sum(iv.end_s - iv.start_s for iv in waits) == pytest.approx(slow.steps * 4 * 2.0, rel=0.2)


def test_reclaimed_replicas_hand_back_mid_turn_and_tool_waiting_trajectories(monkeypatch):
    handed = []
    real = turns_mod.TrajectoryBook.evict

    def evict(self, u, parts):
        out = real(self, u, parts)
        handed.append((out, [s for g in out for s in self.groups[g[0]].state]))
        return out

    monkeypatch.setattr(turns_mod.TrajectoryBook, "evict", evict)
    sc = load("agentic-8turn")
    r = simulate(sc, "roll-borrow", steps=4, record_intervals=False)
    assert r.borrows["roll_on_train"] > 0 and len(handed) > 5
    states = {s for _, st in handed for s in st}
    assert turns_mod.READY in states and turns_mod.TOOL in states  # mid-turn and on their tools
    assert r.extra["ledger_ok"] and r.groups_lost == 0
    _, truth, _ = build(sc.replace(steps=4))
    d, env = truth.turns, sc.workload.turns.env_tokens
    want = sum(sc.workload.prompt_tokens + sum(d.trajectory(g, i)) + env * (d.counts(g)[i] - 1)
               for g in range(4 * sc.workload.prompts_per_step) for i in range(sc.workload.group_size))
    assert r.tokens_trained == want  # nothing generated twice or lost across the reclaims


def test_agentic_scenario_runs_every_policy_deterministically():
    sc = load("agentic-8turn")
    assert sc.workload.turns.multi and sc.workload.turns.tool_latency_s > 0
    results = {}
    for pol in policy_names():
        r = simulate(sc, pol, steps=3, record_intervals=False)
        assert r.extra["ledger_ok"] and r.groups_lost == 0, pol
        assert 0 < r.efficiency <= 1 and r.efficiency_attainable <= 1.05, pol
        results[pol] = r
    again = simulate(sc, "bidirl", steps=3, record_intervals=False)
    assert again.trace_sha256 == results["bidirl"].trace_sha256
    assert results["bidirl"].throughput_tokens_per_s > results["sync"].throughput_tokens_per_s
