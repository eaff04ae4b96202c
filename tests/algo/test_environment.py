"""The environment interface: loading a user's class (every error one line) and the episode
runner's outcomes (done, raises, times out, wrong shape, max turns, max length, async)."""

from __future__ import annotations

import asyncio
import textwrap
import time

import pytest

from bidirl.algo.environment import EnvError, StepShapeError, check_step_result, load_environment
from bidirl.algo.episode import OUTCOMES, EpisodeLimits, run_episode

ROW = {"prompt": [{"role": "user", "content": "count to three"}], "data_source": "t",
       "reward_model": {"ground_truth": "3"}, "extra_info": {}}


def words(text: str) -> int:
    return len(text.split())


def write(tmp_path, body: str):
    path = tmp_path / "my_env.py"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """
    class Counter:
        def reset(self, row):
            return list(row["prompt"])

        def step(self, text):
            return [{"role": "user", "content": "more"}], 0.0, False
"""


def test_a_good_class_loads(tmp_path):
    cls = load_environment(write(tmp_path, GOOD), "Counter")
    assert cls.__name__ == "Counter"


@pytest.mark.parametrize(("body", "name", "needle"), [
    (GOOD, "Nope", "no class named 'Nope' (env.name); classes defined: ['Counter']"),
    ("x = 3\n", "x", "'x' is a int, not a class"),
    ("class E:\n    def step(self, text): pass\n", "E", "class E has no reset(self, row) method"),
    ("class E:\n    def reset(self, row): pass\n", "E", "class E has no step(self, text) method"),
    ("class E:\n    def reset(self, row): pass\n    step = 3\n", "E", "E.step is a int, not a method"),
    ("class E:\n    def reset(self): pass\n    def step(self, text): pass\n", "E",
     "E.reset takes no argument besides self"),
    ("class E:\n    def reset(self, row, seed): pass\n    def step(self, text): pass\n", "E",
     "E.reset takes 2 required arguments besides self (row, seed)"),
    ("class E:\n    def reset(self, row): pass\n    def step(self, text, *, k): pass\n", "E",
     "E.step requires keyword-only argument(s) ['k']"),
    ("class E:\n    @staticmethod\n    def reset(row): pass\n    def step(self, text): pass\n", "E",
     "E.reset is a staticmethod"),
    ("class E:\n    def __init__(self, size): pass\n    def reset(self, row): pass\n    def step(self, text): pass\n",
     "E", "E() requires argument(s) ['size']"),
    ("raise RuntimeError('boom')\n", "E", "importing the environment file failed: RuntimeError: boom"),
])
def test_load_errors_are_one_line_naming_the_file(tmp_path, body, name, needle):
    path = write(tmp_path, body)
    with pytest.raises(EnvError) as e:
        load_environment(path, name)
    assert needle in str(e.value) and str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(EnvError, match="environment file not found"):
        load_environment(tmp_path / "none.py", "E")


def test_defaults_and_varargs_are_accepted(tmp_path):
    body = "class E:\n    def reset(self, row, seed=0): pass\n    def step(self, *args): pass\n"
    assert load_environment(write(tmp_path, body), "E")


def test_async_methods_are_accepted(tmp_path):
    body = "class E:\n    async def reset(self, row): pass\n    async def step(self, text): pass\n"
    assert load_environment(write(tmp_path, body), "E")


@pytest.mark.parametrize(("value", "needle"), [
    (None, "step returned a NoneType"),
    (([], 1.0), "a tuple of 2"),
    (({"role": "user", "content": "x"}, 1.0, False), "is a dict, not a list of messages"),
    (([{"role": "user"}], 1.0, False), "needs a str 'role' and a str 'content'"),
    (([{"role": "assistant", "content": "x"}], 1.0, False), "has role 'assistant'"),
    (([], "1", False), "reward is '1'; expected a finite number"),
    (([], float("nan"), False), "expected a finite number"),
    (([], 1.0, "yes"), "done is 'yes'; expected True or False"),
])
def test_wrong_step_shapes_say_what_is_wrong(value, needle):
    with pytest.raises(StepShapeError, match=None) as e:
        check_step_result(value)
    assert needle in str(e.value)


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    assert check_step_result(([], np.float32(0.5), np.bool_(True))) == ([], 0.5, True)


# -- the runner ------------------------------------------------------------------------------
class Countdown:
    """Done after ``n`` steps with reward 1; each step's observation says how many are left."""

    def __init__(self, n: int = 2, fail_at: int | None = None, sleep_at: int | None = None,
                 bad_at: int | None = None) -> None:
        self.n, self.fail_at, self.sleep_at, self.bad_at, self.steps = n, fail_at, sleep_at, bad_at, 0
        self.closed = False

    def reset(self, row):
        return list(row["prompt"])

    def step(self, text):
        self.steps += 1
        if self.steps == self.fail_at:
            raise KeyError("lost")
        if self.steps == self.sleep_at:
            time.sleep(5)
        if self.steps == self.bad_at:
            return "oops"
        left = self.n - self.steps
        return [{"role": "user", "content": f"{left} left"}], float(left == 0), left == 0

    def close(self):
        self.closed = True


def echo(messages):
    return f"turn {len(messages)}"


def test_done_keeps_every_turn_with_its_mask():
    env = Countdown(n=2)
    traj = run_episode(env, ROW, echo, words, EpisodeLimits(max_turns=5))
    assert traj.outcome == "done" and traj.reward == 1.0 and traj.step_rewards == [0.0, 1.0]
    assert [(t.role, t.trains) for t in traj.turns] == [
        ("user", False), ("assistant", True), ("user", False), ("assistant", True), ("user", False)]
    assert traj.turns[1].text == "turn 1" and traj.turns[3].text == "turn 3"
    assert traj.total_tokens == sum(words(t.text) for t in traj.turns)
    assert env.closed and traj.error == ""


def test_an_environment_that_raises_ends_the_trajectory():
    traj = run_episode(Countdown(n=5, fail_at=2), ROW, echo, words)
    assert traj.outcome == "env_error" and "step raised KeyError: 'lost'" in traj.error
    assert traj.model_turns == 2


def test_a_wrong_shape_is_an_env_error():
    traj = run_episode(Countdown(n=5, bad_at=1), ROW, echo, words)
    assert traj.outcome == "env_error" and "step returned a str" in traj.error


def test_a_step_past_its_time_limit_is_abandoned():
    traj = run_episode(Countdown(n=5, sleep_at=1), ROW, echo, words, EpisodeLimits(turn_timeout_s=0.05))
    assert traj.outcome == "env_timeout" and "env.turn_timeout_s" in traj.error


def test_reset_failures():
    class Bad:
        def reset(self, row):
            return "hello"

        def step(self, text):
            return [], 0.0, True

    class Raises(Bad):
        def reset(self, row):
            raise SystemError("no")

    assert run_episode(Bad(), ROW, echo, words).outcome == "env_error"
    traj = run_episode(Raises(), ROW, echo, words)
    assert traj.outcome == "env_error" and traj.error.startswith("reset raised SystemError") and not traj.turns


def test_max_turns():
    traj = run_episode(Countdown(n=10), ROW, echo, words, EpisodeLimits(max_turns=3))
    assert traj.outcome == "max_turns" and traj.model_turns == 3 and len(traj.step_rewards) == 3


def test_max_length():
    traj = run_episode(Countdown(n=10), ROW, echo, words, EpisodeLimits(max_turns=10, max_total_tokens=8))
    assert traj.outcome == "max_length" and traj.total_tokens > 8 and traj.model_turns < 10


def test_a_prompt_over_the_length_limit_never_generates():
    def never(messages):
        raise AssertionError("generate called")

    traj = run_episode(Countdown(), ROW, never, words, EpisodeLimits(max_total_tokens=2))
    assert traj.outcome == "max_length" and traj.model_turns == 0


class AsyncCountdown(Countdown):
    async def reset(self, row):
        await asyncio.sleep(0)
        return list(row["prompt"])

    async def step(self, text):
        await asyncio.sleep(0.001 if self.sleep_at != self.steps + 1 else 5)
        self.steps += 1
        return [{"role": "tool", "content": "ok"}], 0.5, self.steps >= self.n


def test_async_environment_and_async_generate():
    async def agen(messages):
        await asyncio.sleep(0)
        return "hi"

    traj = run_episode(AsyncCountdown(n=3), ROW, agen, words)
    assert traj.outcome == "done" and traj.reward == 1.5 and traj.turns[-1].role == "tool"


def test_async_environment_timeout():
    traj = run_episode(AsyncCountdown(n=3, sleep_at=2), ROW, echo, words, EpisodeLimits(turn_timeout_s=0.05))
    assert traj.outcome == "env_timeout" and traj.model_turns == 2


def test_episodes_run_side_by_side_on_one_loop():
    """A blocking environment does not hold up the caller's loop: two episodes interleave."""
    from bidirl.algo.episode import run_episode_async

    class Slow(Countdown):
        def step(self, text):
            time.sleep(0.02)  # blocking, as a real tool's call may be
            return super().step(text)

    async def both():
        return await asyncio.gather(*(run_episode_async(Slow(n=2), ROW, echo, words) for _ in range(2)))

    assert [t.outcome for t in asyncio.run(both())] == ["done", "done"]
    assert set(OUTCOMES) == {"done", "max_turns", "max_length", "env_error", "env_timeout"}


def test_close_is_not_sent_to_a_thread_still_busy_after_a_timeout():
    env = Countdown(n=5, sleep_at=1)
    traj = run_episode(env, ROW, echo, words, EpisodeLimits(turn_timeout_s=0.05))
    assert traj.outcome == "env_timeout" and not env.closed


def test_the_docs_examples_load_and_run(tmp_path):
    """docs/environments.md's two example files, as a user would save them."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc, re.DOTALL) if "class Environment" in b]
    assert len(blocks) == 2
    row = {"prompt": [{"role": "user", "content": "what is k7?"}], "data_source": "d",
           "reward_model": {"ground_truth": "4021"}, "extra_info": {}}
    replies = {0: ["1", "4021"], 1: ['<tool_call>{"name": "lookup", "arguments": {"key": "k7"}}</tool_call>', "4021"]}
    for i, block in enumerate(blocks):
        path = tmp_path / f"example_{i}.py"
        path.write_text(block)
        script = iter(replies[i])
        traj = run_episode(load_environment(path, "Environment")(), row, lambda m, s=script: next(s), words)
        assert (traj.outcome, traj.reward, traj.model_turns) == ("done", 1.0, 2)
