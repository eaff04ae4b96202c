"""A replica of a LoRA run: it is sent adapters alone, merges them into the base weights it
keeps, and samples with the log-probs the trainer's adapted model gives the same tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")

from bidirl.engines.lora import LoraSettings  # noqa: E402
from bidirl.engines.train_batch import TrainSample  # noqa: E402
from bidirl.engines.trainer_torch import TorchTrainer  # noqa: E402
from bidirl.runtime.messages import ResponseRequest  # noqa: E402
from bidirl.runtime.rollout_role import RolloutRole  # noqa: E402

pytestmark = pytest.mark.vllm
PROMPT = [1, 5, 106, 118, 119, 128, 39, 59, 63, 57, 56, 6]  # <|bos|><|user|>copy 4821<|assistant|>
LORA = LoraSettings(rank=8, alpha=16.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"))


def _adapter(trainer: TorchTrainer, seed: int) -> dict[str, np.ndarray]:
    """The trainer's adapters set to random values (B too: a trained adapter is not zero)."""
    rng = np.random.default_rng(seed)
    w = {k: (v + rng.normal(0, 0.2, v.shape)).astype(np.float32) for k, v in trainer.get_weights_numpy().items()}
    trainer.set_weights_numpy(w)
    return w


def test_the_replica_serves_the_adapted_model_from_adapters_alone(tiny_model_dir):
    trainer = TorchTrainer(tiny_model_dir, lora=LORA)
    role = RolloutRole(tiny_model_dir, max_model_len=512, kv_cache_bytes=64 << 20, lora_scale=LORA.scale)
    try:
        full = sum(v.nbytes for v in role._lora.base.values())
        for version in (1, 2):  # the second merge starts again from the base, not from the first
            adapter = _adapter(trainer, version)
            assert sum(v.nbytes for v in adapter.values()) < full / 3  # what crosses: the adapters
            role.update_weights(adapter, version)
            role.submit([ResponseRequest(version, i, PROMPT, 32, temperature=1.0, seed=i) for i in range(6)])
            done = []
            while role.running:
                done += role.run(10.0, stop_on_finish=False)["finished"]
            assert len(done) == 6 and all(set(r.versions) == {version} for r in done)
            forced = trainer.compute_logprobs([TrainSample(PROMPT, r.token_ids, [0.0] * len(r.token_ids), 0.0)
                                               for r in done])
            for r, lp in zip(done, forced):
                assert np.abs(lp - np.array(r.logprobs)).max() <= 1e-3
    finally:
        role.release()
