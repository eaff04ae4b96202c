"""Images in the prompt in the simulator and the planner: the vision-language catalogue
entries, the vision encoder's prefill cost (``perf/vision.py``), and the ``paper-geo3k``
scenarios (Qwen3-VL-4B on Geo3K-like prompts, 32 x H100 and 32 x A6000) under every policy."""

from __future__ import annotations

import dataclasses

import pytest

from bidirl.perf.profiles import HARDWARE, MODELS
from bidirl.perf.stage_models import RolloutStageModel
from bidirl.perf.vision import ImageLoad, image_tokens, tower_flops, vision_prefill_s
from bidirl.planner.context import PlanContext
from bidirl.sim.result import POLICIES
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError, from_dict, load
from bidirl.sim.world import build

GEO3K = ("paper-geo3k", "paper-geo3k-a6000")


@pytest.mark.parametrize("name,hardware", [("paper-geo3k", "H100-80GB"), ("paper-geo3k-a6000", "A6000-48GB")])
def test_the_scenarios_load(name, hardware):
    sc = load(name)
    w = sc.workload
    assert (sc.hw.name, sc.model_profile.name, sc.devices) == (hardware, "Qwen3-VL-4B", 32)
    assert (w.images_per_prompt, w.image_pixels, w.prompt_tokens) == (1, 448 * 448, 300 + 196)
    assert (w.prompts_per_step, w.group_size, w.response_length.max) == (512, 5, 2048)


def test_image_tokens_and_tower_cost_follow_the_models_shapes():
    q3, q25 = MODELS["Qwen3-VL-4B"], MODELS["Qwen2.5-VL-7B"]
    assert image_tokens(q3, 448 * 448) == 196 and image_tokens(q25, 448 * 448) == 256
    assert image_tokens(MODELS["Qwen3-4B"], 448 * 448) == 0 and tower_flops(MODELS["Qwen3-4B"], 1e6) == 0
    assert q3.flops_per_token == 2 * 4.02e9, "a text token does not run through the tower"
    assert q3.weights_bytes == 2 * (4.02e9 + q3.vision_params), "the tower's weights are held"
    # 784 patches: 2 x (tower - 3/4 of the mergers) each, + attention over the image in 24 layers
    assert tower_flops(q3, 448 * 448) == pytest.approx(784 * 2 * (415_347_712 - 0.75 * 109_105_152)
                                                        + 784**2 * 4 * 1024 * 24)
    h100 = HARDWARE["H100-80GB"]
    one = vision_prefill_s(h100, q3, 1, ImageLoad(1, 448 * 448, 0))
    assert 1e-3 < one < 3e-3, "~1.5 ms per 448 x 448 image on an H100"
    assert vision_prefill_s(h100, q3, 2, ImageLoad(2, 448 * 448, 0)) == pytest.approx(one)
    assert vision_prefill_s(h100, MODELS["Qwen3-4B"], 1, ImageLoad(1)) == 0


def test_the_catalogue_counts_match_transformers():
    pytest.importorskip("transformers")
    import torch
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    with torch.device("meta"):  # the towers of Qwen3-VL-4B-Instruct's and Qwen2.5-VL-7B-Instruct's config.json
        q3 = Qwen3VLVisionModel(Qwen3VLVisionConfig(
            depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh"))
        q25 = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(
            depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
            hidden_act="silu"))
    count = {name: sum(p.numel() for p in m.parameters()) for name, m in (("Qwen3-VL-4B", q3), ("Qwen2.5-VL-7B", q25))}
    mergers = {"Qwen3-VL-4B": sum(p.numel() for n, p in q3.named_parameters() if "merger" in n),
               "Qwen2.5-VL-7B": sum(p.numel() for n, p in q25.named_parameters() if "merger" in n)}
    for name in count:
        assert MODELS[name].vision_params == count[name]
        assert MODELS[name].vision_merger_params == pytest.approx(mergers[name], rel=1e-3)


def test_vision_cost_raises_prefill_time_in_priors_truth_and_planner():
    sc = load("paper-geo3k")
    hw, m, w = sc.hw, sc.model_profile, sc.workload
    vision = vision_prefill_s(hw, m, 1, w.image_load)
    text = RolloutStageModel(hw, m, 1)
    seeing = RolloutStageModel(hw, m, 1, vision_s_per_prompt=vision, prompt_tokens=w.prompt_tokens)
    assert seeing.prefill_s(w.prompt_tokens) == pytest.approx(text.prefill_s(w.prompt_tokens) + vision)
    blind = sc.replace(workload=dataclasses.replace(w, images_per_prompt=0))
    spec, truth, _ = build(sc)
    spec0, truth0, _ = build(blind)
    assert spec.prompt_vision_s == pytest.approx(vision) and spec0.prompt_vision_s == 0
    assert truth.rollout.prefill_s(w.prompt_tokens) == pytest.approx(truth0.rollout.prefill_s(w.prompt_tokens) + vision)
    plan, plan0 = PlanContext.from_scenario(sc).rollout_model(1), PlanContext.from_scenario(blind).rollout_model(1)
    assert plan.prefill_s(w.prompt_tokens) > plan0.prefill_s(w.prompt_tokens)
    # a measured prefill (a calibrated run's) already holds the tower's time
    calibrated = sc.replace(calibration=dataclasses.replace(sc.calibration, prefill=(2e-3, 2e-5)))
    assert build(calibrated)[1].rollout.prefill_s(100) == pytest.approx(2e-3 + 2e-5 * 100)


def test_images_need_a_vision_model_and_their_tokens_in_the_prompt():
    base = {"name": "x", "hardware": "H100-80GB", "devices": 16, "model": "Qwen3-4B",
            "workload": {"prompt_tokens": 500, "images_per_prompt": 1},
            "pools": {"rollout_devices": 8, "train_devices": 8, "train": {"dp": 8}}}
    with pytest.raises(ScenarioError, match="workload.images_per_prompt: 0 for Qwen3-4B, which has no vision tower"):
        from_dict(base)
    with pytest.raises(ScenarioError, match=r"workload.prompt_tokens: must count the image tokens \(2 x 196"):
        from_dict({**base, "model": "Qwen3-VL-4B", "workload": {"prompt_tokens": 300, "images_per_prompt": 2}})
    assert from_dict({**base, "model": "Qwen3-VL-4B"}).workload.image_load == ImageLoad(1, 448 * 448, 0)


@pytest.mark.parametrize("name", GEO3K)
def test_every_policy_runs_on_it(name):
    sc = load(name)
    for policy in POLICIES:
        r = simulate(sc, policy, steps=3, record_intervals=False)
        assert r.steps == 3 and r.groups_lost == 0 and r.throughput_tokens_per_s > 0, policy
