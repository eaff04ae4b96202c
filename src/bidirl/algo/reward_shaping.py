"""Reward shaping applied where training rewards are scored (pure Python).

DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, section 3.4): a
response of ``length`` tokens under a cap of ``cap`` tokens, with a buffer of ``len``
tokens and a factor ``f``, gets::

    penalty = min(0, -(length - (cap - len)) / len * f)

0 up to ``cap - len`` tokens, falling linearly to ``-f`` at the cap (veRL's DAPO reward
manager, ``reward_model.overlong_buffer``).  ``runtime/group_store.py`` adds it to each
training reward that is a good number; validation scores stay unshaped.  The KL penalty
(``kl_penalised``) is applied by the train driver when it lays a step out, because it needs
the reference model's log-probs of the step's responses.
"""

from __future__ import annotations


def overlong_penalty(length: int, cap: int, buffer_len: int, penalty_factor: float) -> float:
    """The (non-positive) penalty of a ``length``-token response under ``cap`` (see the module doc)."""
    if buffer_len < 1:
        raise ValueError(f"overlong buffer len must be >= 1, got {buffer_len}")
    exceed = length - (cap - buffer_len)
    return min(0.0, -exceed / buffer_len * penalty_factor)


def kl_penalised(rewards: list[list[float]], kl_sums: list[list[float]], kl_coef: float) -> list[list[float]]:
    """KL in the reward (veRL's ``apply_kl_penalty`` with outcome advantages): each training
    reward minus ``kl_coef`` times its response's per-token KL summed over the response,
    ``r - beta * sum_t kl_t`` (Ouyang et al. 2022, InstructGPT, eq. 2; Ziegler et al. 2019).

    veRL puts ``-beta * kl_t`` on every token and the score on the last; an outcome estimator
    (grpo, rloo, reinforce_plus_plus_baseline) sums a response's token rewards, which is this.
    """
    if len(rewards) != len(kl_sums) or any(len(r) != len(k) for r, k in zip(rewards, kl_sums)):
        raise ValueError("kl_penalised: rewards and KL sums must have the same shape")
    return [[r - kl_coef * k for r, k in zip(rs, ks)] for rs, ks in zip(rewards, kl_sums)]
