"""Torch-side execution: the trainer (``trainer_torch``) and the HF reference scorer.

The rollout engine is :class:`bidirl.runtime.rollout_role.RolloutRole`.
"""
