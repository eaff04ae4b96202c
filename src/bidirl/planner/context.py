"""What the planner reads from a scenario, resolved once per plan.

Profiles, length statistics, the contexts used for memory sizing, and the stage-time
models (one per tensor-parallel degree, cached: a 256-device search asks for the same
handful of degrees thousands of times).  The stage models are the uncalibrated priors
(``prior_scale`` 1): they are the planner's belief about the hardware, the same physics
the simulator runs on; a calibrated model could be passed in their place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bidirl.perf.profiles import HardwareProfile, ModelProfile
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel
from bidirl.perf.vision import ImageLoad, vision_prefill_s
from bidirl.planner.lengths import LengthStats
from bidirl.policy import policy_class, policy_max_staleness

# How a run may borrow: neither direction, idle trainer units host rollout replicas,
# idle rollout replicas host auxiliary trainers, or both (``predict`` solves each).
OPTIONS = ("none", "roll_on_train", "train_on_roll", "both")


def borrow_options(policy: str) -> tuple[str, ...]:
    """The borrowing options ``policy`` can take, from its lending flags (``Policy``):
    ``async``, ``one-step-off``: ``none`` alone; ``roll-borrow``: ``roll_on_train`` too;
    ``train-borrow``: ``train_on_roll`` too; ``bidirl`` (and its ablation), ``sync``
    (every device in both roles, colocated): all four.  Planning a policy for options it
    never takes would pick a split that only borrowing makes good."""
    cls = policy_class(policy)
    roll, aux = cls.lends_train_devices, cls.lends_rollout_devices
    return tuple(o for o, ok in zip(OPTIONS, (True, roll, aux, roll and aux)) if ok)


def policy_staleness(policy: str, bound: int) -> int:
    """The version gap ``policy`` keeps under the scenario's ``bound`` (``sync`` 0,
    ``one-step-off`` at most 1, the others the bound)."""
    cap = policy_max_staleness(policy)
    return bound if cap is None else min(bound, cap)


@dataclass
class PlanContext:
    hw: HardwareProfile
    model: ModelProfile
    lengths: LengthStats
    devices: int
    staleness: int
    steps: int
    prompts_per_step: int
    group_size: int
    micro_tokens: float
    costs: object = None  # the scenario's Costs overrides (None fields keep priors)
    prior_scale: float = 1.0  # how far the scheduler's priors start off (cold_start)
    micro_samples: int | None = None  # sim.micro_batch_samples: a micro-batch's cap in sequences
    images: ImageLoad = ImageLoad()  # each prompt's images (their vision encoder's prefill)
    # DAPO's dynamic sampling: the run's mean share of groups kept (workload.keep_rate,
    # ``KeepRate.effective``); a step generates prompts_per_step / keep_rate groups
    keep_rate: float = 1.0
    # what the policy planned for may borrow (``borrow_options``; ``predict``'s default)
    options: tuple[str, ...] = OPTIONS
    _memo: dict[tuple[str, int], object] = field(default_factory=dict, repr=False)

    @classmethod
    def from_scenario(cls, scenario, steps: int | None = None, policy: str = "bidirl") -> PlanContext:
        """The context of ``scenario`` run by ``policy``: its staleness and borrowing."""
        w = scenario.workload
        return cls(
            hw=scenario.hw, model=scenario.model_profile,
            lengths=LengthStats.from_workload(w, steps or scenario.steps),
            devices=scenario.devices,
            staleness=policy_staleness(policy, scenario.staleness),
            steps=steps or scenario.steps,
            prompts_per_step=w.prompts_per_step,
            group_size=w.group_size,
            micro_tokens=float(scenario.sim.micro_batch_tokens),
            costs=scenario.costs,
            prior_scale=scenario.sim.prior_scale,
            micro_samples=scenario.sim.micro_batch_samples,
            images=w.image_load,
            keep_rate=w.keep_rate.effective(steps or scenario.steps),
            options=borrow_options(policy),
        )

    @property
    def micro_mean_tokens(self) -> float:
        """Tokens of a typical micro-batch: the token target, or fewer when the sample cap
        closes it first (mean sample length; what the stage times are priced at)."""
        if self.micro_samples is None:
            return self.micro_tokens
        return min(self.micro_tokens, self.micro_samples * self.lengths.sample_tokens)

    @property
    def micro_memory_tokens(self) -> float:
        """Tokens the largest micro-batch can hold (what activation memory is sized for):
        the token target, or the sample cap at the longest context if that is smaller."""
        if self.micro_samples is None:
            return self.micro_tokens
        return min(self.micro_tokens, self.micro_samples * self.max_context)

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def generated_groups_per_step(self) -> int:
        """Groups rolled out per step: the trained ones and, with dynamic sampling, those
        filtered and replaced (``prompts_per_step / keep_rate``)."""
        return max(self.prompts_per_step, round(self.prompts_per_step / self.keep_rate))

    @property
    def generated_per_step(self) -> int:
        """Responses rolled out per step (``generated_groups_per_step`` groups)."""
        return self.generated_groups_per_step * self.group_size

    @property
    def tokens_per_step(self) -> float:
        """Trained tokens (prompt + response) per optimizer step."""
        return self.responses_per_step * self.lengths.sample_tokens

    @property
    def min_concurrency(self) -> int:
        """A replica must hold at least one prompt group at once."""
        return self.group_size

    @property
    def max_context(self) -> float:
        return self.lengths.prompt_tokens + self.lengths.max_tokens

    @property
    def plan_context(self) -> float:
        """KV tokens per sequence that size a replica's concurrency: prompt + mean response.

        The engine admits by expected context (KV pages are allocated as tokens appear),
        as the simulator and vLLM's scheduler do, not by the worst case.
        """
        return self.lengths.sample_tokens

    def _cached(self, key: tuple[str, int], make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def rollout_model(self, tp: int) -> RolloutStageModel:
        vision = vision_prefill_s(self.hw, self.model, tp, self.images)
        return self._cached(("rollout", tp), lambda: RolloutStageModel(
            self.hw, self.model, tp, vision_s_per_prompt=vision, prompt_tokens=self.lengths.prompt_tokens))

    def train_model(self, tp: int) -> TrainStageModel:
        return self._cached(("train", tp), lambda: TrainStageModel(self.hw, self.model, tp))

    def expected_max(self, n: int) -> float:
        """``lengths.expected_max`` memoised: envelopes share a few replica counts."""
        return self._cached(("max", n), lambda: self.lengths.expected_max(n))

    def staggered_max(self, n: int):
        """``lengths.staggered_max`` memoised (one table per batch size)."""
        return self._cached(("staggered", n), lambda: self.lengths.staggered_max(n))

    def cost(self, name: str, prior: float) -> float:
        """A scenario cost override (``costs.<name>``) or the prior."""
        value = getattr(self.costs, name, None) if self.costs is not None else None
        return prior if value is None else float(value)
