"""Scheduling policies: pure functions of the cluster state that return actions.

One module per policy (``sync``, ``one_step_off``, ``asynchronous``, ``roll_borrow``,
``train_borrow``, ``bidirl_opportunistic``, ``bidirl``) and shared pieces in their own
modules: ``admission`` (benefit vs switch cost), ``split`` (capacity-proportional work
split with startup drain), ``batching`` (micro-batches in group-id order), ``assign``
(keeping replicas full).  Construct one by name with ``make_policy``; ``policy_names()`` is the only list of
names (everything else, the simulator's ``POLICIES``, the CLI's choices and the train
config's check, derives from it); ``policy_max_staleness(name)`` is the version gap a policy
keeps whatever its bound (the train config's check in reproducible mode).
"""

from bidirl.policy.base import Policy, make_policy, policy_class, policy_max_staleness, policy_names

__all__ = ["Policy", "make_policy", "policy_class", "policy_max_staleness", "policy_names"]
