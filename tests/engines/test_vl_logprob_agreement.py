"""Image prompts through the rollout engine and the trainer (``RolloutRole`` + ``TorchTrainer``).

On-policy, vLLM's behaviour log-probs on image prompts (one placeholder per image, the
images decoded from their bytes) and the trainer's (the placeholders expanded, the pixels
from its own image processor) must agree as they do for text (``test_engines_grpo_loop``:
``kl_behaviour`` ~ 0), through an in-place weight update (which re-prefills each live
response with its image) and a validation in the middle of generation.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_trainer_and_vllm_agree_on_image_prompts(tiny_vl_dir):
    from transformers import AutoProcessor

    from bidirl.algo.multimodal import encode_image_prompt, validate_image_row
    from bidirl.algo.tasks_visual import SHAPES
    from bidirl.engines.train_batch import TrainSample
    from bidirl.engines.trainer_config import TrainerConfig
    from bidirl.engines.trainer_torch import TorchTrainer
    from bidirl.runtime.messages import ResponseRequest
    from bidirl.runtime.rollout_role import RolloutRole

    proc = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    rows = [validate_image_row(r, "<shapes>", i) for i, r in enumerate(SHAPES.rows(6, seed=1))]
    prompts = [encode_image_prompt(proc, r) for r in rows]
    trainer = TorchTrainer(tiny_vl_dir, TrainerConfig(lr=1e-3))
    engine = RolloutRole(str(tiny_vl_dir), max_num_seqs=32, max_model_len=128, kv_cache_bytes=32 << 20, max_images=1)
    G = 3
    try:
        for step in range(2):
            engine.submit([ResponseRequest(i, g, p.rollout_ids, 10, seed=step * 100 + i * G + g, images=r.images,
                                           image_tokens=len(p.input_ids) - len(p.rollout_ids))
                           for i, (p, r) in enumerate(zip(prompts, rows, strict=True)) for g in range(G)])
            engine.run(0.05, stop_on_finish=False)  # a few tokens in, then a validation mid-generation
            val = engine.validate([p.rollout_ids for p in prompts[:2]], 6, images=[r.images for r in rows[:2]])
            assert len(val["responses"]) == 2 and all(val["responses"])
            results = []
            while engine.running:
                results += engine.run(10.0, stop_on_finish=False)["finished"]
            results.sort(key=lambda r: (r.group_id, r.index))
            assert len(results) == len(rows) * G and all(r.images == rows[r.group_id].images for r in results)
            samples = [TrainSample(prompts[r.group_id].input_ids, r.token_ids, r.logprobs,
                                   float((-1) ** k), images=r.images) for k, r in enumerate(results)]
            lp = trainer.compute_logprobs(samples)
            worst = max(float(np.max(np.abs(a - np.asarray(r.logprobs)))) for a, r in zip(lp, results, strict=True))
            assert worst < 1e-3, worst
            metrics = trainer.train_step([samples])
            assert abs(metrics["kl_behaviour"]) < 1e-4
            assert {v for r in results for v in r.versions} <= {engine.version}
            engine.update_weights(trainer.get_weights_numpy(), trainer.version)
    finally:
        engine.release()
