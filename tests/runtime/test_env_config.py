"""The ``env`` section: declared, checked, in ``--help``; a set ``env.path`` is refused at
start-up (after its class is loaded and checked), before any worker."""

from __future__ import annotations

import pytest

from bidirl.algo.environment import EnvError
from bidirl.runtime.config import ConfigError, help_text, load_config
from bidirl.runtime.prepare import prepare_data, refuse_environment

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


def test_a_set_env_path_is_refused_in_one_line(tmp_path):
    path = tmp_path / "env.py"
    path.write_text(ENV)
    cfg = load_config(overrides=[f"env.path={path}", "env.name=E"])
    with pytest.raises(ConfigError, match="not wired into the runtime yet") as e:
        prepare_data(cfg)
    assert "\n" not in str(e.value)
    refuse_environment(load_config())  # no env.path: nothing to refuse


def test_a_broken_environment_is_reported_before_the_refusal(tmp_path):
    path = tmp_path / "env.py"
    path.write_text(ENV)
    with pytest.raises(EnvError, match="no class named 'Nope'"):
        refuse_environment(load_config(overrides=[f"env.path={path}", "env.name=Nope"]))
