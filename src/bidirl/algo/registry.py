"""The names of the algorithm choices, and one way to look a name up (torch-free).

Each choice is a small function in a module of its own (``advantages.py``,
``policy_loss.py``, ``aggregation.py``); those modules keep a table from these names to
their functions, and a test checks that the tables and these tuples hold the same names.
The tuples live here, without torch, because the config loader and ``bidirl train
--help`` read them (``algo/algorithm_config.py``).  docs/algorithm.md maps each name to
its paper and to the names veRL, TRL and AReaL give it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

ADV_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
"""``algorithm.adv_estimator`` (veRL's names); Dr.GRPO is ``grpo`` with ``norm_adv_by_std_in_grpo=false``."""

POLICY_LOSSES = ("vanilla", "gspo")
"""``algorithm.policy_loss``: the token-level clipped ratio (PPO/GRPO), or GSPO's sequence-level ratio."""

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``algorithm.loss_agg_mode`` (veRL's names): how token losses become the step's scalar."""

KL_LOSS_TYPES = ("k3", "low_var_kl", "k1", "kl", "k2", "mse", "abs")
"""``algorithm.kl_loss_type``: the per-token estimator of KL(policy || reference); ``kl`` is
``k1`` and ``mse`` is ``k2`` (veRL's synonyms)."""

ROLLOUT_IS_LEVELS = ("token", "sequence")
"""``algorithm.rollout_correction.rollout_is``: truncated importance weights per token or per sequence."""

T = TypeVar("T")


class UnknownChoice(ValueError):
    """A name that is not one of an algorithm table's choices (the message lists them)."""


def choose(kind: str, name: str, table: Mapping[str, T]) -> T:
    """``table[name]``, or :class:`UnknownChoice` in one line naming ``kind`` and the choices."""
    try:
        return table[name]
    except (KeyError, TypeError):
        raise UnknownChoice(f"{kind}: unknown {name!r}; choices: {', '.join(table)}") from None
