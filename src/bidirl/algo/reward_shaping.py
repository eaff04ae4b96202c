"""Reward shaping applied where training rewards are scored (pure Python).

DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, section 3.4): a
response of ``length`` tokens under a cap of ``cap`` tokens, with a buffer of ``len``
tokens and a factor ``f``, gets::

    penalty = min(0, -(length - (cap - len)) / len * f)

0 up to ``cap - len`` tokens, falling linearly to ``-f`` at the cap (veRL's DAPO reward
manager, ``reward_model.overlong_buffer``).  ``runtime/group_store.py`` adds it to each
training reward that is a good number; validation scores stay unshaped.
"""

from __future__ import annotations


def overlong_penalty(length: int, cap: int, buffer_len: int, penalty_factor: float) -> float:
    """The (non-positive) penalty of a ``length``-token response under ``cap`` (see the module doc)."""
    if buffer_len < 1:
        raise ValueError(f"overlong buffer len must be >= 1, got {buffer_len}")
    exceed = length - (cap - buffer_len)
    return min(0.0, -exceed / buffer_len * penalty_factor)
