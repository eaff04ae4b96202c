"""Built-in tasks: veRL row format, determinism, and rule-based partial-credit scores."""

from __future__ import annotations

import pytest

from bidirl.algo.tasks import Task, compute_score, get_task, mixed_rows, register_task, task_names


def test_registry_has_the_builtin_tasks():
    assert {"copy", "reverse", "add"} <= set(task_names())
    with pytest.raises(KeyError, match="registered tasks"):
        get_task("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_task(Task("copy", get_task("copy").make_pair, get_task("copy").score))


@pytest.mark.parametrize("name", ["copy", "reverse", "add"])
def test_rows_are_verl_format_and_deterministic(name):
    rows = get_task(name).rows(20, seed=3)
    assert rows == get_task(name).rows(20, seed=3)
    assert rows != get_task(name).rows(20, seed=3, split="test")
    for i, row in enumerate(rows):
        assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith(name)
        assert row["data_source"] == name
        assert row["extra_info"]["index"] == i
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(name, truth, truth) == 1.0


def test_reverse_and_add_answers():
    row = get_task("reverse").rows(1, seed=0)[0]
    digits = row["prompt"][0]["content"].split()[1]
    assert row["reward_model"]["ground_truth"] == digits[::-1]
    for row in get_task("add").rows(10, seed=0):
        a, b = row["prompt"][0]["content"].split()[1].split("+")
        assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))


def test_sequence_partial_credit():
    assert compute_score("copy", "1234", "1234") == 1.0
    assert compute_score("copy", "1235", "1234") == 0.75
    assert compute_score("copy", "12", "1234") == 0.5  # truncated
    assert compute_score("copy", "123456", "1234") == pytest.approx(4 / 6)  # too long
    assert compute_score("copy", "", "1234") == 0.0
    # only the first line counts; decoded special tokens are ignored
    assert compute_score("copy", " 1234\nblah", "1234") == 1.0
    assert compute_score("copy", "1234<|eos|>99", "1234") == 1.0


def test_number_partial_credit():
    assert compute_score("add", "12", "12") == 1.0
    assert compute_score("add", "11", "12") == pytest.approx(0.45)
    assert compute_score("add", "2", "12") == 0.0
    assert compute_score("add", "x", "12") == 0.0


def test_mixed_rows_round_robin():
    rows = mixed_rows(["copy", "add"], 6, seed=1)
    assert [r["data_source"] for r in rows] == ["copy", "add"] * 3
    assert [r["extra_info"]["index"] for r in rows] == list(range(6))
