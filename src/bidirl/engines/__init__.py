"""Torch-side execution: the trainer (``trainer_torch``, its configuration and batches), the
process's torch settings (``torch_setup``), model directories on disk (``hf_io``) and the HF
reference scorer.

The rollout engine is :class:`bidirl.runtime.rollout_role.RolloutRole`.
"""
