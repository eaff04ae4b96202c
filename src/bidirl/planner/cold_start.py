"""The runtime's first lending decision, taken by the policy's own code at ``t = 0``.

The recurrence (``pipeline``) judges each idle window with the policy's rule applied to
*expected* stage times: right once the scheduler has calibrated, wrong for the first
window.  At ``t = 0`` nothing has been measured; the scheduler's estimates are priors
(mean response ``max / 4``, a tail of ``max / 2`` decode steps at the load the first
batches would run at, stage models off by ``prior_scale``) and the fill, the longest wait
of most runs, is judged on them.  Where responses run near the maximum the priors
under-price the wait, and the policy can decline a lend the expected values say pays
(measured before the tail prior counted the load: ``rand07`` of the regret bench, R6/T8,
predicted +13 % from lending at the fill, simulated none).

So the planner asks the policy itself: it builds the controller's ``ClusterSpec`` and
``ClusterState`` for the envelope as they are before the first group is placed, and
calls ``RollLending.judge``.  No simulation runs; this is one call of the same function
the controller will call at ``t = 0``.
"""

from __future__ import annotations

from bidirl.controller.cluster import ClusterSpec, device_layout
from bidirl.controller.state import ClusterState
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope
from bidirl.policy.roll_borrow import RollLending


def start_spec(ctx: PlanContext, env: Envelope) -> ClusterSpec:
    """The controller's view of ``env`` (what ``sim.world.build`` and the runtime give it)."""
    return ClusterSpec(
        hardware=ctx.hw.name, model=ctx.model.name, devices=ctx.devices,
        **device_layout(env.rollout_devices, env.train_devices, env.rollout_tp, ctx.hw.devices_per_node),
        train_dp=env.train_dp, train_tp=env.train_tp,
        replica_cap=max(1, env.rollout_concurrency), groups_per_step=ctx.prompts_per_step,
        group_size=ctx.group_size, prompt_tokens=round(ctx.lengths.prompt_tokens),
        staleness=ctx.staleness, steps=ctx.steps, micro_batch_tokens=round(ctx.micro_tokens),
        micro_batch_samples=ctx.micro_samples,
        max_response_tokens=round(ctx.lengths.max_tokens), prior_scale=ctx.prior_scale,
        hw_profile=ctx.hw, model_profile=ctx.model)


def first_window_units(ctx: PlanContext, env: Envelope) -> int:
    """Trainer units the policy lends at ``t = 0`` (0: it declines, or nothing to lend)."""
    if env.borrowable_replicas == 0:
        return 0
    decision = RollLending(guided=True).judge(ClusterState(start_spec(ctx, env)))
    return decision.units if decision.admit else 0
