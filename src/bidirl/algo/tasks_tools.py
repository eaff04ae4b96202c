"""Two built-in multi-turn tasks that cannot be solved without their tool or their feedback.

- ``kv_lookup``: the row asks for the value of a key; the values live only in the row's
  ``extra_info["table"]``, which the model never sees, so it must call ``lookup(key)``
  (:class:`KeyValueLookupEnv`, a :class:`~bidirl.algo.tools.ToolEnvironment`) and answer the
  value in ``\\boxed{}`` or on its last line (reward 1, else 0).  Values are random 4-digit
  numbers: the best constant answer scores about 1 in 10,000.
- ``guess_number``: a secret number in ``[low, high]`` (1-64 by default); each turn the model
  guesses, the environment answers ``higher`` / ``lower`` (:class:`GuessNumberEnv`); reward 1
  for the right guess within the turn limit (:data:`GUESS_MAX_TURNS`: a binary search needs
  at most 7).  Without the feedback no play does well: a constant guess wins 1 time in 64,
  the best fixed sequence of 8 distinct guesses 8 in 64 (0.125; over 1-32 it was 0.25, which
  is why the range is 64).

Rows are veRL's layout (``prompt``, ``data_source``, ``reward_model.ground_truth``,
``extra_info`` with ``index`` and ``split``), the same for the same ``(n, seed, split)``;
``split="test"`` draws a disjoint-seeded validation split.  ``tool_latency_s`` (a constructor
argument, else the row's ``extra_info["tool_latency_s"]``, else 0) sleeps in every tool call
or feedback turn, to model a real tool's wait (a search, a code sandbox, a game engine).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from bidirl.algo.tools import ToolEnvironment

GUESS_MAX_TURNS = 8
"""Turns a ``guess_number`` episode gets (a binary search over 1-64 needs at most 7)."""
GUESS_HIGH = 64
"""``guess_number``'s default range is 1-``GUESS_HIGH``."""
LOOKUP_MAX_TURNS = 4
"""Turns a ``kv_lookup`` episode gets (one lookup and the answer need 2)."""

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"-?\d+")


def final_answer(text: str) -> str:
    """The last ``\\boxed{...}`` of ``text``, else its last non-empty line, stripped (a trailing
    full stop dropped)."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    lines = [line.strip() for line in text.split("<|", 1)[0].splitlines() if line.strip()]
    return lines[-1].rstrip(".").strip() if lines else ""


def _latency(row: dict, given: float | None) -> float:
    if given is not None:
        return float(given)
    return float((row.get("extra_info") or {}).get("tool_latency_s") or 0.0)


# -- kv_lookup ---------------------------------------------------------------------------------
def _kv_row(rng: random.Random) -> tuple[str, str, dict]:
    keys = rng.sample([f"{a}{b}" for a in "abcdefghjkmnpqrstuvwxyz" for b in "0123456789"], 6)
    table = [{"key": k, "value": f"{rng.randrange(10_000):04d}"} for k in keys]
    asked = rng.choice(table)
    prompt = (f"What is the value stored under key {asked['key']}? Call the lookup tool to read it, then "
              "answer with the value in \\boxed{}.")
    return prompt, asked["value"], {"table": table}


class KeyValueLookupEnv(ToolEnvironment):
    """``kv_lookup``'s environment: one tool, ``lookup(key)``, over the row's hidden table."""

    def __init__(self, tool_latency_s: float | None = None) -> None:
        super().__init__([self.lookup], self._score)
        self.given_latency = tool_latency_s
        self.latency = 0.0
        self.table: dict[str, str] = {}

    def reset(self, row: dict) -> list[dict]:
        self.table = {e["key"]: e["value"] for e in (row.get("extra_info") or {}).get("table", [])}
        self.latency = _latency(row, self.given_latency)
        return super().reset(row)

    def lookup(self, key: str) -> str:
        """Read the value stored under a key.

        Args:
            key: the key, as the question writes it.
        """
        if self.latency:
            time.sleep(self.latency)
        return self.table.get(key.strip(), f"no key {key!r}")

    @staticmethod
    def _score(row: dict, text: str) -> float:
        return float(final_answer(text) == str(row["reward_model"]["ground_truth"]))


# -- guess_number ------------------------------------------------------------------------------
def _guess_row(rng: random.Random, low: int = 1, high: int = GUESS_HIGH) -> tuple[str, str, dict]:
    secret = rng.randint(low, high)
    prompt = (f"I am thinking of a whole number from {low} to {high}. Guess it: answer with one number; I will "
              "say higher or lower.")
    return prompt, str(secret), {"low": low, "high": high}


class GuessNumberEnv:
    """``guess_number``'s environment: per-turn ``higher`` / ``lower`` feedback, reward 1 when right."""

    def __init__(self, tool_latency_s: float | None = None) -> None:
        self.given_latency = tool_latency_s
        self.latency = 0.0
        self.secret, self.low, self.high, self.guesses = 0, 1, GUESS_HIGH, 0

    def reset(self, row: dict) -> list[dict]:
        extra = row.get("extra_info") or {}
        self.secret = int(row["reward_model"]["ground_truth"])
        self.low, self.high = int(extra.get("low", 1)), int(extra.get("high", GUESS_HIGH))
        self.latency, self.guesses = _latency(row, self.given_latency), 0
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]

    def step(self, text: str) -> tuple[list[dict], float, bool]:
        if self.latency:
            time.sleep(self.latency)
        numbers = _INTEGER.findall(final_answer(text))
        if not numbers:
            return [{"role": "user", "content": f"Answer with one number from {self.low} to {self.high}."}], 0.0, False
        guess = int(numbers[-1])
        self.guesses += 1
        if guess == self.secret:
            return [{"role": "user", "content": "Correct!"}], 1.0, True
        hint = "higher" if guess < self.secret else "lower"
        return [{"role": "user", "content": f"{guess} is wrong: {hint}."}], 0.0, False


# -- experts: what a warm start imitates ---------------------------------------------------------
_KEY = re.compile(r"under key (\w+)\?")


def lookup_expert(row: dict) -> Callable[[list[dict]], str]:
    """``kv_lookup`` played right: one ``lookup`` call with the asked key, then the value it
    returned in ``\\boxed{}``."""
    def turn(messages: list[dict]) -> str:
        if messages[-1]["role"] != "tool":
            key = _KEY.search(messages[-1]["content"]).group(1)
            return f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'
        return f"\\boxed{{{messages[-1]['content']}}}"
    return turn


def guess_expert(row: dict) -> Callable[[list[dict]], str]:
    """``guess_number`` played right: a binary search over the range, led by the feedback."""
    extra = row.get("extra_info") or {}
    bounds = [int(extra.get("low", 1)), int(extra.get("high", GUESS_HIGH))]

    def turn(messages: list[dict]) -> str:
        last = messages[-1]["content"]
        if "wrong: higher" in last:
            bounds[0] = int(_INTEGER.findall(last)[0]) + 1
        elif "wrong: lower" in last:
            bounds[1] = int(_INTEGER.findall(last)[0]) - 1
        return str((bounds[0] + bounds[1]) // 2)
    return turn


# -- the tasks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolTask:
    """A built-in multi-turn task: its rows, the environment that plays them, and an expert."""

    name: str
    make_row: Callable[[random.Random], tuple[str, str, dict]]
    environment: Callable[..., object]
    """``environment(tool_latency_s=None)``: a fresh environment for one episode."""
    max_turns: int
    expert: Callable[[dict], Callable[[list[dict]], str]] | None = None
    """``expert(row)``: a function from the conversation so far to the right next model turn
    (the warm start imitates whole episodes of it, ``models/warm_start.py``)."""
    warm_start_steps: int = 200
    turn_tokens: int = 8
    """The shortest model-turn cap its expert's turns fit in (``rollout.max_new_tokens``)."""

    def rows(self, n: int, seed: int = 0, split: str = "train", tool_latency_s: float | None = None) -> list[dict]:
        """n rows in veRL's layout; the same (n, seed, split) always gives the same rows."""
        rng = random.Random(f"{self.name}:{split}:{seed}")  # the split in the seed: train and test differ
        rows = []
        for i in range(n):
            prompt, answer, extra = self.make_row(rng)
            info = {"index": i, "split": split, **extra}
            if tool_latency_s is not None:
                info["tool_latency_s"] = float(tool_latency_s)
            rows.append({"prompt": [{"role": "user", "content": prompt}], "data_source": self.name,
                         "reward_model": {"ground_truth": answer}, "extra_info": info})
        return rows


# kv_lookup's warm start (2-layer tiny model, lr 3e-3, seed 0): copying the key is a cliff.
# 200 and 350 steps teach the call's format but not the copy (greedy validation 0.0), 400
# copies 1 key in 11 (0.086) and RL does not move it, 450 and 600 copy every key (1.0: nothing
# left to learn, and RL can only lose it).  425 stops on the cliff's face (0.414), and RL at
# trainer.lr=1e-4 with trainer.kl_coef=0.05 climbs from there (BENCHMARKS.md, "Convergence";
# docs/notes/2026-12-05-late-multi-turn.md, 2026-12-08-visual-warm-start.md).
KV_LOOKUP = ToolTask("kv_lookup", _kv_row, KeyValueLookupEnv, LOOKUP_MAX_TURNS, lookup_expert, warm_start_steps=425,
                     turn_tokens=72)
GUESS_NUMBER = ToolTask("guess_number", _guess_row, GuessNumberEnv, GUESS_MAX_TURNS, guess_expert)
TOOL_TASKS: dict[str, ToolTask] = {t.name: t for t in (KV_LOOKUP, GUESS_NUMBER)}
