"""GRPO's group-normalised advantages and the token log-probs every loss starts from (pure torch).

Notation: P prompts, G responses per prompt, B sequences in a micro-batch, T token positions.

Advantages (one scalar per response, broadcast over its tokens)::

    A[p, g] = (r[p, g] - mean_g r[p, :]) / (std_g r[p, :] + eps)     scale_by_std=True
    A[p, g] =  r[p, g] - mean_g r[p, :]                               scale_by_std=False

``std`` is the Bessel-corrected sample std (as torch.std, veRL and TRL use); a group of one
response has advantage 0. A group whose rewards are all equal has advantage 0 either way.
A non-finite reward is refused (``ValueError``): it would make its whole group NaN.

This is the ``grpo`` estimator of ``advantages.py`` (which holds the others); the loss the
trainer optimises is ``objective.py``'s, aggregated over the whole step by
``aggregation.py``.  docs/algorithm.md states the formulas with the execution rules around
them (DP all-reduce, ordered chunk merge, versions).
"""

from __future__ import annotations

import torch


def group_advantages(
    rewards_P_G: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True
) -> torch.Tensor:
    """Group-normalised advantages ``A[p, g]`` from rewards ``r[p, g]`` (see module doc)."""
    if rewards_P_G.dim() != 2:
        raise ValueError(f"rewards_P_G must be 2-D (prompts x group), got shape {tuple(rewards_P_G.shape)}")
    # float64 so the mean of equal rewards is exactly that reward: a group with no signal must
    # get advantage 0, not rounding noise divided by (0 + eps).
    rewards_P_G = rewards_P_G.to(torch.float64)
    if not bool(torch.isfinite(rewards_P_G).all()):  # one NaN would make its whole group's advantages NaN
        bad = [tuple(ix) for ix in (~torch.isfinite(rewards_P_G)).nonzero().tolist()][:3]
        raise ValueError(f"group_advantages: non-finite reward(s) at (prompt, response) {bad}; "
                         "rewards must be finite numbers (the runtime checks them in GroupStore.score)")
    if rewards_P_G.shape[1] < 2:
        return torch.zeros_like(rewards_P_G, dtype=torch.float32)
    centred_P_G = rewards_P_G - rewards_P_G.mean(dim=1, keepdim=True)
    flat_P_1 = (rewards_P_G.amax(dim=1, keepdim=True) == rewards_P_G.amin(dim=1, keepdim=True))
    centred_P_G = centred_P_G.masked_fill(flat_P_1, 0.0)
    if not scale_by_std:
        return centred_P_G.to(torch.float32)
    std_P_1 = rewards_P_G.std(dim=1, keepdim=True, correction=1)
    return (centred_P_G / (std_P_1 + eps).masked_fill(flat_P_1, 1.0)).to(torch.float32)


def group_advantages_lists(
    rewards: list[list[float]], eps: float = 1e-6, scale_by_std: bool = True
) -> list[list[float]]:
    """Same as :func:`group_advantages` for ragged groups (groups may differ in size)."""
    out = []
    for group in rewards:
        r_1_G = torch.tensor([list(group)], dtype=torch.float32)
        out.append(group_advantages(r_1_G, eps, scale_by_std)[0].tolist())
    return out


def token_logprobs(logits_B_T_V: torch.Tensor, targets_B_T: torch.Tensor) -> torch.Tensor:
    """log p(target) under softmax(logits), in fp32, without materialising a full log_softmax.

    ``logits[:, t]`` must already be the prediction *for* ``targets[:, t]`` (shifted by the
    caller).
    """
    logits_B_T_V = logits_B_T_V.float()
    picked_B_T = logits_B_T_V.gather(-1, targets_B_T.unsqueeze(-1)).squeeze(-1)
    return picked_B_T - torch.logsumexp(logits_B_T_V, dim=-1)
