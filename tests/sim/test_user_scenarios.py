"""Users' own clusters and models: hand-written scenarios with custom hardware and a model
from a Hugging Face config.json simulate and plan; one memory model refuses what does not fit."""

from pathlib import Path

import pytest

from bidirl.perf.profile_spec import HardwareSpec, ModelSpec, model_profile
from bidirl.perf.profiles import MODELS
from bidirl.planner.context import PlanContext
from bidirl.planner.plan import candidate_envelopes, plan, scenario_with_envelope
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError, builtin_names, from_dict, load
from bidirl.sim.world import build

USER = [n for n in builtin_names() if n.startswith("user-")]
MODELS_DIR = Path(__file__).parents[2] / "src" / "bidirl" / "sim" / "scenarios" / "models"


def test_there_are_five_users_scenarios():
    assert len(USER) == 5


@pytest.mark.parametrize("name", USER)
def test_a_users_scenario_simulates_and_plans(name):
    sc = load(name)
    assert isinstance(sc.hardware, HardwareSpec) and isinstance(sc.model, ModelSpec)
    assert sc.model.config is not None and Path(sc.model.config, "config.json").is_file()
    spec, _, _ = build(sc)
    assert spec.devices_per_node == sc.hw.devices_per_node and spec.hw_profile == sc.hw
    r = simulate(sc, "bidirl", steps=2, record_intervals=False)
    assert r.groups_lost == 0 and r.extra["ledger_ok"] and r.throughput_tokens_per_s > 0
    p = plan(sc, steps=2, top_k=1)
    auto = simulate(scenario_with_envelope(sc, p.envelope), "bidirl", steps=2, record_intervals=False)
    assert auto.groups_lost == 0 and auto.extra["ledger_ok"]


def test_a_config_json_gives_the_catalogue_model():
    m = model_profile(ModelSpec(config=str(MODELS_DIR / "qwen3-8b")), ScenarioError)
    ref = MODELS["Qwen3-8B"]
    for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "bytes_per_param"):
        assert getattr(m, f) == getattr(ref, f), f
    assert m.params == pytest.approx(ref.params, rel=1e-3)
    fields = model_profile(ModelSpec(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                                     vocab=151936, intermediate=12288), ScenarioError)
    assert fields.params == m.params  # the fields alone count the same parameters


def test_a_mixture_of_experts_runs_its_active_parameters():
    m = model_profile(ModelSpec(config=str(MODELS_DIR / "qwen3-30b-a3b" / "config.json")), ScenarioError)
    assert 25e9 < m.params < 35e9 and 2e9 < m.active_params < 5e9
    assert m.flops_per_token == 2 * m.active_params and m.weights_bytes == 2 * m.params


def test_node_size_is_the_users():
    """12 devices in nodes of 4 are 3 nodes: no tensor-parallel group wider than a node."""
    sc = load("user-a6000-12-14b")
    assert sc.hw.devices_per_node == 4
    assert max(e.rollout_tp for e in candidate_envelopes(PlanContext.from_scenario(sc))) == 4
    assert build(sc)[0].train_spans_nodes


A6000_14B = {
    "name": "a6000-6-6", "hardware": "A6000-48GB", "model": {"config": str(MODELS_DIR / "qwen3-14b")},
    "devices": 12, "steps": 2,
    "workload": {"prompts_per_step": 8, "group_size": 8, "response_length": {"median": 500, "max": 2048}},
    "pools": {"rollout_devices": 6, "train_devices": 6, "train": {"dp": 6}},
}


def test_a_split_whose_trainer_does_not_fit_is_refused_with_the_reason():
    with pytest.raises(ScenarioError, match=r"pools: .*train_memory: trainer \(dp=6.*GiB.*allow-oversubscribe"):
        simulate(from_dict(A6000_14B), "async")
    r = simulate(from_dict(A6000_14B), "async", allow_oversubscribe=True)
    assert r.groups_lost == 0
    pick = plan(from_dict(A6000_14B)).envelope  # the planner's pick fits: the simulator runs it
    assert simulate(from_dict(A6000_14B), "async", pools=pick.to_pools()).groups_lost == 0


def test_no_auxiliary_trainer_is_lent_where_it_does_not_fit():
    """A 14B auxiliary trainer (params + fp32 gradients, 82 GiB) on one A6000: never lent."""
    data = {**A6000_14B, "devices": 12, "sim": {"micro_batch_tokens": 4096},
            "pools": {"rollout_devices": 4, "train_devices": 8, "train": {"dp": 8}}}
    sc = from_dict(data)
    spec, _, _ = build(sc)
    assert not spec.aux_trainers
    for policy in ("train-borrow", "bidirl-opportunistic", "bidirl"):
        assert simulate(sc, policy, record_intervals=False).borrows["train_on_roll"] == 0
    tp4 = from_dict({**data, "pools": {"rollout_devices": 4, "train_devices": 8, "rollout_tp": 4,
                                        "train": {"dp": 8}}})
    assert build(tp4)[0].aux_trainers  # sharded over a 4-device replica it fits
