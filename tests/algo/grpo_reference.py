"""bidirl's GRPO loss as it was before the algorithm registry (issue 41), frozen as the
reference the default objective must equal bit for bit (``test_algorithms.py``).  Test-only:
the trainer uses ``bidirl.algo.objective.policy_objective``."""

from __future__ import annotations

from typing import NamedTuple

import torch


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
