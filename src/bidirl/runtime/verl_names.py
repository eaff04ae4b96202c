"""veRL's config names that bidirl accepts, and what each means here.

``bidirl train`` takes a veRL config (a YAML file, nested as veRL writes it, or
``key=value`` overrides) where the meaning is the same: :data:`VERL_ALIASES` renames a
veRL field to bidirl's, :data:`VERL_FIXED` accepts a veRL field whose value is what
bidirl always does, and any other field under a veRL-only root (:data:`VERL_ROOTS`) is an
error saying bidirl does not take it.  ``runtime/config.py:load_config`` applies them;
``bidirl train --help`` lists them.
"""

from __future__ import annotations

from typing import Any

VERL_ALIASES: tuple[tuple[str, str], ...] = (
    ("data.train_files", "data.files"),
    ("data.train_batch_size", "rollout.prompts_per_step"),
    ("data.max_response_length", "rollout.max_new_tokens"),
    ("custom_reward_function.path", "data.reward_fn"),
    ("custom_reward_function.name", "data.reward_fn_name"),
    ("actor_rollout_ref.model.path", "model.path"),
    ("actor_rollout_ref.model.lora_rank", "model.lora_rank"),
    ("actor_rollout_ref.model.lora_alpha", "model.lora_alpha"),
    ("actor_rollout_ref.model.target_modules", "model.lora_target_modules"),
    ("actor_rollout_ref.actor.optim.lr", "trainer.lr"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "trainer.lr_warmup_steps"),
    ("actor_rollout_ref.actor.optim.warmup_style", "trainer.lr_schedule"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "trainer.lr_schedule"),
    ("actor_rollout_ref.actor.optim.min_lr_ratio", "trainer.lr_min_ratio"),
    ("actor_rollout_ref.actor.optim.weight_decay", "trainer.weight_decay"),
    ("actor_rollout_ref.actor.optim.betas", "trainer.betas"),
    ("actor_rollout_ref.actor.grad_clip", "trainer.max_grad_norm"),
    ("actor_rollout_ref.actor.clip_ratio_low", "trainer.clip_eps_low"),
    ("actor_rollout_ref.actor.clip_ratio_high", "trainer.clip_eps_high"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "trainer.micro_batch_size"),
    ("actor_rollout_ref.actor.kl_loss_coef", "trainer.kl_coef"),
    ("actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_loss"),
    ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_loss_type"),
    ("actor_rollout_ref.actor.entropy_coeff", "algorithm.entropy_coeff"),
    ("actor_rollout_ref.actor.loss_agg_mode", "algorithm.loss_agg_mode"),
    ("actor_rollout_ref.actor.loss_scale_factor", "algorithm.loss_scale_factor"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "algorithm.policy_loss"),
    ("reward_model.overlong_buffer.enable", "algorithm.overlong_buffer.enable"),
    ("reward_model.overlong_buffer.len", "algorithm.overlong_buffer.len"),
    ("reward_model.overlong_buffer.penalty_factor", "algorithm.overlong_buffer.penalty_factor"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "algorithm.overlong_buffer.enable"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.len", "algorithm.overlong_buffer.len"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "algorithm.overlong_buffer.penalty_factor"),
    ("actor_rollout_ref.rollout.n", "rollout.group_size"),
    ("actor_rollout_ref.rollout.temperature", "rollout.temperature"),
    ("actor_rollout_ref.rollout.top_p", "rollout.top_p"),
    ("actor_rollout_ref.rollout.top_k", "rollout.top_k"),
    ("actor_rollout_ref.rollout.response_length", "rollout.max_new_tokens"),
    ("actor_rollout_ref.rollout.max_num_seqs", "rollout.max_num_seqs"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "rollout.tensor_parallel_size"),
    ("actor_rollout_ref.rollout.dtype", "model.dtype"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", "rollout.val_temperature"),
    ("trainer.total_training_steps", "run.steps"),
    ("trainer.test_freq", "run.val_every"),
    ("trainer.val_before_train", "run.val_before_train"),
    ("trainer.log_val_generations", "run.val_samples"),
    ("trainer.save_freq", "run.checkpoint_every"),
    ("trainer.max_actor_ckpt_to_keep", "run.keep_checkpoints"),
    ("trainer.project_name", "run.wandb_project"),
    ("trainer.experiment_name", "run.wandb_name"),
)
"""veRL's config names that mean what a bidirl field means: (veRL name, bidirl field).

Accepted in a YAML file (nested, as veRL writes them) and as ``key=value`` overrides;
``data.val_files``, ``data.val_max_samples``, ``data.max_prompt_length``,
``data.filter_overlong_prompts``, ``algorithm.adv_estimator``,
``algorithm.norm_adv_by_std_in_grpo``, ``algorithm.use_kl_in_reward``, ``algorithm.kl_penalty``,
``algorithm.kl_ctrl.type`` / ``kl_coef``, ``algorithm.rollout_correction.rollout_is`` /
``rollout_is_threshold`` and ``algorithm.filter_groups.enable`` / ``max_num_gen_batches`` are
bidirl's own names too.  Only names whose meaning is the same are
here: ``trainer.test_freq`` is veRL's steps between validations (``-1``, veRL's "off",
is read as 0, as is ``save_freq``'s and ``lr_warmup_steps``'s), ``warmup_style`` is veRL's
name for the schedule after warm-up.  Two names of one field may both be given if they
agree (a veRL file sets ``data.max_response_length`` and ``rollout.response_length``).
"""

_ALIAS = dict(VERL_ALIASES)

VERL_FIXED: dict[str, tuple[Any, ...]] = {
    "algorithm.gamma": (1.0,),
    "algorithm.lam": (1.0,),
    "reward_model.overlong_buffer.log": (True, False),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": (True, False),
    "reward_model.reward_manager": ("naive", "dapo"),
}
"""veRL fields naming what bidirl always does, with the values that mean it: accepted and
changing nothing (discount and GAE lambda
1: outcome rewards, every token its response's advantage; the overlong penalty is always
logged, as ``reward/extra/overlong_reward``; veRL's ``dapo`` reward manager is the one that
applies it, bidirl's store applies it whenever it is enabled); another value is an error
listing these."""


def leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; an empty mapping is a leaf."""
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += leaves(v, key + ".")
        else:
            out.append((key, v))
    return out


def canonical(key: str, value: Any) -> tuple[str, Any]:
    """A veRL alias mapped to bidirl's field (and veRL's ``-1`` for "off" where it has one)."""
    name = _ALIAS.get(key, key)
    if key in ("trainer.test_freq", "trainer.save_freq", "actor_rollout_ref.actor.optim.lr_warmup_steps") \
            and value == -1:
        value = 0
    return name, value


VERL_ROOTS = ("actor_rollout_ref", "custom_reward_function", "critic", "reward_model", "ray_init", "ray_kwargs")
"""Roots only veRL has: a field under one that is neither an alias nor fixed is refused by name
(``algorithm.*`` is bidirl's own section: an unknown field there is an unknown field)."""
