"""The loss one micro-batch contributes to a training step: policy term, KL, entropy, weights.

For response token t of sequence b, with ``logp`` the log-prob under the weights the
gradient is taken at, ``behaviour`` the log-prob the rollout engine sampled it with,
``ref`` the reference (initial) policy's and ``A[b]`` the sequence's advantage::

    anchor  = behaviour                               rollout_is null (default)
            = sg(logp)  (the proximal policy)         rollout_is token | sequence
    pg      = policy_loss(logp - anchor, A)           vanilla: clipped token ratio; gspo: clipped sequence ratio
    pg     *= min(pi_prox / pi_behaviour, cap)        rollout_is token | sequence (TIS; no gradient)
    loss_t  = pg + kl_coef * KL(logp, ref) - entropy_coeff * H
    L       = aggregate(loss_t)                       over the whole step (aggregation.py)

Off-policy correction in the decoupled form of AReaL (Fu et al. 2025) and veRL's rollout
correction: the clip is measured against a *proximal* policy, the weights before this
optimizer step, and the gap between that and the policy that sampled the token is
corrected by a truncated importance weight.  bidirl takes one optimizer step per batch,
so the proximal policy is the very weights the gradient is taken at: ``logp - sg(logp)``
is 0 with ``logp``'s gradient, the ratio is 1 and never clipped, and the correction is the
weight alone, ``-w * A * grad logp`` (truncated importance-sampled policy gradient).
Without it (the default), the ratio is taken against the behaviour log-probs (veRL's
"bypass" mode), so a stale token far from the current policy is clipped away.

Metrics, in "sum over the step's totals" form so that they add over micro-batches,
chunks and ranks (``*_max`` merge by max): ``pg_loss`` (aggregated like the loss),
``clip_frac``, ``kl_ref`` (the chosen estimator's token mean, when a reference is
given), ``kl_behaviour`` (k3 of behaviour vs current), ``entropy``, ``tokens``, and the
importance ratio pi_current / pi_behaviour's spread whether or not it is used:
``rollout_is_mean``, ``rollout_is_max`` and ``rollout_is_fraction_high`` (the share of
tokens whose ratio is over ``rollout_is_threshold``), per token or per sequence as set.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bidirl.algo.aggregation import StepTotals, aggregate
from bidirl.algo.policy_loss import KL_PENALTIES, POLICY_LOSSES, behaviour_log_ratio, truncated_is_weights
from bidirl.algo.registry import choose


class LossSettings(NamedTuple):
    """What the objective needs of the trainer's and the algorithm's config (defaults: bidirl's GRPO)."""

    policy_loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_loss_type: str = "k3"
    entropy_coeff: float = 0.0
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0


class Objective(NamedTuple):
    loss: torch.Tensor
    """Scalar to call backward on: this micro-batch's share of the step's loss."""
    metrics: dict[str, torch.Tensor]
    """Detached scalars over the step's totals (add over micro-batches; ``*_max``: max)."""


def policy_objective(logp_B_T: torch.Tensor, behaviour_logp_B_T: torch.Tensor, adv_B: torch.Tensor,
                     mask_B_T: torch.Tensor, totals: StepTotals, settings: LossSettings | None = None,
                     ref_logp_B_T: torch.Tensor | None = None,
                     entropy_B_T: torch.Tensor | None = None) -> Objective:
    """This micro-batch's loss and metrics (see the module doc).

    ``mask_B_T`` is 1 on response tokens that count (prompt and padding positions 0);
    ``totals`` the whole step's counts; ``entropy_B_T`` must carry a gradient when
    ``entropy_coeff`` > 0.
    """
    s = settings or LossSettings()
    if totals.tokens <= 0:
        raise ValueError(f"total_tokens must be > 0, got {totals.tokens}")
    if s.kl_coef and ref_logp_B_T is None:
        raise ValueError("kl_coef > 0 needs ref_logp_B_T")
    if s.entropy_coeff and entropy_B_T is None:
        raise ValueError("entropy_coeff > 0 needs entropy_B_T")
    pg_fn = choose("policy_loss", s.policy_loss, POLICY_LOSSES)
    mask_B_T = mask_B_T.to(logp_B_T.dtype)
    adv_B_1 = adv_B.to(logp_B_T.dtype).unsqueeze(-1)
    on_B_T = mask_B_T > 0
    # where, not multiply: padding may hold -inf log-probs and -inf * 0 is NaN
    log_ratio_B_T = torch.where(on_B_T, logp_B_T - behaviour_logp_B_T, 0.0)
    if s.rollout_is is None:
        anchored_B_T = log_ratio_B_T
    else:
        anchored_B_T = torch.where(on_B_T, logp_B_T - logp_B_T.detach(), 0.0)
    pg_B_T, was_clipped_B_T = pg_fn(anchored_B_T, adv_B_1, mask_B_T, s.clip_eps_low, s.clip_eps_high)
    if s.rollout_is is not None:
        pg_B_T = pg_B_T * truncated_is_weights(log_ratio_B_T, mask_B_T, s.rollout_is, s.rollout_is_threshold)
    loss_B_T = pg_B_T
    metrics: dict[str, torch.Tensor] = {}
    if ref_logp_B_T is not None:
        kl_B_T = choose("kl_loss_type", s.kl_loss_type, KL_PENALTIES)(logp_B_T, ref_logp_B_T, on_B_T)
        if s.kl_coef:
            loss_B_T = loss_B_T + s.kl_coef * kl_B_T
        metrics["kl_ref"] = (kl_B_T * mask_B_T).sum().detach() / totals.tokens
    if s.entropy_coeff:
        loss_B_T = loss_B_T - s.entropy_coeff * entropy_B_T
    loss = aggregate(loss_B_T, mask_B_T, s.loss_agg_mode, totals, s.loss_scale_factor)
    with torch.no_grad():
        n = totals.tokens
        metrics["pg_loss"] = aggregate(pg_B_T, mask_B_T, s.loss_agg_mode, totals, s.loss_scale_factor)
        metrics["clip_frac"] = (was_clipped_B_T * mask_B_T).sum() / n
        behaviour_k3_B_T = torch.exp(-log_ratio_B_T) + log_ratio_B_T - 1.0
        metrics["kl_behaviour"] = (behaviour_k3_B_T * mask_B_T).sum() / n
        metrics["tokens"] = mask_B_T.sum() / n
        if entropy_B_T is not None:
            metrics["entropy"] = (entropy_B_T.detach() * mask_B_T).sum() / n
        ratio_B_T = torch.exp(behaviour_log_ratio(log_ratio_B_T.detach(), mask_B_T, s.rollout_is or "token"))
        metrics["rollout_is_mean"] = (ratio_B_T * mask_B_T).sum() / n
        metrics["rollout_is_max"] = torch.where(on_B_T, ratio_B_T, 0.0).amax()
        metrics["rollout_is_fraction_high"] = ((ratio_B_T > s.rollout_is_threshold).to(mask_B_T.dtype)
                                               * mask_B_T).sum() / n
    return Objective(loss, metrics)
