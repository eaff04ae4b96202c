"""``bidirl``: both directions, model-guided admission and capacity-proportional split.

The paper's scheduler: idle trainer units host rollout replicas while the trainer waits
(``roll_borrow.RollLending``), idle rollout replicas host auxiliary trainers while a step
runs (``train_borrow.AuxLending``), and each borrow is admitted only when the calibrated
stage-time models predict that it pays for its switch costs (``admission``).  The trainer
direction splits micro-batches by capacity with startup drain (``split.plan_chunks``).
"""

from __future__ import annotations

from bidirl.policy.asynchronous import AsyncPolicy
from bidirl.policy.base import register
from bidirl.policy.roll_borrow import RollLending
from bidirl.policy.train_borrow import AuxLending


@register("bidirl")
class BiDiRLPolicy(AsyncPolicy):
    lends_train_devices = True
    lends_rollout_devices = True
    guided = True  # False: lend every idle device, no admission model (the ablation)

    def __init__(self) -> None:
        self.roll = RollLending(guided=self.guided)
        self.aux = AuxLending(guided=self.guided)
