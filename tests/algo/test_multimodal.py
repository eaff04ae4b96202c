"""Image rows in veRL's multimodal layout (``algo/multimodal.py``): every form of image loads
from parquet and JSON lines, a text file is unchanged, and every bad image input is one line
naming the file, the row and the image, before any worker (``prepare.prepare_data``): an
image that cannot be decoded, a count of ``<image>`` placeholders other than the images', an
image over ``data.max_image_pixels`` (or its row dropped and counted).  The tiny Idefics3
processor builds the inputs and counts the image tokens that ``data.max_prompt_length`` limits."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from bidirl.algo.data import DataError, PromptRow, save_dataset
from bidirl.algo.multimodal import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImagePromptRow,
    OversizedImage,
    content_parts,
    load_prompt_rows,
    validate_image_row,
)
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.prepare import prepare_data, prepare_val_rows


def png(width: int = 32, height: int = 24, colour: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, format="PNG")
    return buf.getvalue()


def row(prompt: str = "<image>How many circles?", images=None, **extra) -> dict:
    out = {"prompt": [{"role": "user", "content": prompt}], "data_source": "copy",
           "reward_model": {"ground_truth": "2"}, "extra_info": {"index": 0}}
    if images is not None:
        out["images"] = images
    return {**out, **extra}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_line_error(fn, *match: str) -> str:
    with pytest.raises(DataError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for m in match:
        assert m in msg, msg
    return msg


def test_every_image_form_loads_from_parquet_and_jsonl(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(png(20, 10))
    a = (tmp_path / "pics" / "a.png").read_bytes()
    rows = [row(images=[{"bytes": png(), "path": None}]),  # what Hugging Face datasets writes
            row(images=[{"path": "pics/a.png"}]),  # relative to the data file
            row(images=[{"image": f"file://{tmp_path / 'pics' / 'a.png'}"}]),
            row("<image> and <image>: which is larger?", images=[{"bytes": png()}, {"path": "pics/a.png"}]),
            row("no picture here", images=[])]
    loaded = load_prompt_rows(save_dataset(rows, tmp_path / "d.parquet")).rows
    assert [type(r) for r in loaded] == [ImagePromptRow] * 4 + [PromptRow]
    assert loaded[0].images == (png(),) and loaded[0].sizes == ((32, 24),)
    assert loaded[1].images == loaded[2].images == (a,)
    assert loaded[3].sizes == ((32, 24), (20, 10)) and loaded[1].label == "row 1"
    paths = load_prompt_rows(save_dataset([row(images=["pics/a.png"])], tmp_path / "p.parquet")).rows
    assert paths[0].images == (a,), "a plain path string"
    as_text = [dict(r, images=[{"bytes": base64.b64encode(png()).decode()}]) if i == 0 else r
               for i, r in enumerate(rows)]
    as_text[3] = dict(rows[3], images=[{"bytes": base64.b64encode(png()).decode()}, "pics/a.png"])
    from_jsonl = load_prompt_rows(write_jsonl(tmp_path / "d.jsonl", as_text)).rows
    assert from_jsonl[0].images == (png(),) and from_jsonl[0].label == "line 1"
    assert from_jsonl[3].images == (png(), a)
    assert [r.messages for r in from_jsonl] == [r.messages for r in loaded]


def test_a_text_file_loads_as_before(tmp_path):
    loaded = load_prompt_rows(save_dataset([row("copy 12"), row("copy 3")], tmp_path / "t.parquet"))
    assert [type(r) for r in loaded.rows] == [PromptRow, PromptRow] and loaded.oversized == 0


@pytest.mark.parametrize("images,prompt,match", [
    ([{"bytes": b"not an image at all"}], "<image>?", "field 'images[0]' cannot be decoded"),
    ([{"bytes": png()[:60]}], "<image>?", "field 'images[0]' cannot be decoded"),  # truncated stream
    ([{"path": "missing.png"}], "<image>?", "which cannot be read"),
    ([{"path": None}], "<image>?", "has neither 'bytes' nor 'path'"),
    ([{"bytes": png()}], "<image><image>?", "holds 1 image(s) but the prompt has 2 <image> placeholder(s)"),
    ([{"bytes": png()}], "what is it?", "holds 1 image(s) but the prompt has 0 <image>"),
    (None, "<image> what is it?", "holds 0 image(s) but the prompt has 1"),
    ("a.png", "<image>?", "field 'images' is str"),
])
def test_each_bad_image_input_is_one_line_naming_file_and_row(tmp_path, images, prompt, match):
    good = row(images=[{"bytes": png()}])
    bad = row(prompt, images=images)
    if not isinstance(images, str):  # parquet cannot hold a string and a list in one column
        path = save_dataset([good, bad], tmp_path / "d.parquet")
        one_line_error(lambda: load_prompt_rows(path), f"{path}: row 1:", match)
    jsonl = write_jsonl(tmp_path / "d.jsonl", [json.loads(json.dumps(r, default=lambda b: base64.b64encode(b).decode()))
                                                for r in (good, bad)])
    one_line_error(lambda: load_prompt_rows(jsonl), f"{jsonl}: line 2:", match)


def test_base64_that_is_not_base64_is_named(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [row(images=[{"bytes": "%%% not base64"}])])
    one_line_error(lambda: load_prompt_rows(path), "line 1: field 'images[0]' 'bytes' is text that is not base64")


def test_an_image_over_the_pixel_budget_is_an_error_or_dropped_and_counted(tmp_path):
    rows = [row(images=[{"bytes": png(32, 24)}]), row(images=[{"bytes": png(100, 50)}]),
            row(images=[{"bytes": png(8, 8)}])]
    path = save_dataset(rows, tmp_path / "d.parquet")
    msg = one_line_error(lambda: load_prompt_rows(path, max_pixels=1000), f"{path}: row 1: field 'images[0]' is "
                         "100x50 = 5,000 pixels, over data.max_image_pixels=1,000", "data.filter_oversized_images")
    assert "row 0" not in msg
    loaded = load_prompt_rows(path, max_pixels=1000, drop_oversized=True)
    assert loaded.oversized == 1 and [r.index for r in loaded.rows] == [0, 2]
    one_line_error(lambda: load_prompt_rows(path, max_pixels=10, drop_oversized=True), "all 3 rows hold an image")
    assert load_config(None, []).data.max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path):
    buf = io.BytesIO()
    Image.new("1", (20000, 10000)).save(buf, format="PNG")  # 200 M pixels, a few kB
    with pytest.raises(OversizedImage, match=r"images\[0\]. is larger than PIL decodes safely"):
        validate_image_row(row(images=[{"bytes": buf.getvalue()}]), "bomb.jsonl", 0)


def test_prepare_checks_images_before_anything_and_refuses_them_for_a_text_model(tmp_path, capsys, tiny_model_dir):
    good = save_dataset([row(images=[{"bytes": png()}]), row("copy 12")], tmp_path / "good.parquet")
    bad = save_dataset([row(images=[{"bytes": b"junk"}])], tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="bad.parquet: row 0: field 'images\\[0\\]' cannot be decoded"):
        prepare_data(load_config(None, [f"data.files={bad}", "model.kind=vl"]))
    with pytest.raises(ConfigError, match=r"data: 1 of 2 rows hold images \(the first: .*good.parquet row 0\), "
                                          "and model.kind=text builds a text-only model; set model.kind=vl"):
        prepare_data(load_config(None, [f"data.files={good}"]))
    with pytest.raises(ConfigError, match=f"but model.path={tiny_model_dir} is a text-only model"):
        prepare_data(load_config(None, [f"data.files={good}", f"model.path={tiny_model_dir}"]))
    rows, _ = prepare_data(load_config(None, [f"data.files={good}", "model.kind=vl"]))
    assert len(rows) == 2
    big = save_dataset([row(images=[{"bytes": png(100, 100)}]), row("copy 3")], tmp_path / "big.parquet")
    cfg = load_config(None, [f"data.files={big}", f"data.val_files={big}", "data.max_image_pixels=5000",
                             "data.filter_oversized_images=true", "model.kind=vl"])
    rows, _ = prepare_data(cfg)  # the image row dropped: a text row is left
    assert [r.messages[0]["content"] for r in rows] == ["copy 3"]
    assert "1 rows with an image over data.max_image_pixels=5,000 dropped" in capsys.readouterr().err
    assert len(prepare_val_rows(cfg)) == 1


def test_content_parts_split_at_each_placeholder():
    parts = content_parts(({"role": "user", "content": "<image>A<image> B"},))
    assert parts == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "A"},
                                                  {"type": "image"}, {"type": "text", "text": " B"}]}]


def test_a_bad_image_stops_bidirl_train_in_one_line_before_any_worker(tmp_path):
    import subprocess
    import sys

    bad = save_dataset([row(images=[{"bytes": png()}]), row("<image><image>two?", images=[{"bytes": png()}])],
                       tmp_path / "bad.parquet")
    script = ("import sys\nfrom bidirl.cli import main\n"
              f"rc = main(['train', '--run-dir', {str(tmp_path / 'run')!r}, 'model.kind=vl', 'data.files={bad}'])\n"
              "print(sorted(m for m in ('ray', 'vllm') if m in sys.modules))\nsys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.parquet: row 1: field 'images' holds 1 image(s) but the prompt has 2" in lines[0]
    assert out.stdout.strip() == "[]", "no Ray, no vLLM: nothing started"
