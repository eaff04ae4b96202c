"""Qwen-VL's 3-D rotary positions in the trainer (``engines/vision_inputs.rope_index_fn``).

A tiny random Qwen2.5-VL (transformers' own class, the PIL image processor: no torchvision,
no vLLM) trains here as far as it runs without vLLM: the trainer's log-probs on a
right-padded batch of image prompts equal transformers' own forward given the modality of
each token (``mm_token_type_ids``, from which it builds the 3-D positions itself), one
sequence at a time; without 3-D positions (plain ones) they differ.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

IMAGE, START, END = 290, 292, 293


def _png(colour: str, size: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def qwen_vl_dir(tmp_path_factory):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=291,
                           vision_start_token_id=START, vision_end_token_id=END, bos_token_id=1, eos_token_id=2,
                           pad_token_id=0)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("models") / "qwen-vl"
    Qwen2_5_VLForConditionalGeneration(cfg).save_pretrained(d)
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112).save_pretrained(d)
    return d


def test_trainer_log_probs_use_qwen_vl_3d_positions(qwen_vl_dir):
    from transformers import AutoModelForImageTextToText

    from bidirl.engines.train_batch import TrainSample
    from bidirl.engines.trainer_torch import TorchTrainer
    from bidirl.engines.vision_inputs import VisionInputs

    trainer = TorchTrainer(qwen_vl_dir)
    vision = VisionInputs(qwen_vl_dir)
    samples = []
    for colour, size, response in (("red", 56, [5, 6, 7]), ("blue", 112, [8, 9, 10, 11, 12])):
        grid = vision.pixel_inputs([(_png(colour, size),)], "cpu")["image_grid_thw"]
        n = int(grid.prod()) // 4  # spatial_merge_size 2 x 2
        prompt = [1, 3, START] + [IMAGE] * n + [END, 4]
        samples.append(TrainSample(prompt, response, [0.0] * len(response), 1.0, images=(_png(colour, size),)))
    got = trainer.compute_logprobs(samples)  # one right-padded batch of two lengths
    model = AutoModelForImageTextToText.from_pretrained(str(qwen_vl_dir), dtype=torch.float32).eval()
    for s, lp in zip(samples, got, strict=True):
        ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
        pixels = vision.pixel_inputs([s.images], "cpu")
        with torch.no_grad():
            own = model(input_ids=ids, mm_token_type_ids=(ids == IMAGE).int(), **pixels).logits[0]
            plain = model(input_ids=ids, **pixels).logits[0]
        span = slice(len(s.prompt_ids) - 1, ids.shape[1] - 1)
        target = torch.tensor(s.response_ids)[:, None]
        expect = torch.log_softmax(own[span], -1).gather(-1, target)[:, 0].numpy()
        without = torch.log_softmax(plain[span], -1).gather(-1, target)[:, 0].numpy()
        np.testing.assert_allclose(lp, expect, atol=1e-5)
        assert np.abs(lp - without).max() > 1e-4, "plain positions would be another model"
