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
