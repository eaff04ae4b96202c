"""``bench/convergence.py``'s algorithm presets load through the real config, and its report
groups runs by (algorithm, policy) with bidirl's gap to sync per algorithm."""

from __future__ import annotations

import pytest

from bench import convergence as conv
from bidirl.runtime.config import load_config


@pytest.mark.parametrize("name", list(conv.ALGORITHMS))
def test_every_preset_loads_with_all_its_keys(name):
    cfg = load_config(overrides=[*conv.ALGORITHMS[name], "rollout.max_new_tokens=16"])
    assert conv.algorithm_overrides(name) == conv.ALGORITHMS[name]
    assert conv.DYNAMIC_SAMPLING not in conv.algorithm_overrides(name, reproducible=True)
    load_config(overrides=[*conv.algorithm_overrides(name, reproducible=True), *conv.SMALL])
    if name == "gspo":
        assert cfg.algorithm.policy_loss == "gspo" and cfg.trainer.clip_eps_high == 4e-4


def test_the_presets_choose_what_their_names_say():
    def cfg(name):
        return load_config(overrides=[*conv.algorithm_overrides(name), "rollout.max_new_tokens=16"]).algorithm

    assert cfg("grpo") == load_config().algorithm
    assert not cfg("dr_grpo").norm_adv_by_std_in_grpo and cfg("dr_grpo").loss_agg_mode == "seq-mean-token-sum-norm"
    for est in ("rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        assert cfg(est).adv_estimator == est
    assert cfg("dapo").overlong_buffer.enable and cfg("dapo").loss_agg_mode == "token-mean"


def _run(algorithm, policy, seed, reward):
    run = {"policy": policy, "seed": seed, "rewards": [reward] * 60, "val": [(0, 0.1), (60, reward)],
           "loop_wall_s": 10.0, "step_end_s": [i / 6 for i in range(1, 61)], "borrows": {}, "args": []}
    return run if algorithm is None else {**run, "algorithm": algorithm}


def test_report_is_keyed_by_algorithm_and_policy_with_the_gap_to_sync():
    runs = [_run(None, "sync", 0, 0.5), _run(None, "bidirl", 0, 0.52),  # before presets: grpo
            _run("dapo", "sync", 0, 0.4), _run("dapo", "bidirl", 0, 0.3), _run("dapo", "bidirl", 1, 0.35)]
    rep = conv.report(runs, target=0.3)["algorithms"]
    assert set(rep) == {"grpo", "dapo"}
    assert rep["grpo"]["bidirl"]["reward_last_50_gap_to_sync"] == pytest.approx(0.02)
    assert rep["dapo"]["bidirl"]["reward_last_50_gap_to_sync"] == pytest.approx(-0.075)
    assert rep["dapo"]["bidirl"]["seeds"] == [0, 1]
    lines = conv.table({"algorithms": rep})
    assert any(line.startswith("| dapo | bidirl | 2 |") and "-0.075" in line for line in lines)
