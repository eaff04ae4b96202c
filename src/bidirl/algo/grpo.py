"""GRPO: group-normalised advantages and the clipped, token-level policy loss (pure torch).

Notation: P prompts, G responses per prompt, B sequences in a micro-batch, T token positions.

Advantages (one scalar per response, broadcast over its tokens)::

    A[p, g] = (r[p, g] - mean_g r[p, :]) / (std_g r[p, :] + eps)     scale_by_std=True
    A[p, g] =  r[p, g] - mean_g r[p, :]                               scale_by_std=False

``std`` is the Bessel-corrected sample std (as torch.std, veRL and TRL use); a group of one
response has advantage 0. A group whose rewards are all equal has advantage 0 either way.
A non-finite reward is refused (``ValueError``): it would make its whole group NaN.

Per-token loss for a response token t of sequence b, with current log-prob ``logp``,
behaviour log-prob ``old`` (from the engine that sampled it) and reference ``ref``::

    ratio   = exp(logp - old)
    pg      = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    k3      = exp(ref - logp) - (ref - logp) - 1          (Schulman's k3 KL estimator, >= 0)
    loss_t  = pg + kl_coef * k3

Token-level aggregation over the *whole* training batch (all micro-batches, all data-parallel
ranks, all gradient chunks)::

    L = sum_{b, t in response} loss_t / N          N = total response tokens of the batch

Why N is passed in rather than computed per micro-batch: each micro-batch's loss is
``sum(loss_t over its tokens) / N``; summing the gradients of the micro-batch losses therefore
gives exactly the gradient of L, whatever the micro-batch split, the number of DP ranks
(all-reduce with SUM) or which device computed which gradient chunk. A per-micro-batch mean
would weight tokens of short micro-batches more and break that equivalence.

Metrics are returned in the same "token sum / N" form, so adding them over micro-batches gives
batch means. docs/algorithm.md states the same formulas with the execution rules around them
(DP all-reduce, ordered chunk merge, versions).
"""

from __future__ import annotations

from typing import NamedTuple

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


class GRPOLoss(NamedTuple):
    loss: torch.Tensor
    """Scalar to call backward on: sum of token losses / total_tokens."""
    metrics: dict[str, torch.Tensor]
    """Detached scalars in "token sum / total_tokens" form (add over micro-batches)."""


def grpo_loss(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    adv_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    total_tokens: int | float,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    ref_logp_B_T: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> GRPOLoss:
    """Clipped GRPO loss of one micro-batch, normalised by the *batch* token count.

    ``mask_B_T`` is 1 on response tokens that count (padding and prompt positions are 0).
    ``total_tokens`` is the number of masked tokens in the full batch (see module doc).
    """
    if total_tokens <= 0:
        raise ValueError(f"total_tokens must be > 0, got {total_tokens}")
    if kl_coef and ref_logp_B_T is None:
        raise ValueError("kl_coef > 0 needs ref_logp_B_T")
    mask_B_T = mask_B_T.to(logp_B_T.dtype)
    adv_B_1 = adv_B.to(logp_B_T.dtype).unsqueeze(-1)
    on_B_T = mask_B_T > 0
    # where, not multiply: padding may hold -inf log-probs and -inf * 0 is NaN
    log_ratio_B_T = torch.where(on_B_T, logp_B_T - old_logp_B_T, 0.0)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = ratio_B_T * adv_B_1
    clipped_B_T = torch.clamp(ratio_B_T, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv_B_1
    pg_B_T = -torch.minimum(unclipped_B_T, clipped_B_T)
    loss_B_T = pg_B_T
    metrics: dict[str, torch.Tensor] = {}
    if ref_logp_B_T is not None:
        delta_B_T = torch.where(on_B_T, ref_logp_B_T - logp_B_T, 0.0)
        k3_B_T = torch.exp(delta_B_T) - delta_B_T - 1.0
        if kl_coef:
            loss_B_T = loss_B_T + kl_coef * k3_B_T
        metrics["kl_ref"] = (k3_B_T * mask_B_T).sum().detach() / total_tokens
    loss = torch.where(on_B_T, loss_B_T * mask_B_T, 0.0).sum() / total_tokens
    with torch.no_grad():
        was_clipped_B_T = (clipped_B_T < unclipped_B_T).to(mask_B_T.dtype)
        metrics["pg_loss"] = (pg_B_T * mask_B_T).sum() / total_tokens
        metrics["clip_frac"] = (was_clipped_B_T * mask_B_T).sum() / total_tokens
        behaviour_k3_B_T = torch.exp(-log_ratio_B_T) + log_ratio_B_T - 1.0
        metrics["kl_behaviour"] = (behaviour_k3_B_T * mask_B_T).sum() / total_tokens
        metrics["tokens"] = mask_B_T.sum() / total_tokens
    return GRPOLoss(loss, metrics)
