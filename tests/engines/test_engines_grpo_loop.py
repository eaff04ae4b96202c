"""End to end on CPU: warm-started tiny model + vLLM rollouts (``RolloutRole``) + GRPO steps.

On-policy, vLLM's behaviour log-probs and the trainer's must agree (``kl_behaviour`` ~ 0) at
every step, through every in-place weight update, and the reward must rise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_grpo_raises_copy_reward(tiny_model_dir, tmp_path):
    from bidirl.algo.data import PromptCursor
    from bidirl.algo.grpo import group_advantages
    from bidirl.algo.tasks import get_task
    from bidirl.engines.train_batch import TrainSample, make_microbatches
    from bidirl.engines.trainer_config import TrainerConfig
    from bidirl.engines.trainer_torch import TorchTrainer
    from bidirl.models.tiny import encode_prompt, load_tokenizer
    from bidirl.models.warm_start import warm_start
    from bidirl.runtime.messages import ResponseRequest
    from bidirl.runtime.rollout_role import RolloutRole

    model = warm_start(tiny_model_dir, tmp_path / "warm", tasks=("copy",))
    tok, task = load_tokenizer(model), get_task("copy")
    trainer = TorchTrainer(model, TrainerConfig(lr=4e-4, clip_eps_high=0.2))  # the clip this test was tuned with
    engine = RolloutRole(str(model), max_num_seqs=128, max_model_len=256, kv_cache_bytes=64 << 20)
    cursor = PromptCursor(task.rows(2000, seed=0), seed=0)
    P, G, mean_rewards = 16, 8, []
    try:
        for step in range(50):
            items = cursor.take(P)
            prompts = [encode_prompt(tok, it.row["prompt"]) for it in items]
            engine.submit([
                ResponseRequest(i, g, prompt, 12, seed=step * 1000 + i * G + g)
                for i, prompt in enumerate(prompts) for g in range(G)
            ])
            results = []
            while engine.running:
                results += engine.run(10.0, stop_on_finish=False)["finished"]
            results.sort(key=lambda r: (r.group_id, r.index))
            assert [(r.group_id, r.index) for r in results] == [(i, g) for i in range(P) for g in range(G)]
            rewards_P_G = np.array([
                task.compute_score("copy", tok.decode(r.token_ids, skip_special_tokens=True),
                                   items[r.group_id].row["reward_model"]["ground_truth"])
                for r in results
            ]).reshape(P, G)
            adv = group_advantages(torch.tensor(rewards_P_G)).reshape(-1)
            samples = [
                TrainSample(r.prompt_ids, r.token_ids, r.logprobs, float(adv[k])) for k, r in enumerate(results)
            ]
            metrics = trainer.train_step(make_microbatches(samples, 32))
            assert abs(metrics["kl_behaviour"]) < 1e-4  # on-policy: vLLM and torch agree
            assert {v for r in results for v in r.versions} == {engine.version}
            engine.update_weights(trainer.get_weights_numpy(), trainer.version)
            mean_rewards.append(rewards_P_G.mean())
    finally:
        engine.release()
    first, last = np.mean(mean_rewards[:10]), np.mean(mean_rewards[-10:])
    assert 0.2 < first < 0.8  # the warm start leaves room to learn
    assert last > first + 0.05, mean_rewards
