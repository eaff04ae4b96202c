"""The model's processor builds an image row's input (``algo/multimodal.py``): expanded ids
and pixels for the trainer, one placeholder token per image for vLLM, and the image tokens
counted in the prompt length that ``data.max_prompt_length`` limits (``prepare.fit_prompts``
given the processor).  On the tiny Idefics3 directory; no vLLM."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from bidirl.algo.data import DataError, save_dataset  # noqa: E402
from bidirl.algo.multimodal import encode_image_prompt, image_prompt_lengths, load_prompt_rows  # noqa: E402
from bidirl.models.tiny_vl import IMAGE_TOKEN, tokens_per_image  # noqa: E402
from bidirl.runtime.config import load_config  # noqa: E402
from bidirl.runtime.prepare import fit_prompts  # noqa: E402


def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "blue").save(buf, format="PNG")
    return buf.getvalue()


def _rows(tmp_path):
    raw = [{"prompt": [{"role": "user", "content": "<image>How many circles?"}], "images": [{"bytes": png(64, 64)}]},
           {"prompt": [{"role": "user", "content": "<image> or <image>?"}],
            "images": [{"bytes": png(200, 40)}, {"bytes": png(10, 90)}]},
           {"prompt": [{"role": "user", "content": "copy 12"}], "images": []}]
    raw = [{**r, "data_source": "copy", "reward_model": {"ground_truth": "1"}} for r in raw]
    path = save_dataset(raw, tmp_path / "d.parquet")
    return path, load_prompt_rows(path).rows


@pytest.fixture(scope="module")
def processor(tiny_vl_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(tiny_vl_dir))


def test_the_processor_builds_trainer_and_rollout_inputs(processor, tmp_path):
    _, rows = _rows(tmp_path)
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    one, two, text = (encode_image_prompt(processor, r) for r in rows)
    assert one.rollout_ids.count(image_id) == 1 and one.input_ids.count(image_id) == 16
    assert len(one.input_ids) == len(one.rollout_ids) - 1 + tokens_per_image()
    assert len(two.input_ids) == len(two.rollout_ids) + 2 * (tokens_per_image() - 1)
    assert tuple(one.pixel_inputs["pixel_values"].shape[-3:]) == (3, 64, 64)
    assert text.input_ids == text.rollout_ids and text.pixel_inputs == {}


def test_image_tokens_count_towards_max_prompt_length(processor, tmp_path):
    path, rows = _rows(tmp_path)
    lengths = image_prompt_lengths(processor, rows)
    assert lengths == [len(encode_image_prompt(processor, r).input_ids) for r in rows]
    unexpanded = len(encode_image_prompt(processor, rows[1]).rollout_ids)
    limit = lengths[1] - 1
    assert unexpanded <= limit, "the limit is only passed by counting the image tokens"
    cfg = load_config(None, [f"data.files={path}", f"data.max_prompt_length={limit}"])
    over = rf"row 1: prompt is {lengths[1]} tokens .* over data.max_prompt_length={limit}"
    with pytest.raises(DataError, match=over):
        fit_prompts(cfg, rows, processor)
    cfg = load_config(None, [f"data.files={path}", f"data.max_prompt_length={limit}",
                             "data.filter_overlong_prompts=true"])
    kept, fit = fit_prompts(cfg, rows, processor)
    assert (fit.kept, fit.filtered, fit.longest) == (2, 1, max(lengths[0], lengths[2]))
