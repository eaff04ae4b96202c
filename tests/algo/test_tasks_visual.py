"""The built-in visual task ``shapes`` (``algo/tasks_visual.py``): deterministic rows in veRL's
multimodal layout whose text tells nothing (two fixed questions), a ``\\boxed{}`` score, train
and test draws that differ, and no constant answer scoring 0.2 or more."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from bidirl.algo import tasks
from bidirl.algo.multimodal import ImagePromptRow, validate_image_row
from bidirl.algo.tasks_visual import COLOURS, QUESTIONS, SHAPES, best_constant_answer, boxed_score, last_boxed
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.prepare import prepare_data, prepare_val_rows


def test_rows_are_deterministic_and_splits_differ():
    a, b = SHAPES.rows(50, seed=3), SHAPES.rows(50, seed=3)
    assert a == b, "PNG bytes included"
    test = SHAPES.rows(50, seed=3, split="test")
    assert [r["images"] for r in test] != [r["images"] for r in a]
    assert SHAPES.rows(50, seed=4) != a


def test_rows_load_as_image_rows_and_their_text_tells_nothing():
    rows = SHAPES.rows(400)
    loaded = [validate_image_row(r, "<task shapes>", i) for i, r in enumerate(rows)]
    assert all(isinstance(r, ImagePromptRow) and r.sizes == ((64, 64),) for r in loaded)
    assert {r["prompt"][0]["content"] for r in rows} == {f"<image>{q}" for q in QUESTIONS.values()}
    kinds = {r["extra_info"]["question"] for r in rows}
    assert kinds == {"count", "colour"}
    counts = {r["reward_model"]["ground_truth"] for r in rows if r["extra_info"]["question"] == "count"}
    colours = {r["reward_model"]["ground_truth"] for r in rows if r["extra_info"]["question"] == "colour"}
    assert counts == {"1", "2", "3", "4", "5", "6"} and colours == set(COLOURS)


def test_the_answer_colour_is_in_the_picture():
    for r in SHAPES.rows(100):
        if r["extra_info"]["question"] != "colour":
            continue
        img = Image.open(io.BytesIO(r["images"][0]["bytes"])).convert("RGB")
        pixels = {colour: n for n, colour in img.getcolors(64 * 64)}
        assert pixels[COLOURS[r["reward_model"]["ground_truth"]]] >= 16 * 16 // 2, "the largest is at least 16 wide"


@pytest.mark.parametrize("split", ["train", "test"])
def test_no_constant_answer_scores_0_2(split):
    rows = SHAPES.rows(2000, split=split)
    answer, score = best_constant_answer(rows)
    assert score < 0.2
    assert abs(sum(tasks.compute_score("shapes", answer, r["reward_model"]["ground_truth"]) for r in rows)
               / len(rows) - score) < 1e-12, "the exact optimum under the task's own score"


def test_boxed_score():
    assert boxed_score("so \\boxed{3}", "3") == 1.0
    assert boxed_score("\\boxed{ Red }", "red") == 1.0
    assert boxed_score("\\boxed{2} no, \\boxed{3}", "3") == 1.0, "the last box counts"
    assert boxed_score("\\boxed{3}", "4") == 0.0 and boxed_score("3", "3") == 0.0 and boxed_score("", "3") == 0.0
    assert boxed_score("\\boxed{3", "3") == 0.0 and last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert tasks.compute_score("shapes", "\\boxed{blue}", "blue", {}) == 1.0
    assert "shapes" in tasks.task_names()


def test_data_task_selects_it_and_its_images_reach_the_checks():
    with pytest.raises(ConfigError, match=r"4096 of 4096 rows hold images \(the first: <task shapes> row 0\), "
                                          "and model.kind=text .* set model.kind=vl"):
        prepare_data(load_config(None, ["data.task=shapes"]))
    cfg = load_config(None, ["data.task=shapes", "model.kind=vl"])
    rows, _ = prepare_data(cfg)
    assert len(rows) == 4096 and all(isinstance(r, ImagePromptRow) for r in rows)
    val = prepare_val_rows(cfg)
    assert len(val) == 64 and all(isinstance(r, ImagePromptRow) for r in val)


def test_the_visual_task_keeps_the_warm_start_count_of_a_task():
    """``model.warm_start_steps`` null means the task's own count: the visual task's is a
    number (its picture drawer is a field of its own, not the count's slot)."""
    from bidirl.algo.tasks import get_task

    task = get_task("shapes")
    assert isinstance(task.warm_start_steps, int) and task.warm_start_steps == 85
    assert callable(task.example)
