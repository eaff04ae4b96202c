"""``bidirl-opportunistic``: both directions whenever a device idles, no admission model.

The paper's ablation: the same mechanisms as ``bidirl`` but every idle device is lent at
once, whatever the switch costs.  It shows what the admission model is worth.
"""

from __future__ import annotations

from bidirl.policy.asynchronous import AsyncPolicy
from bidirl.policy.base import register
from bidirl.policy.roll_borrow import RollLending
from bidirl.policy.train_borrow import AuxLending


@register("bidirl-opportunistic")
class OpportunisticPolicy(AsyncPolicy):
    lends_train_devices = True
    lends_rollout_devices = True

    def __init__(self) -> None:
        self.roll = RollLending(guided=False)
        self.aux = AuxLending(guided=False)
