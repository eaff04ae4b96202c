"""Rewards are checked where they enter: a bad one is a one-line error naming where, or a counted 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bidirl.algo.grpo import group_advantages_lists
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.messages import ResponseResult
from bidirl.runtime.reward_call import BadRewardError, RewardFn

NAN, INF = float("nan"), float("inf")


def _store(n: int = 3, on_bad_reward: str = "error") -> GroupStore:
    store = GroupStore(n=n, max_new_tokens=4, temperature=1.0, seed=0, on_bad_reward=on_bad_reward)
    store.add(7, "e0p7", [1, 2], "add", "5")
    for i in range(n):
        store.absorb_finished([ResponseResult(7, i, [1, 2], [10 + i], [-0.5], [0], True, "stop", 4, 1.0, i)])
    return store


def _decode(ids: list[int]) -> str:
    return f"answer {ids[0]}"


def _reward(bad_value):
    """Response 1 gets ``bad_value`` (or raises it); the others score 1.0 / 0.0."""

    def fn(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "answer 11":
            if isinstance(bad_value, BaseException):
                raise bad_value
            return bad_value
        return 1.0 if solution_str == "answer 10" else 0.0

    return fn


BAD = [(NAN, "nan"), (INF, "inf"), (-INF, "-inf"), (None, "None"), ("0.5", "'0.5'"), (object(), "object"),
       ([1.0], "[1.0]"), ({"acc": 1.0}, "without a 'score'"), ({"score": NAN}, "nan"), ({"score": "1"}, "'1'"),
       (1e39, "float32"), (np.array([1.0]), "ndarray"),
       (KeyError("ground_truth"), "raised KeyError"), (ZeroDivisionError("division\nby zero"), "ZeroDivisionError")]


@pytest.mark.parametrize(("value", "shown"), BAD, ids=[s for _, s in BAD])
def test_bad_reward_is_an_error_naming_row_response_and_value(value, shown):
    store = _store()
    with pytest.raises(BadRewardError) as info:
        store.score(7, _reward(value), _decode)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("group 7", "prompt uid e0p7", "data_source 'add'", "response 1", "'answer 11'", shown,
                 "data.on_bad_reward=zero"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize(("value", "shown"), BAD, ids=[s for _, s in BAD])
def test_bad_reward_scores_zero_and_is_counted(value, shown, capsys):
    store = _store(on_bad_reward="zero")
    rewards = store.score(7, _reward(value), _decode)
    assert rewards == [1.0, 0.0, 0.0] and all(type(r) is float for r in rewards)
    assert store.bad_count([7]) == 1 and shown in store.groups[7].bad[1]
    assert all(math.isfinite(a) for a in group_advantages_lists([rewards])[0])
    assert store.score(7, _reward(value), _decode) == rewards and store.bad_count([7]) == 1  # cached
    assert "bad" not in store.state_dict()["groups"][0]
    assert "response 1" in capsys.readouterr().err  # warned once


def test_reward_fn_carries_the_choice_and_an_explicit_one_wins():
    zero = RewardFn(_reward(NAN), on_bad_reward="zero", name="my_score")
    assert _store().score(7, zero, _decode) == [1.0, 0.0, 0.0]
    with pytest.raises(BadRewardError, match="my_score returned nan"):
        _store().score(7, zero, _decode, on_bad_reward="error")
    with pytest.raises(ValueError, match="on_bad_reward"):
        GroupStore(2, 4, 1.0, 0, on_bad_reward="ignore")


@pytest.mark.parametrize(("value", "expected"), [(True, 1.0), (False, 0.0), (1, 1.0), (0.25, 0.25),
                                                 (np.float32(0.5), 0.5), (np.int64(1), 1.0),
                                                 (np.bool_(True), 1.0), (np.array(0.75), 0.75),
                                                 ({"score": 1, "acc": True}, 1.0), ({"score": False}, 0.0)])
def test_numbers_bools_and_score_dicts_are_rewards(value, expected):
    rewards = _store().score(7, _reward(value), _decode)
    assert rewards == [1.0, expected, 0.0] and all(type(r) is float for r in rewards)


def test_advantages_refuse_non_finite_rewards():
    with pytest.raises(ValueError, match="non-finite reward"):
        group_advantages_lists([[1.0, NAN, 0.0]])


def _reward_file(tmp_path, body: str):
    p = tmp_path / "reward.py"
    p.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" + body)
    return p


@pytest.mark.parametrize(("body", "shown"), [("    return float('nan')\n", "returned nan"),
                                             ("    return None\n", "returned None"),
                                             ("    return solution_str[5]\n", "raised IndexError")])
def test_prepare_data_tries_the_reward_before_any_worker(tmp_path, body, shown, capsys):
    from bidirl.runtime.config import load_config
    from bidirl.runtime.prepare import prepare_data

    path = _reward_file(tmp_path, body)
    with pytest.raises(BadRewardError) as info:
        prepare_data(load_config(None, [f"data.reward_fn={path}"]))
    msg = str(info.value)
    assert "\n" not in msg and shown in msg and "data row" in msg and "before any worker" in msg
    rows, fn = prepare_data(load_config(None, [f"data.reward_fn={path}", "data.on_bad_reward=zero"]))
    assert rows and fn.on_bad_reward == "zero" and "warning" in capsys.readouterr().err


def test_prepare_data_accepts_the_builtin_and_a_good_file(tmp_path):
    from bidirl.runtime.config import ConfigError, load_config
    from bidirl.runtime.prepare import prepare_data

    rows, fn = prepare_data(load_config())
    assert fn.on_bad_reward == "error" and fn(rows[0].data_source, "", rows[0].ground_truth, {}) == 0.0
    path = _reward_file(tmp_path, "    return {'score': len(solution_str) > 0}\n")
    _, fn = prepare_data(load_config(None, [f"data.reward_fn={path}"]))
    assert fn.on_bad_reward == "error"
    with pytest.raises(ConfigError, match="data.on_bad_reward"):
        load_config(None, ["data.on_bad_reward=ignore"])


def test_cli_reports_a_bad_reward_file_in_one_line(tmp_path, capsys):
    from bidirl.cli import main

    path = _reward_file(tmp_path, "    raise RuntimeError('no parser for ' + repr(ground_truth))\n")
    assert main(["train", "--run-dir", str(tmp_path / "run"), f"data.reward_fn={path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bidirl train: error: data.reward_fn: reward.py:compute_score raised RuntimeError: "
                          "no parser")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_unwraps_a_worker_error_to_its_one_line_message(capsys, monkeypatch):
    """``trainer.on_nonfinite=stop`` raises in a device worker; Ray hands it over wrapped."""
    exceptions = pytest.importorskip("ray.exceptions")
    from bidirl import cli
    from bidirl.engines.trainer_config import NonFiniteStepError

    try:
        raise NonFiniteStepError("step 4: non-finite loss nan, grad norm nan; stopped")
    except NonFiniteStepError as e:
        wrapped = exceptions.RayTaskError("apply_refs", "Traceback (most recent call last):\n  ...\n", e)
        wrapped = wrapped.as_instanceof_cause()

    def boom(args):
        raise wrapped

    monkeypatch.setattr("bidirl.runtime.train.main", boom)
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err
    assert err == "bidirl train: error: step 4: non-finite loss nan, grad norm nan; stopped\n"


def test_an_int_beyond_any_float_is_described_not_crashed_on():
    from bidirl.runtime.reward_call import describe_bad_reward, reward_value

    assert reward_value(10**400) is None
    assert "not a finite number" in describe_bad_reward(10**400)


def test_a_dict_reward_keeps_its_extra_numbers():
    from bidirl.runtime.reward_call import reward_extras

    assert reward_extras({"score": 1.0, "acc": True, "pred": "7", "len": 3, "bad": float("nan")}) == {
        "acc": 1.0, "len": 3.0}
    assert reward_extras(0.5) == {}
    store = GroupStore(2, 4, 1.0, 0)
    store.add(0, "u0", [1], "src", "7")
    store.add(1, "u1", [1], "src", "7")
    for g in (0, 1):
        store.absorb_finished([ResponseResult(g, i, [1], [5 + i], [0.0], [0], True, "stop", 4, 1.0, 0)
                               for i in range(2)])

    def fn(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 0.5, "acc": solution_str == "a"} if solution_str != "b" else 0.25

    decode = {5: "a", 6: "b"}
    rewards = [store.score(g, RewardFn(fn), lambda ids: decode[ids[0]]) for g in (0, 1)]
    assert rewards == [[0.5, 0.25], [0.5, 0.25]]
    assert store.extra_means([0, 1]) == {"acc": 1.0}  # only the dict rewards carry it
    assert "extras" not in store.state_dict()["groups"][0]
