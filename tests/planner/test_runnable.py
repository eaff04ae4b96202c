"""Plan -> run: ``bidirl plan`` picks only layouts the runtime executes (``planner/runnable.py``),
``--what-if`` keeps the rest for the simulator, and ``bidirl train --plan`` turns a plan into
the run's layout or refuses it in one line."""

from __future__ import annotations

import json

import pytest

from bidirl.cli import main
from bidirl.planner import plan as planner
from bidirl.planner.envelope import Envelope
from bidirl.planner.runnable import plan_file_overrides, plan_overrides, unrunnable_reason
from bidirl.sim import scenario as scn


def test_the_runtimes_limits_name_the_missing_piece():
    assert unrunnable_reason(Envelope(4, 4, 1, 4, 1)) is None
    assert "train_tp 2" in unrunnable_reason(Envelope(4, 4, 1, 2, 2))
    assert "rollout_tp 4" in unrunnable_reason(Envelope(4, 4, 4, 4, 1)), "GPUs: one device a replica"
    assert unrunnable_reason(Envelope(4, 4, 4, 4, 1), cpu=True) is None, "CPU cores: a replica may span 4"
    assert "rollout_tp 16" in unrunnable_reason(Envelope(16, 16, 16, 16, 1), cpu=True)


def test_a_cpu_plans_tensor_parallel_replicas_run_and_a_gpu_plans_are_refused(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "tiny-cpu", "--confirm", "0", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["hardware"] == "cpu-core"
    wide = {**plan, "envelope": {**plan["envelope"], "rollout_devices": 2, "rollout_tp": 2}}
    assert "rollout.tensor_parallel_size=2" in plan_overrides(wide)
    with pytest.raises(ValueError, match="on GPUs a rollout replica is one device"):
        plan_overrides({**wide, "hardware": "H100-80GB"})
    with pytest.raises(ValueError, match="on GPUs"):
        plan_overrides({k: v for k, v in wide.items() if k != "hardware"})  # an older plan: the stricter limits


def test_a_runnable_plan_keeps_only_runnable_layouts_and_says_why_others_went():
    sc = scn.load("h100-32-qwen3-8b")
    what_if = planner.plan(sc, top_k=3)
    runnable = planner.plan(sc, top_k=3, runnable_only=True)
    assert any(unrunnable_reason(c.envelope) for c in what_if.candidates), "the what-if space is wider"
    assert all(unrunnable_reason(c.envelope) is None for c in runnable.candidates)
    assert runnable.compatible < what_if.compatible
    runtime = [r for r in runnable.rejected if r.constraint == "runtime"]
    assert runtime and all(r.reason.startswith("runtime: ") for r in runtime)
    assert runnable.envelope in [c.envelope for c in what_if.candidates]


def test_plan_json_to_train_overrides(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "tiny-cpu", "--confirm", "0", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    over = plan_file_overrides(str(out))
    e = plan["envelope"]
    assert over[:2] == [f"cluster.rollout_devices={e['rollout_devices']}",
                        f"cluster.train_devices={e['train_devices']}"]
    assert over[2] == f"trainer.strategy={'fsdp2' if e['train_layout']['sharded'] else 'ddp'}"
    assert over[3] == "scheduler.policy=bidirl"
    sharded = {**plan, "envelope": {**e, "train_layout": {**e["train_layout"], "sharded": True}}}
    assert "trainer.strategy=fsdp2" in plan_overrides(sharded)


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read it"),
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"scenario": "x"}', "not a plan written by `bidirl plan --json`"),
])
def test_a_bad_plan_file_is_one_line(tmp_path, content, needle):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=needle) as err:
        plan_file_overrides(str(path))
    assert "\n" not in str(err.value)


def test_train_refuses_a_what_if_layout_in_one_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "h100-32-qwen3-8b", "--what-if", "--confirm", "0", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert unrunnable_reason(Envelope(plan["envelope"]["rollout_devices"], plan["envelope"]["train_devices"],
                                      plan["envelope"]["rollout_tp"], plan["envelope"]["train_layout"]["dp"],
                                      plan["envelope"]["train_layout"]["tp"])), "this scenario's what-if pick is TP"
    capsys.readouterr()
    assert main(["train", "--plan", str(out), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bidirl train cannot run" in err[0] and "without --what-if" in err[0]
