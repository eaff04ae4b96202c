"""Built-in verifiable tasks that a tiny character-level model can learn on a CPU.

Why these tasks: the project needs an end-to-end RL signal without downloading a model or a
data set. Copying, reversing and adding short digit strings are learnable by a 2-layer
model in minutes, are scored by exact rules, and give *partial credit* so the mean reward
rises smoothly instead of jumping from 0 to 1 (which makes "reward goes up" a usable test).

Every task yields rows in veRL's dataset format::

    {"prompt": [{"role": "user", "content": "copy 4821"}],
     "data_source": "copy",
     "reward_model": {"ground_truth": "4821"},
     "extra_info": {"index": 0, "split": "train"}}

and scores a response with veRL's reward-function signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float``.
The module-level :func:`compute_score` dispatches on ``data_source`` so it can serve as the
default reward function for any mix of built-in tasks.

``reverse`` is ``bidirl train``'s default task: after the 40-step warm start the tiny model
answers about a third of it right (greedy, partial credit), and GRPO lifts that to ~0.6 in
300 steps; the best *constant* answer scores under 0.15 (:func:`best_constant_score`), so a
rising curve is learning, not a fixed answer.  ``reverse_long`` reverses 16-48 digits:
its natural responses are tens of tokens, not the 2-5 of ``reverse``.  ``add`` is easy to game: ``"9"`` alone earns
~0.38 of its distance-based partial credit.

``reverse_mixed`` is the task on which the algorithms differ: a binary reward (exact match) on
prompts of mixed difficulty, so that many groups are all right or all wrong (zero spread: every
group-relative advantage is 0, what DAPO's dynamic sampling drops) and responses run from 2 to
9 tokens (the aggregation modes weigh them differently).  Its warm start is longer
(``Task.warm_start_steps``): exact answers need one that gets short strings right.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    """A named verifiable task: how to draw a (prompt, answer) pair and how to score."""

    name: str
    make_pair: Callable[[random.Random], tuple[str, str]]
    score: Callable[[str, str], float]
    """score(response_text, ground_truth) in [0, 1]."""
    warm_start_steps: int = 40
    """SFT steps of the warm start when ``model.warm_start_steps`` is null (``models/warm_start.py``)."""

    def rows(self, n: int, seed: int = 0, split: str = "train") -> list[dict]:
        """n rows in veRL format; the same (n, seed, split) always gives the same rows."""
        return list(self.iter_rows(n, seed=seed, split=split))

    def iter_rows(self, n: int, seed: int = 0, split: str = "train") -> Iterator[dict]:
        # The split name is part of the seed so train and test draws differ.
        rng = random.Random(f"{self.name}:{split}:{seed}")
        for i in range(n):
            prompt, answer = self.make_pair(rng)
            yield {
                "prompt": [{"role": "user", "content": prompt}],
                "data_source": self.name,
                "reward_model": {"ground_truth": answer},
                "extra_info": {"index": i, "split": split},
            }

    def compute_score(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
    ) -> float:
        """veRL-compatible scorer for this task alone."""
        return self.score(solution_str, str(ground_truth))


_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task to the registry; names are unique so a data_source maps to one scorer."""
    if task.name in _REGISTRY:
        raise ValueError(f"task {task.name!r} is already registered")
    _REGISTRY[task.name] = task
    return task


def get_task(name: str) -> Task:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered tasks: {sorted(_REGISTRY)}") from None


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def extract_answer(solution_str: str) -> str:
    """The answer is the response's first line, stripped.

    Why first line: a tiny model that has not learned to stop may ramble after the answer;
    cutting at the newline keeps scoring about the answer. Special-token text (``<|...|>``)
    is cut too, in case a caller decoded without skipping special tokens.
    """
    text = solution_str.split("<|", 1)[0]
    return text.strip().split("\n", 1)[0].strip()


def sequence_score(response: str, target: str) -> float:
    """Position-wise character agreement: matches / max(len(answer), len(target)).

    1.0 only for an exact match; a wrong length is penalised through the denominator, so
    over-long or truncated answers get less than full credit.
    """
    answer = extract_answer(response)
    if not target:
        return 1.0 if not answer else 0.0
    matches = sum(a == b for a, b in zip(answer, target, strict=False))
    return matches / max(len(answer), len(target))


def number_score(response: str, target: str) -> float:
    """1.0 for the exact number; otherwise credit decays with the distance to the target.

    A parseable but wrong integer gets ``0.5 * max(0, 1 - |answer - target| / 10)``: this
    rewards "close" answers so the reward rises smoothly; garbage scores 0.
    """
    answer = extract_answer(response)
    try:
        value, goal = int(answer), int(target)
    except ValueError:
        return 0.0
    if value == goal:
        return 1.0
    return 0.5 * max(0.0, 1.0 - abs(value - goal) / 10.0)


def exact_score(response: str, target: str) -> float:
    """1.0 for exactly the target, else 0.0: a binary outcome, as a maths verifier's."""
    return 1.0 if extract_answer(response) == target else 0.0


def _digits(rng: random.Random, min_len: int, max_len: int) -> str:
    length = rng.randint(min_len, max_len)
    return "".join(rng.choice("0123456789") for _ in range(length))


def _copy_pair(rng: random.Random) -> tuple[str, str]:
    s = _digits(rng, 2, 5)
    return f"copy {s}", s


def _reverse_pair(rng: random.Random) -> tuple[str, str]:
    s = _digits(rng, 2, 5)
    return f"reverse {s}", s[::-1]


def _reverse_long_pair(rng: random.Random) -> tuple[str, str]:
    s = _digits(rng, 16, 48)
    return f"reverse {s}", s[::-1]


def _reverse_mixed_pair(rng: random.Random) -> tuple[str, str]:
    # 2-8 digits: after the warm start 2 are nearly always exactly right, 3-4 about half the
    # time, 5 seldom and 6-8 nearly never (harder prompts, 10-15 digits, stopped the rise).
    s = _digits(rng, 2, 8)
    return f"reverse {s}", s[::-1]


def _add_pair(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"add {a}+{b}", str(a + b)


COPY = register_task(Task("copy", _copy_pair, sequence_score))
REVERSE = register_task(Task("reverse", _reverse_pair, sequence_score))
# Long answers (16-48 digits): responses a warm-started model ends by itself run tens of
# tokens, so a step has rollout work worth sharing (bench/peer_trl.py --task reverse_long).
REVERSE_LONG = register_task(Task("reverse_long", _reverse_long_pair, sequence_score))
ADD = register_task(Task("add", _add_pair, number_score))
# Binary reward, mixed difficulty (bench/convergence.py's algorithm comparison); 300 SFT steps
# (~25 s on one core, cached): after 40 even 2 digits are rarely exactly right.
REVERSE_MIXED = register_task(Task("reverse_mixed", _reverse_mixed_pair, exact_score, warm_start_steps=300))


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """Default reward function: dispatch to the registered task named by ``data_source``."""
    return get_task(data_source).compute_score(data_source, solution_str, ground_truth, extra_info)


def best_constant_score(rows: list[dict], max_len: int = 16, exact: bool = False) -> tuple[str, float]:
    """The constant answer that scores best on these rows under :func:`sequence_score`, exactly
    (under :func:`exact_score` with ``exact``: the most common target).

    Why: a task on which one fixed answer scores well teaches nothing a reward curve can show
    (``add``'s ``"9"`` earns ~0.38 through its partial credit).  For a fixed answer length ``L``
    the mean score is a sum over positions of independent per-position choices (each target
    of length ``n`` contributes ``[answer[j] == target[j]] / max(L, n)``), so the best digit per
    position and the best ``L`` give the optimum over every string of up to ``max_len``
    characters drawn from the targets' alphabet.  Returns (answer, mean score).
    """
    targets = [str(r["reward_model"]["ground_truth"]) for r in rows]
    if not targets:
        raise ValueError("best_constant_score needs at least one row")
    if exact:
        answer, count = Counter(targets).most_common(1)[0]
        return answer, count / len(targets)
    alphabet = sorted({c for t in targets for c in t})
    best = ("", sum(1.0 for t in targets if not t) / len(targets))
    for length in range(1, max_len + 1):
        answer, total = [], 0.0
        for j in range(length):
            credit = {c: 0.0 for c in alphabet}
            for t in targets:
                if j < len(t):
                    credit[t[j]] += 1.0 / max(length, len(t))
            c = max(alphabet, key=lambda ch: (credit[ch], ch))
            answer.append(c)
            total += credit[c]
        if total / len(targets) > best[1]:
            best = ("".join(answer), total / len(targets))
    return best


def mixed_rows(names: list[str], n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """n rows drawn round-robin from several tasks (deterministic for a given seed)."""
    if not names:
        raise ValueError("mixed_rows needs at least one task name")
    iters = [get_task(name).iter_rows(n, seed=seed, split=split) for name in names]
    rows = []
    for i in range(n):
        row = next(iters[i % len(iters)])
        row["extra_info"] = {**row["extra_info"], "index": i}
        rows.append(row)
    return rows
