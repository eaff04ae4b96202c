"""The trainer's forward passes and the loss settings it hands the objective.

Split from ``trainer_torch`` so that the trainer module holds the optimizer and the
gradient arithmetic: here are the log-probs of a collated batch under the trained model
(with the entropy as a metric, or with its gradient for an entropy bonus), under the
frozen reference model, and the :class:`~bidirl.algo.objective.LossSettings` read from
the trainer's and the algorithm's config.
"""

from __future__ import annotations

from typing import Literal

import torch

from bidirl.algo.algorithm_config import AlgorithmConfig
from bidirl.algo.grpo import token_logprobs
from bidirl.algo.objective import LossSettings
from bidirl.algo.policy_loss import KL_PENALTIES, token_entropy
from bidirl.algo.registry import choose
from bidirl.engines.train_batch import Collated
from bidirl.engines.trainer_config import TrainerConfig

EntropyMode = Literal["none", "metric", "grad"]


def forward_logp(model, batch: Collated, entropy: EntropyMode = "metric", vision: dict | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs (with gradient) and the policy's entropy at each position.

    ``metric``: the entropy without gradient, one sequence at a time, so it adds a
    (length x vocab) temporary, not a (batch x length x vocab) one; ``grad``: with its
    gradient (an entropy bonus needs it), over the whole batch; ``none``: not computed.
    ``vision``: a vision-language model's image inputs (``engines/vision_inputs.py``).
    """
    logits_B_L_V = model(input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L,
                         use_cache=False, **(vision or {})).logits
    logits_B_T_V = logits_B_L_V[:, :-1]
    logp_B_T = token_logprobs(logits_B_T_V, batch.targets_B_T)
    if entropy == "none":
        return logp_B_T, None
    if entropy == "grad":
        return logp_B_T, token_entropy(logits_B_T_V)
    with torch.no_grad():
        entropy_B_T = torch.stack([token_entropy(logits_B_T_V[b].detach()) for b in range(logits_B_T_V.shape[0])])
    return logp_B_T, entropy_B_T


@torch.no_grad()
def reference_logp(ref_model, batch: Collated, vision: dict | None = None) -> torch.Tensor:
    """Token log-probs under the frozen reference (initial) model."""
    logits_B_L_V = ref_model(input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L,
                             use_cache=False, **(vision or {})).logits
    return token_logprobs(logits_B_L_V[:, :-1], batch.targets_B_T)


@torch.no_grad()
def reference_kl_sums(ref_model, batch: Collated, kind: str, vision: dict | None = None) -> list[float]:
    """Per sequence: ``sum_t kind(behaviour_t, reference_t)`` over its response tokens, the KL
    that ``algorithm.use_kl_in_reward`` subtracts (times its coefficient) from the reward.

    veRL takes the actor's recomputed log-probs as the policy side; bidirl the behaviour
    log-probs the engine sampled with (the same numbers on-policy, the sampling policy's own
    divergence off it).
    """
    ref_logp_B_T = reference_logp(ref_model, batch, vision)
    on_B_T = batch.mask_B_T > 0
    kind = "low_var_kl" if kind == "k3" else kind  # veRL's k3 in the reward is its clamped low_var_kl
    kl_B_T = choose("algorithm.kl_penalty", kind, KL_PENALTIES)(batch.old_logp_B_T, ref_logp_B_T, on_B_T)
    return (kl_B_T * batch.mask_B_T).sum(dim=-1).to(torch.float64).tolist()


def loss_settings(config: TrainerConfig, algorithm: AlgorithmConfig) -> LossSettings:
    """The objective's settings: the clip range and KL weight are the trainer's, the rest the algorithm's."""
    rc = algorithm.rollout_correction
    return LossSettings(
        policy_loss=algorithm.policy_loss, loss_agg_mode=algorithm.loss_agg_mode,
        loss_scale_factor=algorithm.loss_scale_factor, clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high, kl_coef=config.kl_coef if algorithm.kl_on(config.kl_coef) else 0.0,
        kl_loss_type=algorithm.kl_loss_type, entropy_coeff=algorithm.entropy_coeff, rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold)
