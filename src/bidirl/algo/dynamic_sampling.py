"""DAPO's dynamic sampling (``algorithm.filter_groups``): which completed groups carry signal.

A group whose rewards are all equal has group-relative advantages of exactly 0 (``grpo``,
``rloo``, ``reinforce_plus_plus_baseline``: ``advantages.py`` compares equal rewards rather
than subtract them), so training on it only dilutes the step.  DAPO (Yu et al. 2025,
arXiv:2503.14476, section 3.2) drops such groups and samples more until the batch is full;
veRL keeps a prompt when its rewards' standard deviation is above 0 (or it has one
response).  The rule is the same here, on the training rewards the advantage reads
(shaped: the overlong penalty included, veRL's ``seq_reward``).

Where it is used: the real runtime judges each group as it completes
(``runtime/rollout_driver.py``) and reports the verdict in ``GroupsCompleted.filtered``;
the controller records the group as filtered and queues a replacement for its batch
(``controller/queue.py``); the simulator draws the verdict from its keep-rate model
(``sim/workload.py:KeepModel``).  Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence


def zero_spread(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards are all equal (no advantage signal): it is filtered.

    A group of one response is kept, as veRL keeps it (its advantage is 0 anyway, but it is
    not "a group with no spread")."""
    return len(rewards) > 1 and all(r == rewards[0] for r in rewards)
