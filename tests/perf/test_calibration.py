import random
import statistics

import pytest

from bidirl.perf.calibration import LinearTimeModel
from bidirl.perf.profiles import HARDWARE, MODELS
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel


def _late_error(model: LinearTimeModel, n: int = 50) -> float:
    return statistics.median(list(model.errors)[-n:])


def test_decode_model_calibrates_from_a_pessimistic_prior():
    hw, m = HARDWARE["H100-80GB"], MODELS["Qwen3-8B"]
    truth = RolloutStageModel(hw, m, 1)
    belief = RolloutStageModel(hw, m, 1, prior_scale=1.5)
    rng = random.Random(0)
    first = None
    for _ in range(300):
        b = rng.randint(1, 256)
        ctx = b * rng.uniform(300, 6000)
        measured = truth.decode_step_s(b, ctx) * rng.lognormvariate(0, 0.03)
        err = belief.decode.observe((1.0, b, ctx), measured)
        first = err if first is None else first
    assert first > 0.3  # the prior really was off
    assert _late_error(belief.decode) < 0.05


def test_train_model_calibrates():
    hw, m = HARDWARE["A6000-48GB"], MODELS["Qwen3-4B"]
    truth, belief = TrainStageModel(hw, m), TrainStageModel(hw, m, prior_scale=1.5)
    rng = random.Random(1)
    for _ in range(200):
        tok = rng.randint(2000, 32000)
        seq = rng.uniform(500, 8000)
        belief.micro.observe((1.0, tok, tok * seq), truth.microbatch_s(tok, seq) * rng.lognormvariate(0, 0.03))
    assert _late_error(belief.micro) < 0.05


def test_calibration_rejects_unphysical_prior():
    with pytest.raises(ValueError):
        LinearTimeModel("x", (-1.0, 1.0))

