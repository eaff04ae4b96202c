"""Per-token policy-loss terms: the clipped ratio (token or sequence level), KL estimators,
truncated importance weights and entropy (pure torch; each returns a ``[B, T]`` matrix
that ``aggregation.aggregate`` turns into the step's loss).

Notation: ``log_ratio[b, t] = logp - anchor`` of response token t of sequence b, where
``logp`` carries the gradient and ``anchor`` is the policy the clip is measured against
(the behaviour log-probs, or the proximal policy under off-policy correction: see
``objective.py``); ``A[b]`` the sequence's advantage; ``eps_low`` / ``eps_high`` the clip
range; padding positions hold ``log_ratio = 0``.
"""

from __future__ import annotations

import torch

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before exp in the importance weights (as veRL), so a
stale token cannot overflow them; the clipped loss itself is left unclamped, as it always was."""


def vanilla_pg(log_ratio_B_T: torch.Tensor, adv_B_1: torch.Tensor, mask_B_T: torch.Tensor,
               eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped token loss, as GRPO and DAPO use it: ``(pg, clipped)`` with::

        ratio = exp(log_ratio)
        pg    = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)

    and ``clipped`` 1.0 where the clipped term was taken (for ``clip_frac``).
    """
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = ratio_B_T * adv_B_1
    clipped_B_T = torch.clamp(ratio_B_T, 1.0 - eps_low, 1.0 + eps_high) * adv_B_1
    pg_B_T = -torch.minimum(unclipped_B_T, clipped_B_T)
    return pg_B_T, (clipped_B_T < unclipped_B_T).to(mask_B_T.dtype)


def gspo_pg(log_ratio_B_T: torch.Tensor, adv_B_1: torch.Tensor, mask_B_T: torch.Tensor,
            eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): the clipped loss on the sequence ratio::

        s[b]    = exp(mean_t log_ratio[b, t])                      (geometric mean of the token ratios)
        s[b, t] = sg(s[b]) * exp(log_ratio[b, t] - sg(log_ratio[b, t]))   (value s[b]; GSPO-token's gradient)
        pg      = -min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A)

    ``log s`` is clamped at 10 (as veRL).  Every token of a sequence shares its ratio, so
    the sequence is clipped as a whole; GSPO's clip range is far narrower than PPO's (the
    paper: 3e-4 / 4e-4).
    """
    n_B = mask_B_T.sum(dim=-1).clamp(min=1.0)
    seq_log_ratio_B = (log_ratio_B_T * mask_B_T).sum(dim=-1) / n_B
    log_s_B_T = log_ratio_B_T - log_ratio_B_T.detach() + seq_log_ratio_B.detach().unsqueeze(-1)
    return vanilla_pg(torch.clamp(log_s_B_T, max=10.0), adv_B_1, mask_B_T, eps_low, eps_high)


POLICY_LOSSES = {"vanilla": vanilla_pg, "gspo": gspo_pg}


def kl_k1(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, on_B_T: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref (unbiased, can be negative)."""
    return torch.where(on_B_T, logp_B_T - ref_logp_B_T, 0.0)


def kl_k2(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, on_B_T: torch.Tensor) -> torch.Tensor:
    """k2 = (logp - ref)^2 / 2."""
    return 0.5 * torch.where(on_B_T, logp_B_T - ref_logp_B_T, 0.0).square()


def kl_k3(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, on_B_T: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0, unclamped: bidirl's KL as it always was)."""
    delta_B_T = torch.where(on_B_T, ref_logp_B_T - logp_B_T, 0.0)
    return torch.exp(delta_B_T) - delta_B_T - 1.0


def kl_low_var(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, on_B_T: torch.Tensor) -> torch.Tensor:
    """veRL's ``low_var_kl`` (its ``k3``): k3 with ``ref - logp`` clamped to [-20, 20] and the
    result to [-10, 10]."""
    delta_B_T = torch.clamp(torch.where(on_B_T, ref_logp_B_T - logp_B_T, 0.0), -SAFETY_BOUND, SAFETY_BOUND)
    return torch.clamp(torch.exp(delta_B_T) - delta_B_T - 1.0, -10.0, 10.0)


def kl_abs(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, on_B_T: torch.Tensor) -> torch.Tensor:
    """|logp - ref|."""
    return torch.where(on_B_T, logp_B_T - ref_logp_B_T, 0.0).abs()


KL_PENALTIES = {"k3": kl_k3, "low_var_kl": kl_low_var, "k1": kl_k1, "kl": kl_k1, "k2": kl_k2, "mse": kl_k2,
                "abs": kl_abs}


def behaviour_log_ratio(gap_B_T: torch.Tensor, mask_B_T: torch.Tensor, level: str) -> torch.Tensor:
    """log(pi_prox / pi_behaviour) per token (``token``) or per sequence (``sequence``: the
    sum over its tokens, broadcast), clamped to [-20, 20]; ``gap`` is ``logp_prox - logp_behaviour``."""
    if level == "sequence":
        gap_B_T = (gap_B_T * mask_B_T).sum(dim=-1, keepdim=True).expand_as(gap_B_T)
    elif level != "token":
        raise ValueError(f"rollout_is: unknown {level!r}; choices: token, sequence")
    return torch.clamp(gap_B_T, -SAFETY_BOUND, SAFETY_BOUND)


def truncated_is_weights(gap_B_T: torch.Tensor, mask_B_T: torch.Tensor, level: str,
                         threshold: float) -> torch.Tensor:
    """Truncated importance sampling (TIS; Ionides 2008; for LLM RL: Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training")::

        w = min(exp(log(pi_prox / pi_behaviour)), threshold)        (no gradient; 0 on padding)

    per token, or per sequence with the ratio the product of its token ratios.
    """
    with torch.no_grad():
        ratio_B_T = torch.exp(behaviour_log_ratio(gap_B_T.detach(), mask_B_T, level))
        return torch.clamp(ratio_B_T, max=threshold) * mask_B_T


def token_entropy(logits_T_V: torch.Tensor) -> torch.Tensor:
    """The policy's entropy at each position: H = logsumexp(x) - sum_v softmax(x)_v * x_v."""
    x_T_V = logits_T_V.float()
    return torch.logsumexp(x_T_V, dim=-1) - (torch.softmax(x_T_V, dim=-1) * x_T_V).sum(-1)
