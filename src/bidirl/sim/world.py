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
from bidirl.perf.profiles import GIB, HARDWARE, MODELS, lookup
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel, max_concurrency, weight_sync_s
from bidirl.perf.switch_costs import switch_priors
from bidirl.sim.scenario import Scenario, ScenarioError
from bidirl.sim.workload import ResponseLengths


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


def build(sc: Scenario) -> tuple[ClusterSpec, Truth, ResponseLengths]:
    hw, m = lookup(HARDWARE, sc.hardware, "hardware"), lookup(MODELS, sc.model, "model")
    p, w = sc.pools, sc.workload
    lengths = ResponseLengths(w.response_length, w.prompts_per_step, w.group_size, sc.seed)
    cap = sc.calibration.replica_cap or max_concurrency(hw, m, p.rollout_tp, w.prompt_tokens + lengths.mean())
    if cap == 0:
        raise ScenarioError(f"pools.rollout_tp: {sc.model} does not fit on {p.rollout_tp} "
                            f"x {sc.hardware} with room for a KV cache; raise rollout_tp")
    aux_bytes = m.params * (m.bytes_per_param + 4)  # weights + fp32 gradients
    spec = ClusterSpec(
        hardware=sc.hardware, model=sc.model, devices=sc.devices,
        **device_layout(p.rollout_devices, p.train_devices, p.rollout_tp, hw.devices_per_node),
        train_dp=p.train.dp, train_tp=p.train.tp,
        replica_cap=max(cap, 1), groups_per_step=w.prompts_per_step, group_size=w.group_size,
        prompt_tokens=w.prompt_tokens, staleness=sc.staleness, steps=sc.steps,
        micro_batch_tokens=sc.sim.micro_batch_tokens, max_response_tokens=w.response_length.max,
        aux_trainers=aux_bytes <= 0.9 * hw.memory_gib * GIB * p.rollout_tp,
        prior_scale=sc.sim.prior_scale,
    )
    return spec, _truth(sc, hw, m), lengths


def _truth(sc: Scenario, hw, m) -> Truth:
    p, c = sc.pools, sc.costs
    sw = switch_priors(hw, m, p.rollout_tp, p.rollout_tp)
    # switch kind "roll_on_train.c_in" is overridden by costs.roll_on_train_c_in_s, and so on
    overrides = {k: getattr(c, k.replace(".", "_") + "_s") for k in sw}
    sw.update({k: v for k, v in overrides.items() if v is not None})
    sync = c.weight_sync_s if c.weight_sync_s is not None else weight_sync_s(
        hw, m, sc.devices > hw.devices_per_node)
    colocated = c.colocated_switch_s if c.colocated_switch_s is not None else \
        sw["roll_on_train.c_in"]
    cal = sc.calibration
    rollout = RolloutStageModel(hw, m, p.rollout_tp)
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
        prefill_per_response=cal.prefill_per_response,
    )
