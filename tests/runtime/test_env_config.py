"""The ``env`` section: declared, checked, in ``--help``; a set ``env.path``'s class is loaded
and checked by ``prepare_data``, before any worker, and a broken one is one line."""

from __future__ import annotations

import pytest

from bidirl.algo.environment import EnvError
from bidirl.runtime.config import ConfigError, help_text, load_config
from bidirl.runtime.prepare import prepare_data

ENV = ("class E:\n    def reset(self, row):\n        return []\n"
       "    def step(self, text):\n        return [], 0.0, True\n")


def test_defaults_and_help():
    env = load_config().env
    assert (env.path, env.name, env.max_turns, env.max_total_tokens, env.turn_timeout_s, env.tool_latency_s) == (
        None, "Environment", 4, 1024, 30.0, 0.0)
    text = help_text()
    for name in ("env.path", "env.name", "env.max_turns", "env.max_total_tokens", "env.turn_timeout_s",
                 "env.tool_latency_s"):
        assert name in text


@pytest.mark.parametrize(("override", "needle"), [
    ("env.max_turns=0", "env.max_turns"),
    ("env.turn_timeout_s=0", "env.turn_timeout_s"),
    ("env.tool_latency_s=-1", "env.tool_latency_s"),
    ("env.path=/nonexistent/env.py", "env.path: must be an existing .py file"),
])
def test_bad_values(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(overrides=[override])


def test_a_good_environment_passes_and_an_image_model_is_refused(tmp_path):
    path = tmp_path / "env.py"
    path.write_text(ENV)
    rows, _ = prepare_data(load_config(overrides=[f"env.path={path}", "env.name=E"]))
    assert rows
    with pytest.raises(ConfigError, match="model.kind=vl") as e:
        prepare_data(load_config(overrides=[f"env.path={path}", "env.name=E", "model.kind=vl", "data.task=shapes"]))
    assert "\n" not in str(e.value)


def test_a_broken_environment_is_reported_in_one_line(tmp_path):
    path = tmp_path / "env.py"
    path.write_text(ENV)
    with pytest.raises(EnvError, match="no class named 'Nope'") as e:
        prepare_data(load_config(overrides=[f"env.path={path}", "env.name=Nope"]))
    assert "\n" not in str(e.value)


def test_a_built_in_tool_task_is_multi_turn_and_refuses_a_reward_function(tmp_path):
    from bidirl.runtime.prepare import prepare_val_rows
    from bidirl.runtime.trajectories import hub_for, is_multi_turn, tool_task

    cfg = load_config(overrides=["data.task=guess_number", "env.tool_latency_s=0.01"])
    assert is_multi_turn(cfg) and tool_task(cfg).name == "guess_number"
    rows, _ = prepare_data(cfg)  # no compute_score is tried: the environment scores
    assert len(rows) == 4096 and rows[0].data_source == "guess_number"
    val = prepare_val_rows(cfg)  # the task's test split, played as episodes (runtime/validation_episodes.py)
    assert len(val) == 64 and val[0].data_source == "guess_number"
    assert [r.ground_truth for r in val[:8]] != [r.ground_truth for r in rows[:8]]
    from bidirl.models.tiny import build_tokenizer

    hub = hub_for(cfg, build_tokenizer(), 512)
    try:
        assert hub.limits.max_turns == 8  # the task's own limit (a binary search needs 6)
        assert hub.make_env().latency == 0.0 and hub.make_env().given_latency == 0.01
    finally:
        hub.close()
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(*a, **k):\n    return 0.0\n")
    with pytest.raises(ConfigError, match="scored by its environment") as e:
        prepare_data(load_config(overrides=["data.task=guess_number", f"data.reward_fn={reward}"]))
    assert "\n" not in str(e.value)
    assert not is_multi_turn(load_config())
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=72") as e:  # a tool call needs room
        prepare_data(load_config(overrides=["data.task=kv_lookup"]))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="guess_number"):  # the choices name the tool tasks
        prepare_data(load_config(overrides=["data.task=nope"]))
