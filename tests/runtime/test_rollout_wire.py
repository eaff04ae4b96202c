"""A replica is built from the run's config through one function, ``rollout_wire``."""

from __future__ import annotations

import inspect

from bidirl.runtime.config import load_config
from bidirl.runtime.messages import rollout_wire
from bidirl.runtime.rollout_role import RolloutRole


def test_the_wire_carries_the_configs_rollout_fields_as_rollout_role_arguments():
    cfg = load_config(None, ["rollout.max_num_seqs=7", "rollout.kv_cache_mb=64", "rollout.top_p=0.9",
                             "rollout.top_k=5", "rollout.min_new_tokens=3", "scheduler.reproducible=true",
                             "model.dtype=bfloat16"])
    wire = rollout_wire(cfg, "/models/m", max_model_len=300)
    assert wire == {"model_dir": "/models/m", "max_num_seqs": 7, "max_model_len": 300, "dtype": "bfloat16",
                    "kv_cache_bytes": 64 << 20, "top_p": 0.9, "top_k": 5, "min_tokens": 3,
                    "reproducible": True}
    inspect.signature(RolloutRole).bind(**wire)  # every key is one of the role's arguments


def test_an_image_run_sends_its_image_limit_and_the_frozen_tower():
    from bidirl.engines.trainer_config import from_wire
    from bidirl.runtime.launch import worker_settings

    cfg = load_config(None, ["model.kind=vl", "model.freeze_vision_tower=true"])
    rollout, trainer = worker_settings(cfg, "/models/vl", 90, max_images=2)
    assert rollout["max_images"] == 2 and rollout["max_model_len"] == 90
    inspect.signature(RolloutRole).bind(**rollout)
    assert trainer["freeze_vision_tower"] is True
    from_wire(trainer)  # a known key
    text_rollout, text_trainer = worker_settings(load_config(None, []), "/models/m", 90)
    assert "max_images" not in text_rollout and "freeze_vision_tower" not in text_trainer
