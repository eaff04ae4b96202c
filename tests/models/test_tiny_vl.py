"""The tiny SmolVLM-shaped (Idefics3) directory (``models/tiny_vl.py``): what a downloaded
SmolVLM holds, loaded by transformers with the PIL image processor (no torchvision), the
image token expanded by the processor, and a forward whose logits depend on the image."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from bidirl.models.tiny_vl import IMAGE_TOKEN, build_tiny_vl_model, build_vl_tokenizer, tokens_per_image  # noqa: E402

PROMPT = "<|bos|><|user|><image>how many circles?<|assistant|>"


def _picture(colour: str = "red") -> Image.Image:
    img = Image.new("RGB", (80, 50), "white")
    ImageDraw.Draw(img).ellipse((10, 10, 30, 30), fill=colour)
    return img


def test_directory_holds_what_a_downloaded_smolvlm_holds(tiny_vl_dir):
    names = {p.name for p in tiny_vl_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "processor_config.json", "chat_template.jinja"} <= names
    config = json.loads((tiny_vl_dir / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["text_config"]["model_type"] == "llama" and config["text_config"]["head_dim"] == 32
    assert sum(p.stat().st_size for p in tiny_vl_dir.iterdir()) < 5e6, "a few MB: CPU-sized"


def test_processor_loads_with_pil_and_expands_the_image_token(tiny_vl_dir):
    from transformers import AutoProcessor, AutoTokenizer

    proc = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    assert type(proc).__name__ == "Idefics3Processor"
    assert type(proc.image_processor).__name__ == "Idefics3ImageProcessorPil"
    tok = AutoTokenizer.from_pretrained(str(tiny_vl_dir))
    assert tok(PROMPT)["input_ids"] == build_vl_tokenizer()(PROMPT)["input_ids"]
    for content in ("<image>how many circles?", [{"type": "image"}, {"type": "text", "text": "how many circles?"}]):
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        assert text == PROMPT
    enc = proc(text=[PROMPT], images=[[_picture()]])
    ids = list(enc["input_ids"][0])
    plain = len(tok(PROMPT, add_special_tokens=False)["input_ids"])
    assert len(ids) == plain - 1 + tokens_per_image() == 39
    assert ids.count(tok.convert_tokens_to_ids(IMAGE_TOKEN)) == 16
    assert tuple(enc["pixel_values"].shape) == (1, 1, 3, 64, 64)


def test_forward_with_an_image_depends_on_the_image(tiny_vl_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proc = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_dir), dtype=torch.float32).eval()
    logits = []
    for colour in ("red", "blue"):
        enc = proc(text=[PROMPT], images=[[_picture(colour)]], return_tensors="pt")
        with torch.no_grad():
            logits.append(model(**enc).logits[0, -1])
    assert logits[0].shape == (320,) and torch.isfinite(logits[0]).all()
    assert not torch.equal(logits[0], logits[1]), "the vision tower reaches the text model"


def test_build_is_idempotent_and_checks_the_shape(tmp_path):
    d = build_tiny_vl_model(tmp_path / "vl", vision_layers=1)
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_vl_model(tmp_path / "vl", vision_layers=1) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="image_size"):
        build_tiny_vl_model(tmp_path / "bad", image_size=60)
