"""The trainer on image prompts (the tiny Idefics3 model, ``engines/vision_inputs.py``).

The Trainer-on-RollPool merge stays bitwise equal to one trainer with images: every trainer
builds the same pixels from the same bytes (the image processor is deterministic), so the
ordered fold of chunk gradients is the same float computation.  ``freeze_vision_tower``
keeps the tower out of the gradient and the optimizer, and still in every weight set and
directory written; what ``save_pretrained`` writes loads back with
``AutoModelForImageTextToText`` and ``AutoProcessor``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from bidirl.engines.train_batch import TrainSample, make_microbatches, step_totals  # noqa: E402
from bidirl.engines.trainer_config import TrainerConfig  # noqa: E402
from bidirl.engines.trainer_torch import TorchTrainer  # noqa: E402
from bidirl.engines.vision_inputs import vision_parameter_names  # noqa: E402

CFG = TrainerConfig(lr=1e-3, max_grad_norm=1.0, kl_coef=0.05)


@pytest.fixture(scope="module")
def samples(tiny_vl_dir) -> list[TrainSample]:
    """Seven image prompts of the shapes task and one text prompt, random responses of 1-9
    tokens, behaviour log-probs off the current policy."""
    from transformers import AutoProcessor

    from bidirl.algo.multimodal import encode_image_prompt, validate_image_row
    from bidirl.algo.tasks_visual import SHAPES

    proc = AutoProcessor.from_pretrained(str(tiny_vl_dir))
    rng = np.random.default_rng(5)
    raw = []
    for i, r in enumerate(SHAPES.rows(7, seed=2)):
        row = validate_image_row(r, "<shapes>", i)
        n = int(rng.integers(1, 10))
        raw.append(TrainSample(encode_image_prompt(proc, row).input_ids, list(rng.integers(7, 135, n)), [0.0] * n,
                               float(rng.normal()), images=row.images))
    raw.insert(3, TrainSample([1, 5, 40, 41, 6], [50, 51], [0.0, 0.0], 0.5))  # a text prompt among them
    base = TorchTrainer(tiny_vl_dir, TrainerConfig()).compute_logprobs(raw)
    return [TrainSample(s.prompt_ids, s.response_ids, list(lp + rng.normal(0, 0.3, lp.shape)), s.advantage,
                        images=s.images) for s, lp in zip(raw, base, strict=True)]


def _same(a: TorchTrainer, b: TorchTrainer) -> bool:
    return all(torch.equal(p, b.weights[n]) for n, p in a.weights.items())


def test_the_images_change_the_log_probs(tiny_vl_dir, samples):
    trainer = TorchTrainer(tiny_vl_dir, TrainerConfig())
    s = samples[0]
    swapped = TrainSample(s.prompt_ids, s.response_ids, s.behaviour_logprobs, s.advantage, images=samples[1].images)
    a, b = trainer.compute_logprobs([s, swapped])
    assert not np.array_equal(a, b), "the pixels reach the text model"


def test_chunks_merged_in_order_equal_one_trainer_bitwise_with_images(tiny_vl_dir, samples):
    mbs = make_microbatches(samples, 3)  # 3, 3, 2 samples; the text prompt in the second
    alone = TorchTrainer(tiny_vl_dir, CFG)
    m_alone = alone.train_step(mbs)
    primary, aux = (TorchTrainer(tiny_vl_dir, CFG) for _ in range(2))
    totals = step_totals(mbs)
    m_merged = primary.apply_grads([primary.compute_chunk_grads(mbs[:1], totals),
                                    aux.compute_chunk_grads(mbs[1:], totals)])
    assert _same(alone, primary)
    assert m_merged["loss"] == pytest.approx(m_alone["loss"], rel=1e-5, abs=1e-7)
    assert not _same(alone, TorchTrainer(tiny_vl_dir, CFG)), "the step must move the weights"
    tower = vision_parameter_names(alone.weights)
    assert tower and any(not torch.equal(alone.weights[n], primary.ref_model.state_dict()[n]) for n in tower), \
        "the vision tower is trained by default"


def test_a_frozen_vision_tower_is_not_trained_but_is_written(tiny_vl_dir, samples, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    trainer = TorchTrainer(tiny_vl_dir, TrainerConfig(lr=1e-2), freeze_vision_tower=True)
    before = {n: p.detach().clone() for n, p in trainer.weights.items()}
    tower = vision_parameter_names(trainer.weights)
    assert tower and not set(tower) & set(trainer.params)
    optimised = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not any(id(trainer.weights[n]) in optimised for n in tower)
    trainer.train_step(make_microbatches(samples, 4))
    assert all(torch.equal(trainer.weights[n], before[n]) for n in tower)
    assert not torch.equal(trainer.weights["lm_head.weight"], before["lm_head.weight"])
    assert set(trainer.get_weights_numpy()) == set(trainer.weights)
    out = trainer.save_pretrained(tmp_path / "export")
    back = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32)
    state = back.state_dict()
    assert all(torch.equal(state[n], trainer.weights[n]) for n in trainer.weights)
    AutoProcessor.from_pretrained(str(out))  # the processor files come along
