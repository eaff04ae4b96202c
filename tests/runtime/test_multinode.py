"""Beyond one machine: a 2-node Ray cluster built from network namespaces on this machine.

The fast tests check node-aware placement without Ray: devices go on nodes as the
planner's envelope lays them out (and as the controller's ledger and the planner's node
alignment read them), switch costs are kept per node pair and a borrowed role goes to the
node holding the newest weights when costs tie.

The cluster tests (root only: namespaces and veth links) start a Ray head in one namespace
and a worker node in another, linked by a veth pair with addresses of a private /24, each
node offering one ``bidirl_devices``; ``bidirl train --ray-address`` runs in the head's
namespace with the rollout device on the head and the training device on the other node.
Every process of the cluster is started with ``PYTHONPATH`` at this checkout's ``src``, so
the workers of both nodes import the code under test.  The module's cluster is torn down
at the end, and the teardown asserts that no namespace, link, process or directory of it
is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from runtime_cli_helpers import ROOT, SMALL, assert_run_sound, run_cli

from bidirl.controller.estimates import Estimates
from bidirl.controller.state import ClusterState
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.placement import assign_nodes, check_units_fit_nodes
from bidirl.runtime.run_spec import build_spec

PPS = 4  # SMALL's rollout.prompts_per_step


# -- placement, without Ray -----------------------------------------------------------------
def test_devices_fill_nodes_in_layout_order_and_a_short_cluster_is_refused():
    assert assign_nodes([2, 2], 3) == ([0, 0, 1], 2)
    assert assign_nodes([1, 1], 2) == ([0, 1], 1)
    check_units_fit_nodes(2, 4, 2)  # 2-device replicas, 4 devices a node: every unit on one node
    check_units_fit_nodes(3, 4, 1)  # one node: nothing to straddle
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size: 3 devices a replica .* divisor of 4"):
        check_units_fit_nodes(3, 4, 2)
    assert assign_nodes([8], 3) == ([0, 0, 0], 3), "one node holds a small run whole"
    with pytest.raises(ConfigError, match=r"need 3 nodes; the cluster has 2"):
        assign_nodes([1, 1], 3)
    with pytest.raises(ConfigError, match=r"node 1 offers 1 devices, the layout puts 2 on it"):
        assign_nodes([2, 1], 4)
    with pytest.raises(ConfigError, match="no node offers a device"):
        assign_nodes([], 2)


@pytest.mark.parametrize("rollout,train,offers", [(1, 1, [1, 1]), (1, 3, [2, 2]), (3, 1, [2, 2]), (2, 2, [4]),
                                                  (3, 3, [2, 2, 2])])
def test_the_planner_the_ledger_and_the_placement_put_each_device_on_the_same_node(rollout, train, offers):
    """The envelope's rule (consecutive devices share a node, ``d // devices_per_node``), the
    controller's device ledger and the runtime's placement agree; so do "the trainer spans
    nodes" and the planner's node-alignment check (tensor parallel 1: nothing misaligned)."""
    from bidirl.planner.compat import first_misaligned

    cfg = load_config(None, [f"cluster.rollout_devices={rollout}", f"cluster.train_devices={train}"])
    device_node, per = assign_nodes(offers, rollout + train)
    spec = build_spec(cfg, steps=4, prompt_tokens=10, per_node=per)
    assert spec.devices_per_node == per
    assert [d // spec.devices_per_node for d in range(spec.devices)] == device_node
    ledger = ClusterState(spec).devices.devices
    assert [ledger[d].node for d in range(spec.devices)] == device_node
    assert spec.train_spans_nodes == (len({device_node[d] for d in spec.train_devices}) > 1)
    assert first_misaligned(0, spec.rollout_tp, spec.n_replicas, per) is None
    assert first_misaligned(rollout, spec.train_tp, spec.train_dp, per) is None


def test_a_borrowed_role_goes_to_the_node_holding_the_newest_weights_when_costs_tie():
    """Rollout units 0, 1 on node 0; unit 2 and the trainer (device 3) on node 1."""
    cfg = load_config(None, ["cluster.rollout_devices=3", "cluster.train_devices=1"])
    est = Estimates(build_spec(cfg, steps=4, prompt_tokens=10, per_node=2))
    kind = "train_on_roll.c_in"
    assert est.switch_pair(kind, 0) == (1, 0) and est.switch_pair(kind, 2) == (1, 1)
    assert est.switch_pair("train_on_roll.c_grad", 0) == (0, 1), "a gradient travels back"
    assert est.nearest_first(kind, [0, 1, 2]) == [2, 0, 1], "a tie (the prior): the weights' node first"
    est.observe_switch(kind, 2, 0.05)
    est.observe_switch(kind, 0, 0.30)
    assert est.switch_s(kind, 2) == 0.05 and est.switch_s(kind, 0) == 0.30
    assert est.switch_s(kind, 1) == 0.30, "an unmeasured cross-node pair: the cross-node measurements"
    assert est.nearest_first(kind, [0, 1, 2]) == [2, 0, 1]
    for _ in range(8):  # should the near node become the slow one, the cost decides
        est.observe_switch(kind, 2, 1.0)
    assert est.nearest_first(kind, [0, 1, 2]) == [0, 1, 2]
    assert est.switch.pair_medians() == {"train_on_roll.c_in/n1-n0": 0.30, "train_on_roll.c_in/n1-n1": 1.0}


def test_lending_prices_the_node_pairs_of_the_units_it_lends(monkeypatch):
    """roll_on_train with the trainer's first device on node 0 and train units on nodes 0
    (unit 1) and 1 (units 2, 3): the admission is priced with the C_in of the node pairs it
    would lend over: the near unit's alone for one unit, the slowest pair's for more."""
    from bidirl.policy import predict
    from bidirl.policy.roll_borrow import RollLending

    cfg = load_config(None, ["cluster.rollout_devices=1", "cluster.train_devices=3"])
    spec = build_spec(cfg, steps=4, prompt_tokens=10, per_node=2)
    s = ClusterState(spec)
    kind = "roll_on_train.c_in"
    s.est.observe_switch(kind, 1, 0.01)
    s.est.observe_switch(kind, 2, 0.50)
    assert s.est.nearest_first(kind, spec.train_unit_ids()) == [1, 2, 3]
    delays = []
    monkeypatch.setattr(predict, "ready_in", lambda s, k, add=0, delay=0.0, **kw: delays.append((add, delay)) or 1.0)
    per_unit = spec.replica_cap // spec.group_size  # groups one borrowed replica can take
    for groups, units, c_in in ((per_unit, 1, 0.01), (2 * per_unit, 2, 0.50)):
        monkeypatch.setattr(s, "queued_groups", lambda limit, n=groups: n)
        delays.clear()
        decision = RollLending().judge(s)
        assert decision.units == units
        assert {d for a, d in delays if a == units and d > 0} == {c_in}


# -- a 2-node cluster of network namespaces ----------------------------------------------------
def _cluster_unavailable() -> str | None:
    for mod in ("ray", "vllm", "torch"):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed"
    from bidirl.runtime.netns_cluster import unavailable

    return unavailable()


@pytest.fixture(scope="module")
def two_nodes():
    why = _cluster_unavailable()
    if why:
        pytest.skip(f"a namespace cluster cannot be built here: {why}")
    from bidirl.runtime.netns_cluster import NetnsCluster

    cluster = NetnsCluster(nodes=2, devices=1, env={"PYTHONPATH": str(ROOT / "src")})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        left = cluster.leftovers()
        assert not left, f"the cluster left {left}"


ARGS = [*SMALL, "scheduler.policy=bidirl", "run.tensorboard=false", "run.plot=false", "run.val_every=0",
        # rollout-heavy: long responses on a replica that runs 4 at a time, so the trainer idles and lends
        "rollout.max_new_tokens=48", "rollout.max_num_seqs=4", "trainer.micro_batch_size=16"]


def _train_on(cluster, *args: str, timeout: float = 400) -> subprocess.Popen:
    """``bidirl train --ray-address`` as a driver in the head node's namespace."""
    cmd = cluster.exec_cmd(0, sys.executable, "-m", "bidirl.cli", "train", "--ray-address", cluster.address, *args)
    env = {**cluster.env(), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _ledger(run) -> list[int]:
    lines = (run / "trained_groups.jsonl").read_text().splitlines()
    return sorted(json.loads(ln)["group"] for ln in lines if ln)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
def test_two_node_run_borrows_across_nodes_and_audits_clean(two_nodes, tmp_path):
    run, steps = tmp_path / "run", 24
    proc = _train_on(two_nodes, "--run-dir", str(run), *ARGS, f"run.steps={steps}", "run.checkpoint_every=0")
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-4000:]
    ips = [two_nodes.ip_of(0), two_nodes.ip_of(1)]
    assert "2 device workers up" in err and f"on 2 nodes {ips[0]}: devices [0], {ips[1]}: devices [1]" in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit_ok"] and summary["audit"]["groups_trained"] == steps * PPS, summary["audit"]
    assert _ledger(run) == list(range(steps * PPS)), "every group trained exactly once"
    assert summary["nodes"] == {"devices_per_node": 1, "device_nodes": ips}
    assert summary["borrows"]["roll_on_train"] > 0, summary["admission"]
    pairs = summary["switch_by_node_pair"]
    # the trainer (node 1) lends itself a replica: weights stay on node 1; an auxiliary
    # trainer on the rollout device (node 0, pre-warmed) gets them across
    assert {"roll_on_train.c_in/n1-n1", "train_on_roll.c_in/n1-n0"} <= set(pairs), pairs
    assert all(v > 0 for v in pairs.values())
    from bidirl.obs.metrics import read_metrics

    last = [m for m in read_metrics(run) if m.get("step") == steps - 1][-1]
    assert last.get("switch/c_in_s/train_on_roll/n1-n0") == pytest.approx(pairs["train_on_roll.c_in/n1-n0"])


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
def test_losing_the_trainer_node_stops_and_resume_completes_on_one_node(two_nodes, tmp_path):
    """SIGKILL to every process of the worker node (the training device's) mid-run: the
    driver stops with one line naming the node, the lost device and ``--resume``; the resume, on one
    node (a private local Ray), finishes the run from the last checkpoint with every group
    trained exactly once.  Run last: the cluster is half dead afterwards."""
    run, steps = tmp_path / "run", 20
    proc = _train_on(two_nodes, "--run-dir", str(run), *ARGS, f"run.steps={steps}", "run.checkpoint_every=4")
    killed = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (run / "checkpoints" / "step_4" / "COMPLETE").is_file():
                killed = two_nodes.kill_node(1)
                break
            time.sleep(0.05)
        assert killed, "the run ended (or never checkpointed) before the node was lost"
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=60)
    errors = [ln for ln in err.splitlines() if ln.startswith("bidirl train: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert f"node {two_nodes.ip_of(1)} (devices [1]) is gone" in errors[0], errors[0]
    assert "and with it the primary trainer's devices [1]" in errors[0] and f"--resume {run}" in errors[0], errors[0]
    done = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*") if (p / "COMPLETE").is_file())
    assert done and done[-1] < steps, done
    k = done[-1]

    res = run_cli("train", "--resume", str(run))  # no --ray-address: one node, this machine
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from {run / 'checkpoints' / f'step_{k}'} at step {k}" in res.stderr
    assert _ledger(run) == list(range(steps * PPS)), "no group lost, none trained twice"
    assert_run_sound(run, steps, PPS)
