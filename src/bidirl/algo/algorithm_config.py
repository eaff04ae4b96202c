"""The train config's ``algorithm`` section: which advantage, loss and corrections a run trains with.

Torch-free, like ``engines/trainer_config.py``, so the config loader and ``bidirl train
--help`` need no torch.  The defaults are what bidirl trained before these choices
existed, bit for bit: group-normalised advantages (``grpo``), the clipped token ratio
against the behaviour log-probs (``vanilla``), token-mean over the whole step, the k3 KL
when ``trainer.kl_coef`` > 0, no entropy bonus, no importance weights, no length penalty.

Who reads what: the train driver the advantage fields (``runtime/train_driver.py``), the
group store the overlong buffer (``runtime/group_store.py``), the rollout driver dynamic
sampling (``filter_groups``: ``runtime/rollout_driver.py`` judges, the controller replaces
and caps, ``runtime/run_spec.py``), the trainer the loss fields
(``engines/trainer_torch.py``, sent with ``trainer_wire``).  The clip range and the
KL weight stay the trainer's (``trainer.clip_eps_low`` / ``clip_eps_high``, veRL's
``clip_ratio_low`` / ``clip_ratio_high``; ``trainer.kl_coef``, veRL's ``kl_loss_coef``).
None of these fields is resume-safe (each changes what the next updates compute) but
``filter_groups.max_num_gen_batches``, which only says when a run gives up.
docs/algorithm.md gives every formula and the peers' names.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.algo.registry import ADV_ESTIMATORS, KL_LOSS_TYPES, LOSS_AGG_MODES, POLICY_LOSSES, ROLLOUT_IS_LEVELS
from bidirl.core.typed_config import check_fields, option, section


@dataclass(frozen=True)
class RolloutCorrection:
    """Off-policy correction (veRL's ``algorithm.rollout_correction``, decoupled mode)."""

    rollout_is: str | None = option(
        None, "truncated importance weights min(pi_prox / pi_behaviour, threshold) on the policy loss, per "
        "token or sequence, the clip against the trainer's weights before the step (decoupled); null: none, "
        "the clip against the behaviour log-probs", choices=ROLLOUT_IS_LEVELS)
    rollout_is_threshold: float = option(2.0, "the cap of the importance weights (TIS)", gt=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class OverlongBuffer:
    """DAPO's soft overlong punishment (veRL's ``reward_model.overlong_buffer``)."""

    enable: bool = option(False, "add min(0, -(length - (cap - len)) / len * penalty_factor) to each "
                          "training reward (cap: the response's token cap); validation is not shaped")
    len: int | None = option(None, "the buffer: the last this many tokens below the cap are penalised "
                             "linearly (needed with enable)", ge=1)
    penalty_factor: float = option(1.0, "the penalty at the cap", ge=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class FilterGroups:
    """DAPO's dynamic sampling (veRL's ``algorithm.filter_groups``): drop groups with no signal."""

    enable: bool = option(False, "a completed group whose training rewards (shaped, as the advantage sees "
                          "them) are all equal is filtered: recorded in trained_groups.jsonl, not trained, and "
                          "replaced by a new group for the same step, so every step trains "
                          "rollout.prompts_per_step groups")
    max_num_gen_batches: int = option(
        0, "at most this many x rollout.prompts_per_step groups generated for one step, filtered ones "
        "included; a step that needs more stops the run at its last step boundary (checkpoint written); "
        "0: no cap", ge=0, resume_safe=True)
    metric: str | None = option(
        None, "which per-response value must have a spread for a group to be kept: null, seq_reward or "
        "seq_final_reward: the training reward (shaped: overlong penalty included, the KL penalty of "
        "use_kl_in_reward not: it is known only when the step is laid out); score: the reward function's "
        "value before shaping; any other name (DAPO's recipe: acc): that key of the reward function's dict "
        "(a plain number counts as its own acc)")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.metric is not None and not str(self.metric).strip():
            raise ValueError("algorithm.filter_groups.metric: must be null or a name (seq_reward, score, acc, ...)")


@dataclass(frozen=True)
class KLControl:
    """The KL-in-reward coefficient (veRL's ``algorithm.kl_ctrl``)."""

    type: str = option("fixed", "fixed: kl_coef for the whole run (veRL's adaptive controller is not built: its "
                       "coefficient would be state a resume must restore)", choices=("fixed",))
    kl_coef: float = option(0.001, "beta of use_kl_in_reward: each training reward minus beta x its response's "
                            "summed per-token KL", ge=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class AlgorithmConfig:
    """Advantage estimator, policy loss, aggregation, KL, entropy, off-policy correction, shaping."""

    adv_estimator: str = option("grpo", "advantage of each response from its group's rewards",
                                choices=ADV_ESTIMATORS)
    norm_adv_by_std_in_grpo: bool = option(True, "grpo: divide by the group's std; false: Dr.GRPO's "
                                           "mean-centred rewards")
    policy_loss: str = option("vanilla", "vanilla: the clipped token ratio; gspo: the clipped "
                              "sequence ratio (geometric mean of the token ratios)", choices=POLICY_LOSSES)
    loss_agg_mode: str = option("token-mean", "token losses to the step's loss, over the whole step "
                                "(all micro-batches, ranks and chunks)", choices=LOSS_AGG_MODES)
    loss_scale_factor: int | None = option(
        None, "seq-mean-token-sum-norm's constant length; null: rollout.max_new_tokens", ge=1)
    use_kl_loss: bool = option(True, "the KL term is on when trainer.kl_coef > 0 (veRL's use_kl_loss, "
                               "whose default is false); false: off whatever kl_coef")
    kl_loss_type: str = option("k3", "the KL estimator: k3 (unclamped), low_var_kl (k3 clamped as veRL's "
                               "k3), k1 / kl, k2 / mse, abs", choices=KL_LOSS_TYPES)
    use_kl_in_reward: bool = option(
        False, "each training reward minus kl_ctrl.kl_coef x the sum over its response's tokens of "
        "kl_penalty(behaviour log-prob, reference log-prob), before the advantages; the trainer keeps the "
        "initial weights as the reference and runs one more forward pass per step (not with adv_estimator="
        "reinforce_plus_plus, whose per-token returns bidirl does not compute)")
    kl_penalty: str = option("kl", "use_kl_in_reward's per-token estimator (veRL's names): kl / k1, abs, mse / k2, "
                             "low_var_kl / k3 (clamped, as veRL's)", choices=KL_LOSS_TYPES)
    kl_ctrl: KLControl = section(KLControl, "the KL-in-reward coefficient")
    entropy_coeff: float = option(0.0, "entropy bonus: the loss minus this times the aggregated entropy", ge=0)
    rollout_correction: RolloutCorrection = section(RolloutCorrection, "off-policy correction")
    overlong_buffer: OverlongBuffer = section(OverlongBuffer, "DAPO's overlong reward shaping")
    filter_groups: FilterGroups = section(FilterGroups, "DAPO's dynamic sampling: groups with all rewards "
                                          "equal are filtered and replaced")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.use_kl_in_reward and self.adv_estimator == "reinforce_plus_plus":
            raise ValueError("algorithm.use_kl_in_reward: not with adv_estimator=reinforce_plus_plus (its KL "
                             "penalty makes per-token discounted returns; bidirl gives every token its "
                             "response's advantage); allowed: grpo, rloo, reinforce_plus_plus_baseline, or the "
                             "KL loss (use_kl_loss with trainer.kl_coef > 0)")
        if self.use_kl_in_reward and self.filter_groups.metric == "seq_final_reward":
            raise ValueError("algorithm.filter_groups.metric: seq_final_reward not allowed with use_kl_in_reward "
                             "(groups are judged when they complete, the KL penalty is known when their step is "
                             "laid out); allowed: seq_reward, score or a reward dict key")

    def kl_on(self, kl_coef: float) -> bool:
        """Whether the loss has a KL term (and the trainer a frozen reference model)."""
        return self.use_kl_loss and kl_coef > 0
