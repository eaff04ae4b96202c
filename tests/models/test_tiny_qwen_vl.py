"""The Qwen2.5-VL-shaped directory (``models/tiny_qwen_vl.py``): what a downloaded Qwen2.5-VL
holds, loaded by transformers with the PIL image processor (no torchvision), bidirl's data
path encoding a ``shapes`` row with it, the trainer's log-probs (3-D rotary positions) and a
step on its image samples, and the one-line refusal to serve it on this CPU (no vLLM here).
Its 3B shape is checked on the meta device: the parameter count of Qwen2.5-VL-3B."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from bidirl.models.tiny_qwen_vl import (  # noqa: E402
    IMAGE_PAD,
    QWEN2_5_VL_3B,
    QWEN_VL_TOKENS,
    VISION_END,
    VISION_START,
    build_qwen_vl_tokenizer,
    build_tiny_qwen_vl_model,
    processor_class_name,
    qwen_vl_config,
)

PROMPT = "<|bos|><|user|><|vision_start|><|image_pad|><|vision_end|>How many circles?<|assistant|>"


@pytest.fixture(scope="module")
def qwen_vl_dir(tmp_path_factory):
    return build_tiny_qwen_vl_model(tmp_path_factory.mktemp("models") / "tiny-qwen-vl")


@pytest.fixture(scope="module")
def shapes_rows():
    from bidirl.algo.multimodal import validate_image_row
    from bidirl.algo.tasks_visual import SHAPES

    return [validate_image_row(r, "<shapes>", i) for i, r in enumerate(SHAPES.rows(4, seed=3))]


def test_directory_holds_what_a_downloaded_qwen2_5_vl_holds(qwen_vl_dir):
    names = {p.name for p in qwen_vl_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "preprocessor_config.json", "processor_config.json", "chat_template.jinja"} <= names
    config = json.loads((qwen_vl_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    tok = build_qwen_vl_tokenizer()
    assert [config[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")] \
        == tok.convert_tokens_to_ids(QWEN_VL_TOKENS) == [263, 264, 265, 266]
    assert config["text_config"]["rope_parameters"]["mrope_section"] == [4, 6, 6]  # 16 of a 32-wide head
    pre = json.loads((qwen_vl_dir / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessorPil"
    assert sum(p.stat().st_size for p in qwen_vl_dir.iterdir()) < 5e6, "a few MB: CPU-sized"


def test_processor_loads_with_pil_and_expands_each_image_pad(qwen_vl_dir, shapes_rows):
    from transformers import AutoProcessor, AutoTokenizer

    from bidirl.algo.multimodal import decode_images

    proc = AutoProcessor.from_pretrained(str(qwen_vl_dir))
    assert type(proc).__name__ == processor_class_name()
    assert type(proc.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    tok = AutoTokenizer.from_pretrained(str(qwen_vl_dir))
    assert tok(PROMPT)["input_ids"] == build_qwen_vl_tokenizer()(PROMPT)["input_ids"]
    for content in ("<|vision_start|><|image_pad|><|vision_end|>How many circles?",
                    [{"type": "image"}, {"type": "text", "text": "How many circles?"}]):
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        assert text == PROMPT
    two = PROMPT.replace("How", VISION_START + IMAGE_PAD + VISION_END + "How")
    images = decode_images(shapes_rows[0])
    from PIL import Image

    enc = proc(text=[two], images=[[*images, Image.new("RGB", (200, 120), "white")]], return_tensors="pt")
    grids = enc["image_grid_thw"].tolist()
    assert grids == [[1, 8, 8], [1, 8, 14]]  # 64 x 64 -> 112 x 112; 200 x 120 -> 196 x 112
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    assert (enc["input_ids"][0] == pad).sum() == 16 + 28
    assert tuple(enc["pixel_values"].shape) == (64 + 112, 3 * 2 * 14 * 14)


def test_the_data_path_encodes_a_shapes_row(qwen_vl_dir, shapes_rows):
    from transformers import AutoProcessor

    from bidirl.algo.multimodal import encode_image_prompt, image_prompt_lengths

    proc = AutoProcessor.from_pretrained(str(qwen_vl_dir))
    pad = proc.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    prompt = encode_image_prompt(proc, shapes_rows[0])
    assert prompt.rollout_ids.count(pad) == 1, "vLLM expands the one placeholder itself"
    assert prompt.input_ids.count(pad) == 16 and len(prompt.input_ids) == len(prompt.rollout_ids) + 15
    assert np.asarray(prompt.pixel_inputs["image_grid_thw"]).tolist() == [[1, 8, 8]]
    assert image_prompt_lengths(proc, shapes_rows) == [len(encode_image_prompt(proc, r).input_ids)
                                                       for r in shapes_rows]


def test_the_trainer_steps_on_its_image_samples_with_3d_positions(qwen_vl_dir, shapes_rows):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from bidirl.algo.multimodal import encode_image_prompt
    from bidirl.engines.train_batch import TrainSample, make_microbatches
    from bidirl.engines.trainer_config import TrainerConfig
    from bidirl.engines.trainer_torch import TorchTrainer
    from bidirl.engines.vision_inputs import VisionInputs

    proc = AutoProcessor.from_pretrained(str(qwen_vl_dir))
    pad = proc.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    samples = [TrainSample(encode_image_prompt(proc, r).input_ids, list(range(40, 40 + n)), [0.0] * n, adv,
                           images=r.images) for r, n, adv in zip(shapes_rows, (3, 6, 2, 5), (1.0, -1.0, 0.5, -0.5),
                                                                 strict=True)]
    trainer = TorchTrainer(qwen_vl_dir, TrainerConfig(lr=1e-3, max_grad_norm=1.0))
    got = trainer.compute_logprobs(samples)  # one right-padded batch of four lengths
    model = AutoModelForImageTextToText.from_pretrained(str(qwen_vl_dir), dtype=torch.float32).eval()
    s = samples[1]
    ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
    pixels = VisionInputs(qwen_vl_dir).pixel_inputs([s.images], "cpu")
    span, target = slice(len(s.prompt_ids) - 1, ids.shape[1] - 1), torch.tensor(s.response_ids)[:, None]
    with torch.no_grad():
        own = model(input_ids=ids, mm_token_type_ids=(ids == pad).int(), **pixels).logits[0]
        plain = model(input_ids=ids, **pixels).logits[0]
    expect = torch.log_softmax(own[span], -1).gather(-1, target)[:, 0].numpy()
    without = torch.log_softmax(plain[span], -1).gather(-1, target)[:, 0].numpy()
    np.testing.assert_allclose(got[1], expect, atol=1e-5)
    assert np.abs(got[1] - without).max() > 1e-4, "3-D positions, not plain ones"

    samples = [TrainSample(x.prompt_ids, x.response_ids, list(lp), x.advantage, images=x.images)
               for x, lp in zip(samples, got, strict=True)]
    before = {n: p.detach().clone() for n, p in trainer.weights.items()}
    metrics = trainer.train_step(make_microbatches(samples, 2))
    assert np.isfinite(metrics["loss"])
    moved = {n for n, p in trainer.weights.items() if not torch.equal(p, before[n])}
    assert any(n.startswith("model.visual.") for n in moved) and "lm_head.weight" in moved


def test_model_check_refuses_it_on_a_cpu_in_one_line(qwen_vl_dir):
    import importlib.util

    from bidirl.runtime.config import ConfigError
    from bidirl.runtime.model_check import check_model_dir

    pytest.importorskip("vllm")
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    with pytest.raises(ConfigError) as info:
        check_model_dir(qwen_vl_dir, device="cpu")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("model.path: architecture Qwen2_5_VLForConditionalGeneration"), msg
    assert "torchvision" in msg and "cluster.device=cuda" in msg
    check_model_dir(qwen_vl_dir, device="cuda")


def test_build_is_idempotent_and_checks_the_shape(tmp_path):
    d = build_tiny_qwen_vl_model(tmp_path / "qvl", layers=1, vision_depth=1)
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_qwen_vl_model(tmp_path / "qvl", layers=1, vision_depth=1) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="multiple of 16"):
        build_tiny_qwen_vl_model(tmp_path / "bad", hidden=96)  # 4 heads of 24


def test_the_3b_shape_has_qwen2_5_vl_3b_parameters():
    from transformers import Qwen2_5_VLForConditionalGeneration

    shape = {k: v for k, v in QWEN2_5_VL_3B.items() if k not in ("min_pixels", "max_pixels")}
    config = qwen_vl_config(build_qwen_vl_tokenizer(), **shape)
    assert config.vision_config.fullatt_block_indexes == [7, 15, 23, 31]
    assert config.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == 3_754_622_976
