"""The reward call cannot stall the run or end the driver: real reward files, each a case.

A reward that sleeps past ``data.reward_timeout_s`` is abandoned and is a bad reward naming
the function, the group and the setting; one that calls ``sys.exit(3)`` or raises
``KeyboardInterrupt`` is a bad reward, never the driver's exit; one that is bad for every
response of the first step stops the run under ``data.on_bad_reward=zero`` instead of
training on zeros; a slow one is counted for the progress line.
"""

from __future__ import annotations

import threading

import pytest

from bidirl.algo.data import load_reward_fn
from bidirl.obs.progress import format_progress
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.messages import ResponseResult
from bidirl.runtime.reward_call import BadRewardError, RewardFn, RewardGuard, RewardTimeout, slow_calls

HEADER = "import signal, sys, time\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"


def _reward(tmp_path, body: str, on_bad_reward: str = "error", timeout_s: float = 30.0, name: str = "reward.py"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return RewardFn(load_reward_fn(path), on_bad_reward, f"{name}:compute_score", timeout_s)


def _store(groups=(7,), n: int = 3, on_bad_reward: str = "error") -> GroupStore:
    store = GroupStore(n=n, max_new_tokens=4, temperature=1.0, seed=0, on_bad_reward=on_bad_reward)
    for g in groups:
        store.add(g, f"e0p{g}", [1, 2], "add", "5")
        store.absorb_finished([ResponseResult(g, i, [1, 2], [10 + i], [-0.5], [0], True, "stop", 4, 1.0, i)
                               for i in range(n)])
    return store


def _decode(ids: list[int]) -> str:
    return f"answer {ids[0]}"


SLEEPS_ON_11 = "    if solution_str == 'answer 11':\n        time.sleep(3)\n    return 1.0\n"


def test_a_reward_that_sleeps_past_the_limit_is_abandoned_and_named(tmp_path):
    fn = _reward(tmp_path, SLEEPS_ON_11, timeout_s=0.2, name="slow_reward.py")
    with pytest.raises(BadRewardError) as info:
        _store().score(7, fn, _decode)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("slow_reward.py:compute_score did not return within 0.2 s", "data.reward_timeout_s=0.2",
                 "group 7", "response 1", "raise data.reward_timeout_s", "data.on_bad_reward=zero"):
        assert part in msg, (part, msg)
    assert fn.guard.stats.timed_out == 1


def test_under_zero_a_timed_out_call_scores_0_and_the_next_calls_go_on(tmp_path, capsys):
    fn = _reward(tmp_path, SLEEPS_ON_11, on_bad_reward="zero", timeout_s=0.2)
    store = _store(groups=(7, 8))
    assert store.score(7, fn, _decode) == [1.0, 0.0, 1.0]
    assert "did not return within 0.2 s" in store.groups[7].bad[1]
    stats = fn.guard.stats
    assert (stats.calls, stats.timed_out, stats.slow) == (3, 1, 1) and slow_calls(fn) == 1
    assert "scored 0" in capsys.readouterr().err


@pytest.mark.parametrize(("body", "shown"), [("    sys.exit(3)\n", "raised SystemExit: 3"),
                                             ("    raise KeyboardInterrupt('stop')\n", "raised KeyboardInterrupt"),
                                             ("    raise SystemExit\n", "raised SystemExit")])
def test_an_exit_from_the_reward_is_a_bad_reward_not_the_drivers_exit(tmp_path, body, shown):
    with pytest.raises(BadRewardError, match=f"reward.py:compute_score {shown}.*group 7"):
        _store().score(7, _reward(tmp_path, body), _decode)
    store = _store(groups=(7, 8))
    fn = _reward(tmp_path, "    if solution_str == 'answer 10':\n" + body.replace("    ", "        ") +
                 "    return 1.0\n", on_bad_reward="zero")
    assert store.score(7, fn, _decode) == [0.0, 1.0, 1.0] and store.bad_count([7]) == 1


def test_a_reward_exiting_is_one_bidirl_line_before_any_worker(tmp_path, capsys):
    from bidirl.cli import main

    path = tmp_path / "exits.py"
    path.write_text(HEADER + "    sys.exit(3)\n")
    assert main(["train", "--run-dir", str(tmp_path / "run"), f"data.reward_fn={path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bidirl train: error: data.reward_fn: exits.py:compute_score raised SystemExit: 3")
    assert len(err.splitlines()) == 1


def test_a_reward_bad_for_the_whole_first_step_stops_the_run_under_zero(tmp_path):
    fn = _reward(tmp_path, "    raise ValueError('no parser for ' + repr(ground_truth))\n", on_bad_reward="zero")
    store = _store(groups=(7, 8))
    with pytest.raises(BadRewardError) as info:
        store.score_step([7, 8], fn, _decode)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("every reward of the first training step was bad", "all 6 responses of its 2 groups",
                 "data.on_bad_reward=zero", "reward.py:compute_score raised ValueError: no parser for '5'"):
        assert part in msg, (part, msg)


def test_one_good_reward_in_the_first_step_lets_the_run_go_on(tmp_path):
    fn = _reward(tmp_path, "    if solution_str != 'answer 10':\n        raise ValueError('x')\n    return 1.0\n",
                 on_bad_reward="zero")
    store = _store(groups=(7, 8, 9))
    assert store.score_step([7], fn, _decode) == [[1.0, 0.0, 0.0]]
    store.groups[8].bad, store.groups[9].bad = {}, {}
    always_bad = _reward(tmp_path, "    raise ValueError('x')\n", on_bad_reward="zero", name="bad.py")
    assert store.score_step([8, 9], always_bad, _decode) == [[0.0] * 3] * 2  # only the first step is judged


def test_a_reward_that_needs_the_main_thread_for_its_alarm_runs_there(tmp_path, capsys):
    body = ("    old = signal.signal(signal.SIGALRM, lambda *a: None)\n"
            "    signal.signal(signal.SIGALRM, old)\n    return 1.0\n")
    fn = _reward(tmp_path, body)
    assert _store().score(7, fn, _decode) == [1.0, 1.0, 1.0]
    assert fn.guard.on_main_thread and fn.guard.stats.calls == 3
    assert "works on the main thread only" in capsys.readouterr().err


def test_a_slow_reward_is_counted_for_the_progress_line(capsys):
    guard = RewardGuard(timeout_s=5.0, name="r.py:f", slow_s=0.05)
    done = threading.Event()
    ok, value = guard.call(lambda: done.wait(0.2) or 0.5)
    assert (ok, value) == (True, 0.5) and guard.stats.slow == 1 and guard.stats.timed_out == 0
    assert "r.py:f took" in capsys.readouterr().err
    assert "slow rewards 1" in format_progress(3, 10, slow_rewards=guard.stats.slow)
    assert "slow rewards" not in format_progress(3, 10, slow_rewards=0)
    assert slow_calls(lambda *a: 1.0) == 0


def test_a_timeout_is_reported_as_one_not_raised():
    guard = RewardGuard(timeout_s=0.05, name="r.py:f")
    release = threading.Event()
    ok, raw = guard.call(release.wait)
    release.set()
    assert not ok and isinstance(raw, RewardTimeout) and "data.reward_timeout_s=0.05" in str(raw)
    assert guard.call(lambda: 2.0) == (True, 2.0)  # a fresh thread after the abandoned one
    with pytest.raises(ValueError, match="timeout_s"):
        RewardGuard(timeout_s=0)


def test_validation_names_the_timeout_too(tmp_path):
    from bidirl.algo.data import validate_row
    from bidirl.runtime.validation import ValSet, score_validation

    row = validate_row({"prompt": "q", "data_source": "add", "reward_model": {"ground_truth": "5"}}, "val.jsonl", 0)
    vs = ValSet([row], [[1, 2]], 4)
    fn = _reward(tmp_path, SLEEPS_ON_11, timeout_s=0.2)
    with pytest.raises(BadRewardError, match=r"in validation: reward.py:compute_score did not return within 0.2 s "
                                             r"\(data.reward_timeout_s=0.2"):
        score_validation(vs, {"version": 1, "responses": [[11]]}, fn, _decode)


def test_the_setting_is_a_config_field_resume_may_change():
    from bidirl.runtime.config import ConfigError, load_config, resume_safe
    from bidirl.runtime.prepare import prepare_data

    cfg = load_config(None, ["data.reward_timeout_s=2.5"])
    assert prepare_data(cfg)[1].guard.timeout_s == 2.5
    assert load_config().data.reward_timeout_s == 30.0
    with pytest.raises(ConfigError, match="data.reward_timeout_s"):
        load_config(None, ["data.reward_timeout_s=0"])
    assert resume_safe("data.reward_timeout_s")


def test_a_reward_fn_with_its_guard_pickles():
    import pickle

    fn = RewardFn(_decode, "zero", "d", 3.0)
    fn.guard.call(lambda: 1.0)
    back = pickle.loads(pickle.dumps(fn))
    assert back.guard.timeout_s == 3.0 and back.guard.stats.calls == 1 and back.guard.call(lambda: 2.0) == (True, 2.0)


def test_a_nan_reward_by_default_is_one_line_naming_the_group_prompt_and_response(tmp_path):
    """What the CLI prints for it (one ``bidirl train: error:`` line, exit 2) is the message
    of this error: the driver's loop raises it and the CLI reports user errors in one line
    (end to end: ``test_reward_guards_e2e.py``'s all-bad run takes the same way out)."""
    fn = _reward(tmp_path, "    return float('nan') if solution_str == 'answer 11' else 1.0\n", name="nan_reward.py")
    with pytest.raises(BadRewardError) as info:
        _store().score(7, fn, _decode)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("returned nan", "group 7", "prompt uid e0p7", "data_source 'add'", "response 1",
                 "data.on_bad_reward=zero"):
        assert part in msg, (part, msg)
