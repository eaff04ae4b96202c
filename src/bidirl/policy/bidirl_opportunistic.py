"""``bidirl-opportunistic``: both directions whenever a device idles, no admission model.

The paper's ablation: the same mechanisms as ``bidirl`` but every idle device is lent at
once, whatever the switch costs.  It shows what the admission model is worth.
"""

from __future__ import annotations

from bidirl.policy.base import register
from bidirl.policy.bidirl import BiDiRLPolicy


@register("bidirl-opportunistic")
class OpportunisticPolicy(BiDiRLPolicy):
    guided = False
