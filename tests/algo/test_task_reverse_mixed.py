"""``reverse_mixed``: the binary-reward task of mixed difficulty the algorithms are compared on.

Its rows are deterministic, its reward is exact match only (so a group has zero spread exactly
when its answers are all right or all wrong), no constant answer earns anything worth the name,
three in seven of its prompts need 6+ digits (which the warm-started tiny model never gets right:
those groups are all wrong), and its warm start is its own (300 steps) unless the config says.
"""

from __future__ import annotations

import pytest

from bidirl.algo.tasks import best_constant_score, compute_score, exact_score, get_task
from bidirl.runtime import prepare
from bidirl.runtime.config import load_config

TASK = get_task("reverse_mixed")


def test_rows_are_deterministic_reversals_of_2_to_8_digits():
    rows = TASK.rows(2000, seed=1)
    assert rows == TASK.rows(2000, seed=1) and rows != TASK.rows(2000, seed=1, split="test")
    lengths = []
    for row in rows:
        op, digits = row["prompt"][0]["content"].split()
        assert op == "reverse" and row["reward_model"]["ground_truth"] == digits[::-1]
        assert row["data_source"] == "reverse_mixed"
        lengths.append(len(digits))
    assert set(lengths) == set(range(2, 9))  # 8 digits + EOS: within the default cap of 16 tokens
    assert sum(n >= 6 for n in lengths) / len(lengths) > 0.4  # beyond the warm start: all-wrong groups
    assert sum(n == 2 for n in lengths) / len(lengths) > 0.1  # nearly always right: all-right groups


def test_reward_is_exact_match_only():
    assert compute_score("reverse_mixed", "4321", "4321") == 1.0
    assert compute_score("reverse_mixed", " 4321\nmore", "4321") == 1.0  # the first line is the answer
    for wrong in ("4320", "432", "43210", "", "1234"):
        assert compute_score("reverse_mixed", wrong, "4321") == 0.0
    assert compute_score("reverse", "4320", "4321") == 0.75  # the partial credit reverse_mixed has not
    assert exact_score("12<|eos|>", "12") == 1.0


def test_no_constant_answer_scores():
    rows = TASK.rows(2048, seed=0, split="test")
    _, exact_best = best_constant_score(rows, exact=True)
    _, partial_best = best_constant_score(rows)  # even with reverse's partial credit
    assert exact_best < 0.02 and partial_best < 0.2


@pytest.mark.parametrize(("overrides", "steps"), [
    ((), 40), (("data.task=reverse_mixed",), 300), (("data.task=reverse_mixed", "model.warm_start_steps=7"), 7),
    (("data.task=reverse_mixed", "model.warm_start_steps=0"), None)])
def test_warm_start_steps_default_to_the_tasks_own(monkeypatch, tmp_path, overrides, steps):
    seen = []
    monkeypatch.setattr(prepare, "MODELS_CACHE", tmp_path)
    monkeypatch.setattr(prepare, "build_tiny_model", lambda *a, **k: None)
    monkeypatch.setattr(prepare, "warm_start", lambda base, out, tasks, steps, seed: seen.append((tasks, steps)))
    model_dir = prepare.prepare_model(load_config(overrides=list(overrides)))
    task = load_config(overrides=list(overrides)).data.task
    assert seen == ([] if steps is None else [((task,), steps)])
    assert model_dir.endswith("H128" if steps is None else f"-sft-{task}-{steps}")


@pytest.mark.parametrize("kind", ["text", "vl"])
def test_every_rl_seed_starts_from_the_same_warm_start(monkeypatch, tmp_path, kind):
    """``run.seed`` seeds the RL, not the warm start: a short warm start can stop on either side
    of its task's cliff depending on its seed, and a seed study must compare RL from one model."""
    seen = []
    monkeypatch.setattr(prepare, "MODELS_CACHE", tmp_path)
    monkeypatch.setattr(prepare, "build_tiny_model", lambda *a, **k: None)
    monkeypatch.setattr(prepare, "build_tiny_vl_model", lambda *a, **k: None)
    monkeypatch.setattr(prepare, "warm_start", lambda *a, seed, **k: seen.append(seed))
    monkeypatch.setattr(prepare, "warm_start_vl", lambda *a, seed, **k: seen.append(seed))
    task = ["data.task=shapes", "model.kind=vl"] if kind == "vl" else ["data.task=kv_lookup"]
    dirs = {prepare.prepare_model(load_config(overrides=[*task, f"run.seed={s}"])) for s in (0, 1, 7)}
    assert seen == [prepare.WARM_START_SEED] * 3 and len(dirs) == 1
