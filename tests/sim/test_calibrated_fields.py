"""The scenario fields a real run's ``scenario.yaml`` uses: measured stage models, the
replica cap, re-prefill after a weight update, a per-step overhead, empirical lengths."""

import dataclasses
from pathlib import Path

import pytest

from bidirl.perf.scenario import Calibration, ResponseLength
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError, from_dict, load
from bidirl.sim.workload import ResponseLengths
from bidirl.sim.world import build

CALIBRATED = {
    "name": "cal", "hardware": "cpu-core", "model": "tiny-qwen2", "devices": 2, "steps": 4,
    "workload": {"prompts_per_step": 4, "group_size": 4, "prompt_tokens": 12,
                 "response_length": {"dist": "empirical", "min": 1, "max": 64,
                                     "values": [5, 64, 30, 12, 1, 2, 3, 64], "order": "cycle"}},
    "pools": {"rollout_devices": 1, "train_devices": 1, "train": {"dp": 1, "tp": 1}},
    "sim": {"timing_noise_cv": 0.0, "prior_scale": 1.0, "micro_batch_tokens": 300},
    "calibration": {"decode": [0.03, 1e-4, 1e-7], "prefill": [0.01, 2e-4],
                    "train_micro": [0.0, 7e-4, 1e-6], "train_step_overhead_s": 0.06,
                    "replica_cap": 12, "reprefill_on_sync": True, "startup_s": 0.5},
}


def test_calibration_replaces_the_rooflines_of_the_simulated_hardware():
    sc = from_dict(CALIBRATED)
    spec, truth, _ = build(sc)
    assert truth.rollout.decode.theta == [0.03, 1e-4, 1e-7]
    assert truth.rollout.prefill.theta == [0.01, 2e-4]
    assert truth.train.micro.theta == [0.0, 7e-4, 1e-6]
    assert truth.aux.micro.theta == truth.train.micro.theta  # aux_micro null: same devices
    assert truth.step_overhead_s == 0.06 and truth.reprefill_on_sync and truth.startup_s == 0.5
    assert spec.replica_cap == 12
    plain = build(load("tiny-cpu"))[1]  # no calibration: the profile's roofline, as before
    assert plain.rollout.decode.theta != truth.rollout.decode.theta and not plain.reprefill_on_sync


def test_empirical_lengths_are_replayed_in_group_order():
    d = ResponseLength(dist="empirical", max=64, values=(5, 64, 30, 12, 1, 2, 3, 64))
    lengths = ResponseLengths(d, groups_per_step=2, group_size=4, seed=0, steps=1)
    assert lengths.lengths(0) == (5, 64, 30, 12) and lengths.lengths(1) == (1, 2, 3, 64)
    assert ResponseLengths(d, 2, 4, seed=5, steps=1).lengths(1) == (1, 2, 3, 64)  # a replay ignores the seed
    with pytest.raises(ScenarioError, match=r"response_length\.order"):
        lengths.lengths(2)  # past the end: never wrapped silently
    with pytest.raises(ScenarioError, match=r"response_length\.values: holds 8 lengths .* need 16"):
        ResponseLengths(d, 2, 4, seed=0, steps=2)
    cycled = ResponseLengths(dataclasses.replace(d, order="cycle"), 2, 4, seed=0, steps=2)
    assert cycled.lengths(2) == (5, 64, 30, 12)  # asked for
    assert lengths.mean() == pytest.approx(181 / 8)


def test_sampled_lengths_follow_the_seed_and_keep_to_the_values():
    d = ResponseLength(dist="empirical", max=64, values=(5, 64, 30, 12, 1, 2, 3, 64), order="sample")
    a, b = (ResponseLengths(d, 2, 4, seed=s, steps=50) for s in (0, 1))
    rows = [a.lengths(g) for g in range(100)]
    assert rows == [ResponseLengths(d, 2, 4, seed=0, steps=50).lengths(g) for g in range(100)]
    assert rows != [b.lengths(g) for g in range(100)]
    assert {x for r in rows for x in r} <= set(d.values)


@pytest.mark.parametrize("change, field", [
    ({"calibration": {"decode": [0.1, 0.2]}}, "calibration.decode"),
    ({"calibration": {"train_micro": [0.1, -0.2, 0.0]}}, "calibration.train_micro"),
    ({"calibration": {"replica_cap": 0}}, "calibration.replica_cap"),
    ({"workload": {"response_length": {"dist": "empirical"}}}, "workload.response_length.values"),
    ({"workload": {"response_length": {"dist": "empirical", "min": 1, "max": 8, "values": [3, 9]}}},
     "workload.response_length.values"),
])
def test_bad_calibration_fields_are_named(change, field):
    data = {**CALIBRATED, **change}
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        from_dict(data)


def test_every_policy_runs_a_calibrated_scenario():
    sc = from_dict(CALIBRATED)
    for policy in ("sync", "one-step-off", "async", "roll-borrow", "train-borrow",
                   "bidirl-opportunistic", "bidirl"):
        r = simulate(sc, policy, record_intervals=False)
        assert r.groups_lost == 0 and r.extra["ledger_ok"]


def test_reprefill_after_a_weight_update_the_step_overhead_and_the_startup_cost_throughput():
    base = from_dict(CALIBRATED)
    cal = base.calibration
    for change in ({"reprefill_on_sync": False}, {"train_step_overhead_s": 0.0}, {"startup_s": 0.0}):
        lighter = base.replace(calibration=dataclasses.replace(cal, **change))
        assert (simulate(lighter, "async").throughput_tokens_per_s
                > simulate(base, "async").throughput_tokens_per_s), change
    r = simulate(base, "async")  # nothing runs during the start-up: every device idles
    first = min((iv for iv in r.intervals if iv.activity.value != "idle"), key=lambda iv: iv.start_s)
    assert first.start_s >= 0.5
    assert Calibration().decode is None and not Calibration().reprefill_on_sync


def test_prefill_per_response_is_one_burst_of_every_responses_prompt(monkeypatch):
    """bidirl's runtime (vLLM, prefix caching off): a replica given groups prefills every
    response's prompt, all at once; the measurement is per burst, as the real one is."""
    from bidirl.sim.rollout import StageSamples

    seen = []
    real = StageSamples.add_prefill
    monkeypatch.setattr(StageSamples, "add_prefill",
                        lambda self, u, groups, tokens, seconds: (seen.append((groups, tokens, seconds)),
                                                                  real(self, u, groups, tokens, seconds)))
    data = {**CALIBRATED, "calibration": {**CALIBRATED["calibration"], "prefill_per_response": True}}
    slow = simulate(from_dict(data), "async")
    bursts = list(seen)
    seen.clear()
    fast = simulate(from_dict(CALIBRATED), "async")
    assert all(g == 1 and tok % 12 == 0 for g, tok, _ in bursts)  # whole prompts of 12 tokens
    first = bursts[0]
    assert first[1] % 48 == 0 and first[2] == pytest.approx(0.01 + 2e-4 * first[1])  # whole groups of 4
    assert sum(t for _, t, _ in bursts) == 4 * sum(t for _, t, _ in seen)  # group_size x the shared prompts
    assert slow.wall_s > fast.wall_s


RUN = Path(__file__).parent / "data" / "rollout_heavy_bidirl_run.yaml"
RUN_MEASURED_TOKENS_PER_S = 710.8  # the real run's own figure (the file's header)


def _first_start(result, device: int, pred) -> float:
    return min(iv.start_s for iv in result.intervals if iv.device == device and pred(iv))


def test_a_prewarmed_run_is_replayed_with_its_scheduler_starting_from_the_measured_costs():
    """A real rollout-heavy run lent its idle trainer at t = 0.01 s: its pre-warm had measured
    C_in at 0.04 s.  The simulated scheduler, started from the roofline prior (0.23 s), turned
    that lend down and left the trainer idle until step 0 (sim/real 0.93); started from the
    scenario's measured costs, as the run was, it lends at the start too."""
    sc = load(str(RUN))
    assert sc.calibration.prewarmed
    on = simulate(sc, "bidirl")
    off = simulate(sc.replace(calibration=dataclasses.replace(sc.calibration, prewarmed=False)), "bidirl")
    train = sc.pools.rollout_devices  # the training device's id
    for r in (on, off):
        assert r.groups_lost == 0 and r.staleness["max"] <= sc.staleness
    step0 = _first_start(on, train, lambda iv: iv.activity.value == "busy" and not iv.borrowed)
    assert _first_start(on, train, lambda iv: iv.borrowed) < step0  # lent before step 0
    assert _first_start(off, train, lambda iv: iv.borrowed) > _first_start(
        off, train, lambda iv: iv.activity.value == "busy" and not iv.borrowed)
    assert on.throughput_tokens_per_s > off.throughput_tokens_per_s
    assert abs(on.throughput_tokens_per_s / RUN_MEASURED_TOKENS_PER_S - 1) <= 0.10


@pytest.mark.parametrize("policy, kinds", [
    ("async", set()), ("roll-borrow", {"roll_on_train"}), ("train-borrow", {"train_on_roll"}),
    ("bidirl", {"roll_on_train", "train_on_roll"})])
def test_the_simulated_prewarm_measures_what_the_real_one_does_for_each_policy(monkeypatch, policy, kinds):
    """As ``runtime/placement.py:prewarm``: a hot C_in and C_out of each unit the policy may
    lend, at the scenario's costs, and one weight load; nothing without ``prewarmed``."""
    from bidirl.controller.estimates import Estimates

    seen = []
    monkeypatch.setattr(Estimates, "learn_start_up", lambda self, sw, loads=(): seen.append((list(sw), list(loads))))
    sc = load(str(RUN))
    simulate(sc, policy, record_intervals=False)
    (switches, loads), = seen
    assert {k.split(".")[0] for k, _, _ in switches} == kinds
    for kind, unit, seconds in switches:
        assert seconds == getattr(sc.costs, kind.replace(".", "_") + "_s")
        assert (unit < sc.pools.rollout_devices) == kind.startswith("train_on_roll")
    assert len(switches) == 2 * len(kinds) and loads == [sc.costs.weight_sync_s]
    seen.clear()
    simulate(sc.replace(calibration=dataclasses.replace(sc.calibration, prewarmed=False)), policy,
             record_intervals=False)
    assert seen == []
