"""The visual task's warm start teaches the format, not the picture (``models/warm_start_vl.py``):
its targets are answers drawn from the row's question's answers, not the ground truth, so what
the run's validation gains above a constant answer per question is RL's."""

from __future__ import annotations

import pytest
from transformers import AutoProcessor

from bidirl.algo.tasks import get_task
from bidirl.algo.tasks_visual import ANSWERS, QUESTIONS, SHAPES, best_constant_answer
from bidirl.models.warm_start_vl import WARM_START_STEPS, vl_sft_examples


def test_random_targets_are_every_answer_of_the_question(tiny_vl_dir):
    processor = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    tok = processor.tokenizer
    rows = SHAPES.rows(16, seed=0, split="sft")
    truth = vl_sft_examples(processor, "shapes", 16, 0, answers="truth")
    rand = vl_sft_examples(processor, "shapes", 16, 0, answers="random")
    for row, (p, t, imgs), (p2, targets, imgs2) in zip(rows, truth, rand, strict=True):
        assert p == p2 and imgs == imgs2 and len(t) == 1
        kind = row["extra_info"]["question"]
        texts = [tok.decode(x[:-1]) for x in targets]
        assert texts == [f"\\boxed{{{a}}}" for a in ANSWERS[kind]] and all(x[-1] == tok.eos_token_id for x in targets)
        assert tok.decode(t[0][:-1]) == f"\\boxed{{{row['reward_model']['ground_truth']}}}"
    with pytest.raises(ValueError, match="answers"):
        vl_sft_examples(processor, "shapes", 1, 0, answers="some")


def test_the_answers_are_the_ground_truths_and_no_constant_scores_0_2():
    rows = SHAPES.rows(2000, split="test")
    for kind in QUESTIONS:
        assert {r["reward_model"]["ground_truth"] for r in rows if r["extra_info"]["question"] == kind} \
            == set(ANSWERS[kind])
    assert best_constant_answer(rows)[1] < 0.2
    assert get_task("shapes").warm_start_steps == WARM_START_STEPS
