"""The visual task's warm start (``models/warm_start_vl.py``): its examples carry the ground truth
and every answer of their question (its targets are the truth with probability
``truth_fraction``, else a random answer), and no constant answer scores 0.2."""

from __future__ import annotations

import pytest
from transformers import AutoProcessor

from bidirl.algo.tasks import get_task
from bidirl.algo.tasks_visual import ANSWERS, QUESTIONS, SHAPES, best_constant_answer
from bidirl.models.warm_start_vl import WARM_START_STEPS, vl_sft_examples, warm_start_vl


def test_each_example_carries_its_truth_and_every_answer_of_its_question(tiny_vl_dir):
    processor = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    tok = processor.tokenizer
    rows = SHAPES.rows(16, seed=0, split="sft")
    for row, (_, truth, answers, imgs) in zip(rows, vl_sft_examples(processor, "shapes", 16, 0), strict=True):
        kind = row["extra_info"]["question"]
        assert imgs == tuple(img["bytes"] for img in row["images"])
        assert tok.decode(truth[:-1]) == f"\\boxed{{{row['reward_model']['ground_truth']}}}"
        assert [tok.decode(x[:-1]) for x in answers] == [f"\\boxed{{{a}}}" for a in ANSWERS[kind]]
        assert truth[-1] == tok.eos_token_id and all(x[-1] == tok.eos_token_id for x in answers)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_a_truth_fraction_outside_0_1_is_refused_before_any_work(tmp_path, fraction):
    with pytest.raises(ValueError, match="truth_fraction"):
        warm_start_vl(tmp_path / "nowhere", tmp_path / "out", truth_fraction=fraction)
    assert not (tmp_path / "out").exists()


def test_the_answers_are_the_ground_truths_and_no_constant_scores_0_2():
    rows = SHAPES.rows(2000, split="test")
    for kind in QUESTIONS:
        assert {r["reward_model"]["ground_truth"] for r in rows if r["extra_info"]["question"] == kind} \
            == set(ANSWERS[kind])
    assert best_constant_answer(rows)[1] < 0.2
    assert get_task("shapes").warm_start_steps == WARM_START_STEPS
