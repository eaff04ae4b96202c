"""Dataset loading (parquet/JSONL), row-level error messages, reward hooks, the prompt cursor."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bidirl.algo.data import DataError, PromptCursor, load_dataset, load_reward_fn, save_dataset
from bidirl.algo.tasks import get_task


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_task_rows(tmp_path, suffix):
    rows = get_task("copy").rows(5, seed=0)
    data = load_dataset(save_dataset(rows, tmp_path / f"d{suffix}"))
    assert len(data) == 5
    assert data[2].messages == tuple(rows[2]["prompt"])
    assert data[2].ground_truth == rows[2]["reward_model"]["ground_truth"]
    assert data[2].data_source == "copy" and data[2].index == 2
    assert data[2].extra_info["index"] == 2


def test_string_prompt_and_missing_extra_info(tmp_path):
    row = {"prompt": "add 1+2", "data_source": "add", "reward_model": {"ground_truth": "3"}}
    (item,) = load_dataset(_write_jsonl(tmp_path / "d.jsonl", [row]))
    assert item.messages == ({"role": "user", "content": "add 1+2"},)
    assert item.extra_info == {}


GOOD = {"prompt": "copy 1", "data_source": "copy", "reward_model": {"ground_truth": "1"}}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"data_source": "copy", "reward_model": {"ground_truth": "1"}}, "'prompt'"),
        ({**GOOD, "prompt": []}, "'prompt'"),
        ({**GOOD, "prompt": [{"role": "robot", "content": "x"}]}, "'prompt[0].role'"),
        ({**GOOD, "prompt": [{"role": "user", "content": 5}]}, "'prompt[0].content'"),
        ({**GOOD, "data_source": ""}, "'data_source'"),
        ({**GOOD, "reward_model": {"answer": "1"}}, "'reward_model.ground_truth'"),
        ({**GOOD, "extra_info": [1]}, "'extra_info'"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, bad, field):
    path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, bad])
    with pytest.raises(DataError) as err:
        load_dataset(path)
    msg = str(err.value)
    assert str(path) in msg and "line 3:" in msg and field in msg and "allowed" in msg  # lines count from 1
    assert isinstance(err.value, ValueError)


def test_bad_parquet_row_is_named(tmp_path):
    rows = [GOOD, {**GOOD, "data_source": None}]
    path = save_dataset(rows, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"row 1: field 'data_source'"):
        load_dataset(path)


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_dataset(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="allowed: .parquet"):
        load_dataset(tmp_path / "d.csv")
    (tmp_path / "broken.jsonl").write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(DataError, match="line 2: .*not valid JSON"):
        load_dataset(tmp_path / "broken.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_dataset(tmp_path / "empty.jsonl")


def test_reward_hook_loading(tmp_path):
    hook = tmp_path / "my_reward.py"
    hook.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == ground_truth)\n"
        "def other(*a):\n    return 0.5\n"
    )
    fn = load_reward_fn(hook)
    assert fn("x", " 7 ", "7", None) == 1.0
    assert load_reward_fn(hook, name="other")() == 0.5
    with pytest.raises(DataError, match="no function named 'nope'.*compute_score"):
        load_reward_fn(hook, name="nope")
    with pytest.raises(DataError, match="not found"):
        load_reward_fn(tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(DataError, match="ModuleNotFoundError"):
        load_reward_fn(broken)


def test_cursor_is_deterministic_and_covers_each_epoch():
    data = list(range(7))
    a, b = PromptCursor(data, seed=5), PromptCursor(data, seed=5)
    items = a.take(21)
    assert [i.index for i in items] == [i.index for i in b.take(21)]
    for epoch in range(3):
        assert sorted(i.row for i in items[7 * epoch : 7 * epoch + 7]) == data
    assert [i.index for i in items[:7]] != [i.index for i in items[7:14]]  # reshuffled
    assert len({i.uid for i in items}) == 21
    assert [i.index for i in PromptCursor(data, shuffle=False).take(3)] == [0, 1, 2]


@given(st.integers(1, 30), st.integers(0, 60), st.integers(0, 40), st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_cursor_resume_equals_uninterrupted(n, first, second, seed):
    data = list(range(n))
    straight = PromptCursor(data, seed=seed)
    expected = [(i.epoch, i.position, i.index) for i in straight.take(first + second)]
    c = PromptCursor(data, seed=seed)
    got = [(i.epoch, i.position, i.index) for i in c.take(first)]
    state = json.loads(json.dumps(c.state_dict()))  # plain, JSON-serialisable
    resumed = PromptCursor(data, seed=0)
    resumed.load_state_dict(state)
    got += [(i.epoch, i.position, i.index) for i in resumed.take(second)]
    assert got == expected


def test_cursor_refuses_other_dataset():
    state = PromptCursor([1, 2, 3]).state_dict()
    with pytest.raises(DataError, match="3 prompts"):
        PromptCursor([1, 2]).load_state_dict(state)
