"""From a scenario to a simulated cluster: the controller's ``ClusterSpec`` and the
simulator's ground truth.

The ground truth is what the simulated hardware really does: stage-time models at
``prior_scale = 1`` (or the coefficients a real run measured, ``calibration``), switch
costs from the profile priors or the scenario's ``costs`` overrides.  The scheduler never
sees it; it starts from priors scaled by ``sim.prior_scale`` and calibrates on the
measurements the simulator reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.controller.cluster import ClusterSpec, device_layout
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel, weight_sync_s
from bidirl.perf.switch_costs import switch_priors
from bidirl.perf.vision import vision_prefill_s
from bidirl.planner.compat import split_fit
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import envelope_of
from bidirl.sim.scenario import Scenario, ScenarioError
from bidirl.sim.turns import TurnDraws
from bidirl.sim.workload import KeepModel, ResponseLengths


@dataclass
class Truth:
    """How long things really take in the simulated cluster."""

    rollout: RolloutStageModel
    train: TrainStageModel
    aux: TrainStageModel
    weight_sync_s: float
    switch: dict[str, float]
    colocated_switch_s: float
    noise_cv: float
    step_overhead_s: float = 0.0  # a training step's time after its micro-batches and all-reduce
    reprefill_on_sync: bool = False  # a weight update re-prefills the running responses
    prefill_per_response: bool = False  # no prefix caching: a burst per assignment, a prompt per response
    startup_s: float = 0.0  # nothing happens before (a real run's start-up)
    prewarmed: bool = False  # the scheduler starts from the measured switch costs (a real run's pre-warm)
    keep: KeepModel | None = None  # which completed groups are filtered (dynamic sampling); None: none
    turns: TurnDraws | None = None  # multi-turn trajectories (workload.turns); None: single-turn


def build(sc: Scenario, allow_oversubscribe: bool = False) -> tuple[ClusterSpec, Truth, ResponseLengths]:
    """The controller's view, the ground truth and the lengths of ``sc``'s committed split.

    Memory is the planner's model (``planner.compat.split_fit``): a split whose rollout
    replica or trainer does not fit is refused with the reason unless
    ``allow_oversubscribe``; an auxiliary trainer is lent only where it fits, a trainer
    unit only where its parked state fits in host memory; a replica's concurrency is the
    planner's (KV memory at prompt + mean response), unless a real run measured it.
    """
    hw, m = sc.hw, sc.model_profile
    p, w = sc.pools, sc.workload
    lengths = ResponseLengths(w.response_length, w.prompts_per_step, w.group_size, sc.seed, sc.steps)
    fit = split_fit(PlanContext.from_scenario(sc), envelope_of(sc))
    allow_oversubscribe = allow_oversubscribe or sc.sim.allow_oversubscribe
    if fit.refusal is not None and not allow_oversubscribe:
        raise ScenarioError(
            f"pools: the split does not fit in memory: {fit.refusal.reason}; change pools (bidirl plan "
            "finds one that fits) or run it anyway with --allow-oversubscribe (sim.allow_oversubscribe: true)")
    cap = sc.calibration.replica_cap or fit.concurrency
    if cap == 0 and not allow_oversubscribe:
        raise ScenarioError(f"pools.rollout_tp: {m.name} does not fit on {p.rollout_tp} "
                            f"x {hw.name} with room for a KV cache; raise rollout_tp")
    layout = device_layout(p.rollout_devices, p.train_devices, p.rollout_tp, hw.devices_per_node)
    if not fit.lend_fits:
        layout["train_units"] = ()
    spec = ClusterSpec(
        hardware=hw.name, model=m.name, devices=sc.devices, **layout,
        train_dp=p.train.dp, train_tp=p.train.tp,
        replica_cap=max(cap, 1), groups_per_step=w.prompts_per_step, group_size=w.group_size,
        prompt_tokens=w.prompt_tokens, staleness=sc.staleness, steps=sc.steps,
        micro_batch_tokens=sc.sim.micro_batch_tokens,
        micro_batch_samples=sc.sim.micro_batch_samples, max_response_tokens=w.response_length.max,
        aux_trainers=fit.aux_fits, prior_scale=sc.sim.prior_scale, hw_profile=hw, model_profile=m,
        prompt_vision_s=vision_prefill_s(hw, m, p.rollout_tp, w.image_load),
        filter_groups=w.keep_rate.filters, max_gen_batches=w.max_num_gen_batches,
    )
    truth = _truth(sc, hw, m)
    if w.turns.multi:
        truth.turns = TurnDraws(w.turns, lengths, sc.seed)
    return spec, truth, lengths


def _truth(sc: Scenario, hw, m) -> Truth:
    p, c = sc.pools, sc.costs
    sw = switch_priors(hw, m, p.rollout_tp, p.rollout_tp)
    # switch kind "roll_on_train.c_in" is overridden by costs.roll_on_train_c_in_s, and so on
    overrides = {k: getattr(c, k.replace(".", "_") + "_s") for k in sw}
    sw.update({k: v for k, v in overrides.items() if v is not None})
    sync = c.weight_sync_s if c.weight_sync_s is not None else weight_sync_s(
        hw, m, sc.devices > hw.devices_per_node, c.weight_sync_s_per_gb)
    colocated = c.colocated_switch_s if c.colocated_switch_s is not None else \
        sw["roll_on_train.c_in"]
    cal = sc.calibration
    # A run's measured prefill (calibration.prefill) already holds its vision encoder's time.
    vision = 0.0 if cal.prefill is not None else vision_prefill_s(hw, m, p.rollout_tp, sc.workload.image_load)
    rollout = RolloutStageModel(hw, m, p.rollout_tp, vision_s_per_prompt=vision,
                                prompt_tokens=sc.workload.prompt_tokens)
    train, aux = TrainStageModel(hw, m, p.train.tp), TrainStageModel(hw, m, p.rollout_tp)
    aux_theta = cal.aux_micro or (cal.train_micro if p.rollout_tp == p.train.tp else None)
    for model, theta in ((rollout.decode, cal.decode), (rollout.prefill, cal.prefill),
                         (train.micro, cal.train_micro), (aux.micro, aux_theta)):
        if theta is not None:
            model.theta = list(theta)
    overhead = cal.train_step_overhead_s
    return Truth(
        rollout=rollout, train=train, aux=aux,
        weight_sync_s=sync, switch=sw, colocated_switch_s=colocated,
        noise_cv=sc.sim.timing_noise_cv,
        step_overhead_s=train.optimizer_s() if overhead is None else overhead,
        reprefill_on_sync=cal.reprefill_on_sync, startup_s=cal.startup_s,
        prefill_per_response=cal.prefill_per_response, prewarmed=cal.prewarmed,
        keep=KeepModel(sc.workload.keep_rate, sc.steps, sc.seed) if sc.workload.keep_rate.filters else None,
    )
