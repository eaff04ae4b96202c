"""What one simulated run reports: ``frame.result.RunResult``, the type both worlds share."""

from __future__ import annotations

from bidirl.frame.result import RunResult
from bidirl.policy import policy_names

POLICIES = tuple(policy_names())  # derived from the policy registry, the only list of names
SimResult = RunResult  # the simulator's name for it, kept for its callers

__all__ = ["POLICIES", "RunResult", "SimResult"]
