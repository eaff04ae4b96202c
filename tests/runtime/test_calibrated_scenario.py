"""A run's ``scenario.yaml``: it loads, simulates every policy, and predicts the run.

The runs are the real runtime's executor on fake devices (``fake_run.py``, a virtual
clock): the same ``DeviceExecutor``, profile and export as ``bidirl train``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fake_run import run_fake
from test_executor_fake import WORKLOADS

from bidirl.controller.events import StageMeasured
from bidirl.policy import policy_names
from bidirl.runtime import calibrated_scenario
from bidirl.runtime.rollout_driver import DECODE_REMAINDER
from bidirl.sim.run import simulate
from bidirl.sim.scenario import load
from bidirl.sim.workload import ResponseLengths


def _export(tmp_path, policy: str, workload: str):
    run = run_fake(policy, **WORKLOADS[workload])
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy=policy), run=SimpleNamespace(seed=0))
    path = calibrated_scenario.write(tmp_path, cfg, run.executor, run.intervals)
    return run, path


def _tokens_per_s(run) -> float:
    steps = run.executor.steps.values()
    return sum(r.total_tokens for r in steps) / max(r.finished_s for r in steps)


def test_the_scenario_loads_and_simulates_every_policy(tmp_path):
    run, path = _export(tmp_path, "bidirl", "train-heavy")
    assert path == tmp_path / "scenario.yaml"
    kinds = {json.loads(line)["event"] for line in (tmp_path / "profile.jsonl").read_text().splitlines()}
    assert kinds == {"StageMeasured", "WeightsSynced", "GroupsCompleted", "TrainStepFinished"}
    sc = load(path)
    cal = sc.calibration
    assert cal.decode and cal.prefill and cal.train_micro and cal.aux_micro and cal.reprefill_on_sync
    assert cal.replica_cap == run.spec.replica_cap and sc.steps == run.spec.steps
    assert sc.costs.train_on_roll_c_in_s == pytest.approx(0.01)  # measured, not the prior
    for policy in policy_names():
        r = simulate(sc, policy, record_intervals=False)
        assert r.groups_lost == 0 and r.extra["ledger_ok"]
    assert not cal.prewarmed  # fake devices time nothing before the loop


def test_a_run_that_prewarmed_says_so(tmp_path):
    """``bidirl train`` times each lent role's hot switch before its loop (``prewarm.*``
    switches) and a weight load (a ``weight_sync`` measurement at t = 0): its scenario has
    ``calibration.prewarmed``, and the simulator starts the scheduler from those costs too."""
    run = run_fake("bidirl", **WORKLOADS["train-heavy"])
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy="bidirl"), run=SimpleNamespace(seed=0))
    run.executor.switches.append(("prewarm.roll_on_train.c_in", 0.04))
    (tmp_path / "lends").mkdir()
    (tmp_path / "load").mkdir()
    assert load(calibrated_scenario.write(tmp_path / "lends", cfg, run.executor, run.intervals)).calibration.prewarmed
    run = run_fake("async", **WORKLOADS["train-heavy"])
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy="async"), run=SimpleNamespace(seed=0))
    run.executor.profile.insert(0, (0.0, StageMeasured("weight_sync", (1.0,), 0.05)))
    assert load(calibrated_scenario.write(tmp_path / "load", cfg, run.executor, run.intervals)).calibration.prewarmed


def test_the_decoding_after_each_replicas_last_sum_is_profiled_and_fitted(tmp_path):
    """Decode steps are measured in sums of DECODE_SAMPLE_S; what a replica decoded after
    its last sum goes to the profile at the end, so the scenario counts all of it (in this
    short run every replica ends part-way into a sum: about a quarter of its decoding)."""
    run, path = _export(tmp_path, "bidirl", "train-heavy")
    recs = [json.loads(line) for line in (tmp_path / "profile.jsonl").read_text().splitlines()]
    left = [r for r in recs if r["event"] == "StageMeasured" and r["stage"] == DECODE_REMAINDER]
    assert left and all(r["seconds"] > 0 and r["features"][0] >= 1 for r in left)
    assert len(left) <= run.spec.n_replicas
    sums = [r for r in recs if r["event"] == "StageMeasured" and r["stage"] == "decode"]
    theta = load(path).calibration.decode
    # the fit is scaled to the measured total: the sums' seconds and the remainders' together
    fitted = sum(sum(c * f for c, f in zip(theta, r["features"])) for r in sums + left)
    assert fitted == pytest.approx(sum(r["seconds"] for r in sums + left), rel=1e-6)
    assert run.executor.rollout.take_remainders() == []  # taken once: a second finish adds none


def test_the_lengths_are_the_runs_own_in_group_order(tmp_path):
    run, path = _export(tmp_path, "async", "rollout-heavy")
    sc = load(path)
    lengths = ResponseLengths(sc.workload.response_length, sc.workload.prompts_per_step,
                              sc.workload.group_size, sc.seed)
    for g in range(run.spec.total_groups):
        trained = tuple(len(run.responses[(g, i)].token_ids) for i in range(run.spec.group_size))
        assert lengths.lengths(g) == trained


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("policy", ["async", "bidirl"])
def test_the_scenario_predicts_the_run_it_came_from(tmp_path, workload, policy):
    run, path = _export(tmp_path, policy, workload)
    predicted = simulate(load(path), policy, record_intervals=False).throughput_tokens_per_s
    assert predicted / _tokens_per_s(run) == pytest.approx(1.0, abs=0.1)


def _measured(t, stage, seconds):
    return {"event": "StageMeasured", "t": t, "stage": stage, "seconds": seconds}


def _finished(t, seconds):
    return {"event": "TrainStepFinished", "t": t, "seconds": seconds}


def test_the_step_overhead_is_what_follows_the_compute():
    # a step of the primary alone: 1.0 s of which 0.8 s computed (one rank)
    plain = [_measured(0.5, "train_micro", 0.4), _measured(0.9, "train_micro", 0.4), _finished(1.0, 1.0)]
    # a step with an auxiliary: the last chunk is back at 2.6, its gradient pulled in 0.03 s
    merged = [_measured(1.4, "train_micro", 0.4), _measured(2.6, "aux_micro", 1.5),
              _measured(2.7, "train_on_roll.c_grad", 0.03), _finished(2.7, 1.7)]
    overhead = calibrated_scenario._step_overhead
    assert overhead(plain + merged, dp=1) == pytest.approx(0.2)  # steps without auxiliaries first
    # every step had auxiliaries (bidirl, train-heavy): the time after the last chunk less C_grad
    assert overhead(merged, dp=1) == pytest.approx(0.07)
    assert overhead([_finished(1.0, 1.0)], dp=1) is None  # nothing measured: no figure


def test_a_run_with_images_describes_them(tmp_path):
    """A vision-language run's scenario says how many images its prompts held, their pixels and
    bytes; the tower's time is inside the fitted prefill, so the simulator adds none (it loads
    and simulates as any other)."""
    run = run_fake("bidirl", **WORKLOADS["train-heavy"])
    for r in run.executor.steps.values():  # one 64 x 64 picture of 1,000 bytes per group
        n = len(r.group_ids)
        r.images, r.image_bytes, r.image_pixels = n, 1000 * n, 4096 * n
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy="bidirl"), run=SimpleNamespace(seed=0))
    sc = load(calibrated_scenario.write(tmp_path, cfg, run.executor, run.intervals))
    w = sc.workload
    assert (w.images_per_prompt, w.image_pixels, w.image_bytes) == (1, 4096, 1000)
    assert "vision tower's time is inside the measured prefill" in sc.description
    assert simulate(sc, "bidirl", record_intervals=False).groups_lost == 0


def test_a_runs_syncs_with_their_bytes_give_the_transports_cost_per_gb(tmp_path):
    """``WeightsSynced.bytes_moved`` (a collective or shm sync records it) becomes
    ``costs.weight_sync_s_per_gb``: the transport's cost, to scale the run to another model."""
    from bidirl.controller.events import WeightsSynced

    run = run_fake("bidirl", **WORKLOADS["train-heavy"])
    cfg = SimpleNamespace(scheduler=SimpleNamespace(policy="bidirl"), run=SimpleNamespace(seed=0))
    for i, (secs, nbytes) in enumerate([(0.02, 10**8), (0.03, 10**8), (0.5, 10**9)]):
        run.executor.profile.append((1.0 + i, WeightsSynced(100 + i, secs, bytes_moved=nbytes)))
    sc = load(calibrated_scenario.write(tmp_path, cfg, run.executor, run.intervals))
    assert sc.costs.weight_sync_s_per_gb == pytest.approx(0.3)  # the median of 0.2, 0.3 and 0.5 s/GB
