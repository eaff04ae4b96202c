"""Which fields a resume may change is declared beside each field (``resume_safe=True`` in
``runtime/config.py``); the set is the one ``train.RESUME_SAFE`` listed before it moved there."""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.core.typed_config import describe, flagged, flagged_names, option, section
from bidirl.runtime.config import TrainConfig, resume_safe, resume_safe_names

# The list as it stood in runtime/train.py (a name ending in "." is its whole section), and
# its rule: a field is safe when its name starts with one of these, run.run_dir never.
RESUME_SAFE_BEFORE = (
    "run.steps", "run.checkpoint_every", "run.keep_checkpoints", "run.tensorboard", "run.plot",
    "scheduler.policy", "cluster.", "rollout.max_num_seqs", "rollout.kv_cache_mb", "trainer.",
    "data.on_bad_reward", "data.reward_timeout_s",  # the reward guard's timeout, added with the field
    "run.val_every", "run.val_before_train", "run.val_samples", "run.train_samples_every",
    "run.train_samples", "run.wandb", "run.wandb_project", "run.wandb_name", "run.worker_log_level",
    "data.val_files", "data.val_max_samples", "rollout.val_temperature",
    "algorithm.filter_groups.max_num_gen_batches",  # when dynamic sampling gives up, added with the field
    "rollout.weight_sync", "rollout.weight_sync_delta")  # how weights travel, not which: added with the fields


def test_the_resume_safe_fields_are_the_ones_listed_before():
    fields = [name for name, *_ in describe(TrainConfig)]
    before = {k for k in fields if k.startswith(RESUME_SAFE_BEFORE) and k != "run.run_dir"}
    assert {k for k in fields if resume_safe(k)} == before
    # 53: rollout.weight_sync(_delta), trainer.strategy, .mixed_precision, .activation_checkpointing and
    # cluster.device_memory_gib joined
    assert len(before) == 53 and "trainer.lr" in before and "cluster.ray_address" in before
    for refused in ("run.run_dir", "run.seed", "data.seed", "rollout.group_size", "scheduler.staleness", "model.path",
                    "algorithm.adv_estimator", "algorithm.loss_agg_mode", "algorithm.rollout_correction.rollout_is",
                    "algorithm.overlong_buffer.enable", "algorithm.filter_groups.enable"):  # what the run optimises
        assert not resume_safe(refused), refused


def test_the_error_message_names_whole_sections_with_a_star():
    names = resume_safe_names()
    assert "trainer.*" in names and "cluster.*" in names and "run.steps" in names
    assert not any(n.startswith(("trainer.", "cluster.")) and not n.endswith("*") for n in names)
    assert set(names) == {k + "*" if k.endswith(".") else k for k in RESUME_SAFE_BEFORE}


@dataclass
class Inner:
    a: int = option(1, "a", resume_safe=True)
    b: int = option(2, "b")


@dataclass
class Outer:
    inner: Inner = section(Inner, "inner")
    whole: Inner = section(Inner, "all of it", resume_safe=True)


def test_a_flag_is_read_from_the_field_or_a_section_above_it():
    assert flagged(Outer, "inner.a", "resume_safe") and not flagged(Outer, "inner.b", "resume_safe")
    assert flagged(Outer, "whole.b", "resume_safe") and flagged(Outer, "whole", "resume_safe")
    assert not flagged(Outer, "nowhere.a", "resume_safe") and not flagged(Outer, "inner.a.deeper", "other")
    assert list(flagged_names(Outer, "resume_safe")) == ["inner.a", "whole."]
