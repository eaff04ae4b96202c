"""Advantage estimators: one scalar per response from its group's rewards (pure torch, float64).

A step's rewards arrive as ragged lists ``rewards[p][g]`` (prompt p, response g) with the
responses' token counts ``lengths[p][g]``; every estimator returns the same shape, each
value rounded to float32 as the trainer reads it.  With outcome rewards (one scalar per
response, discount 1) every token of a response shares its advantage, so one number per
response is exact.  Notation: ``n`` responses in a group, ``mean_g`` / ``std_g`` the
group's mean and Bessel-corrected std, ``eps = 1e-6``::

    grpo                          A = (r - mean_g) / (std_g + eps)      (Shao et al. 2024, DeepSeekMath)
    grpo, no std (Dr.GRPO)        A =  r - mean_g                       (Liu et al. 2025, arXiv:2503.20783)
    rloo                          A =  r - mean of the other n - 1 rewards = n / (n - 1) * (r - mean_g)
                                                                        (Ahmadian et al. 2024, arXiv:2402.14740)
    reinforce_plus_plus           A = whiten(r)                          (Hu 2025, arXiv:2501.03262)
    reinforce_plus_plus_baseline  A = whiten(r - mean_g)                 (the same paper)

``whiten`` is over every response *token* of the step, as veRL's ``masked_whiten``: a
response of ``L`` tokens counts ``L`` times in ``mu = sum L x / N`` and in the variance
``var = sum L (x - mu)^2 / (N - 1)`` (``N`` the step's response tokens), and
``A = (x - mu) / sqrt(var + 1e-8)``.  The step is the batch the trainer updates on, so
this is a function of the whole step, computed once, before the micro-batches are cut.

A group whose rewards are all equal has no signal: its group-relative advantages are 0
exactly (equal rewards are compared, not subtracted, so rounding cannot leak in); a group
of one response has none either (no baseline).  REINFORCE++ without a baseline gives such
groups the step-whitened reward, as the paper does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.algo.grpo import group_advantages_lists
from bidirl.algo.registry import choose

Ragged = Sequence[Sequence[float]]

WHITEN_EPS = 1e-8


def _group_centred(group: Sequence[float]) -> torch.Tensor:
    """r - mean_g in float64, exactly 0 for a flat group or a group of one."""
    r = torch.tensor(list(group), dtype=torch.float64)
    if r.numel() < 2 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    return r - r.mean()


def _check_finite(rewards: Ragged) -> None:
    for p, group in enumerate(rewards):
        for g, x in enumerate(group):
            if not torch.isfinite(torch.tensor(float(x))):
                raise ValueError(f"advantages: non-finite reward {x!r} at (prompt, response) ({p}, {g}); "
                                 "rewards must be finite numbers (the runtime checks them in GroupStore.score)")


def _float32_lists(values: Sequence[torch.Tensor]) -> list[list[float]]:
    return [v.to(torch.float32).tolist() for v in values]


def grpo(rewards: Ragged, lengths: Ragged, cfg: AlgorithmConfig) -> list[list[float]]:
    """GRPO's group-normalised advantages; without the std (Dr.GRPO) when
    ``norm_adv_by_std_in_grpo`` is false (``grpo.group_advantages``, bit for bit)."""
    return group_advantages_lists([list(g) for g in rewards], scale_by_std=cfg.norm_adv_by_std_in_grpo)


def rloo(rewards: Ragged, lengths: Ragged, cfg: AlgorithmConfig) -> list[list[float]]:
    """REINFORCE leave-one-out: each reward minus the mean of the group's others."""
    _check_finite(rewards)
    out = []
    for group in rewards:
        n = len(group)
        out.append(_group_centred(group) * (n / (n - 1)) if n > 1 else torch.zeros(n, dtype=torch.float64))
    return _float32_lists(out)


def whiten_tokens(values: Sequence[torch.Tensor], lengths: Ragged) -> list[torch.Tensor]:
    """Each response's value whitened over the step's response tokens (see the module doc)."""
    x = torch.cat([v.reshape(-1) for v in values]) if values else torch.zeros(0, dtype=torch.float64)
    w = torch.tensor([float(n) for group in lengths for n in group], dtype=torch.float64)
    if w.numel() != x.numel():
        raise ValueError(f"advantages: {x.numel()} rewards but {w.numel()} response lengths")
    n_tokens = float(w.sum())
    if n_tokens <= 0:
        return [torch.zeros_like(v) for v in values]
    mu = (w * x).sum() / n_tokens
    var = (w * (x - mu).square()).sum() / (n_tokens - 1) if n_tokens > 1 else torch.zeros((), dtype=x.dtype)
    z = (x - mu) / torch.sqrt(var + WHITEN_EPS)
    return list(torch.split(z, [v.numel() for v in values]))


def reinforce_plus_plus(rewards: Ragged, lengths: Ragged, cfg: AlgorithmConfig) -> list[list[float]]:
    """REINFORCE++: the rewards whitened over the step's tokens (no group baseline)."""
    _check_finite(rewards)
    return _float32_lists(whiten_tokens([torch.tensor(list(g), dtype=torch.float64) for g in rewards], lengths))


def reinforce_plus_plus_baseline(rewards: Ragged, lengths: Ragged, cfg: AlgorithmConfig) -> list[list[float]]:
    """REINFORCE++-baseline: the group-centred rewards whitened over the step's tokens."""
    _check_finite(rewards)
    return _float32_lists(whiten_tokens([_group_centred(g) for g in rewards], lengths))


ESTIMATORS: dict[str, Callable[[Ragged, Ragged, AlgorithmConfig], list[list[float]]]] = {
    "grpo": grpo, "rloo": rloo, "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
}


def step_advantages(rewards: Ragged, lengths: Ragged, cfg: AlgorithmConfig | None = None) -> list[list[float]]:
    """The advantages of a step's groups by ``cfg.adv_estimator`` (default: bidirl's GRPO)."""
    cfg = cfg or AlgorithmConfig()
    if len(rewards) != len(lengths) or any(len(r) != len(n) for r, n in zip(rewards, lengths)):
        raise ValueError("advantages: rewards and response lengths must have the same shape")
    return choose("adv_estimator", cfg.adv_estimator, ESTIMATORS)(rewards, lengths, cfg)
