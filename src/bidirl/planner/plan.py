"""The static planner (the paper's Algorithm 1): enumerate, keep compatible, predict, pick.

::

    for R in 1..g-1:                         rollout / training split
      for rollout_tp | R, train_tp | g-R:    layouts (powers of two <= a node, | heads)
        envelope = (R, g-R, rollout_tp, dp=(g-R)/train_tp, train_tp)
        check_envelope -> sized envelope | Rejection(reason)     (planner.compat)
        predict        -> tokens/s over the run's steps          (planner.predict:
                                                                  planner.closed_form,
                                                                  planner.pipeline)
    return the best, the top K, and every rejection with its reason

Two passes: the steady-state closed form (microseconds per envelope) screens every
compatible envelope, and the step-by-step recurrence (a few milliseconds) ranks those
within ``SCREEN`` of the best; 256 devices (1,168 envelopes) plan in about 5 s
(docs/planner.md).  A model that fits no envelope raises ``PlanError`` naming the model,
the memory it needs and what the devices have.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from bidirl.perf.profiles import GIB
from bidirl.planner.compat import Rejection, check_envelope
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope, scenario_with_envelope
from bidirl.planner.memory import usable_bytes
from bidirl.planner.predict import HORIZON_STEPS, Prediction, predict, with_pipeline
from bidirl.planner.runnable import cpu_hardware, unrunnable_reason

__all__ = ["PlanError", "PlanResult", "Candidate", "plan", "evaluate",
           "candidate_envelopes", "scenario_with_envelope"]


class PlanError(ValueError):
    """No hot-switch-compatible envelope exists for the scenario."""


@dataclass(frozen=True)
class Candidate:
    envelope: Envelope
    prediction: Prediction

    def to_json(self) -> dict[str, Any]:
        return {"envelope": self.envelope.to_json(), "label": self.envelope.label(),
                "predicted_tokens_per_s": round(self.prediction.tokens_per_s, 2),
                "predicted_step_time_s": round(self.prediction.step_time_s, 4),
                "prediction": self.prediction.to_json()}


@dataclass
class PlanResult:
    scenario: str
    envelope: Envelope
    prediction: Prediction
    alternatives: list[Candidate]  # the top K, best first (the pick included)
    rejected: list[Rejection]
    evaluated: int
    compatible: int
    candidates: list[Candidate] = field(default_factory=list, repr=False)  # all, best first
    steps: int = 0  # the horizon the throughput is predicted over
    # set by ``bidirl.sim.confirm`` (outer ring) when the short list was simulated: one row
    # per envelope {rank, envelope, predicted_tokens_per_s, simulated_tokens_per_s}
    confirmed: list[dict[str, Any]] = field(default_factory=list)
    confirm_steps: int = 0
    confirm_seed: int | None = None
    confirm_s: float = 0.0
    planner_pick: Envelope | None = None  # the planner's own pick, when a confirmation ran
    policy: str = "bidirl"  # the policy planned for (its borrowing and staleness)
    hardware: str = ""  # the device's profile name: what runs where (planner/runnable.py)

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.prediction.tokens_per_s

    @property
    def predicted_step_time_s(self) -> float:
        return self.prediction.step_time_s

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "hardware": self.hardware,
            "steps": self.steps,
            **Candidate(self.envelope, self.prediction).to_json(),
            "alternatives": [c.to_json() for c in self.alternatives],
            "evaluated": self.evaluated,
            "compatible": self.compatible,
            "rejected_by_constraint": dict(Counter(r.constraint for r in self.rejected)),
            "rejected": [r.to_json() for r in self.rejected],
            "confirmed": ({"steps": self.confirm_steps, "seed": self.confirm_seed,
                           "seconds": round(self.confirm_s, 3), "envelopes": self.confirmed,
                           "planner_pick": self.planner_pick.label() if self.planner_pick else None}
                          if self.confirmed else None),
        }

    def format(self) -> str:
        p = self.prediction
        lines = [f"plan for {self.scenario}: {self.envelope.label()}",
                 f"  predicted {p.tokens_per_s:,.0f} tokens/s for policy {self.policy}, "
                 f"step {p.step_time_s:.2f} s "
                 f"({p.regime}-bound; batch latency {p.latency_s:.2f} s, saturated rollout "
                 f"{p.rollout_s:.2f} s, train {p.train_s:.2f} s, borrow {p.borrowed})",
                 f"  models: closed form {p.steady_tokens_per_s:,.0f} tokens/s, step-by-step "
                 f"{p.pipeline_tokens_per_s or 0:,.0f} tokens/s over {self.steps} steps (of "
                 f"the first {min(self.steps, HORIZON_STEPS)}: trainer units lent to rollout "
                 f"at {p.lent_windows}, auxiliary trainers at {p.aux_steps})",
                 f"  {self.compatible} compatible of {self.evaluated} envelopes; top "
                 f"{len(self.alternatives)}:"]
        overruled = self.planner_pick is not None and self.planner_pick != self.envelope
        if p.no_borrow_tokens_per_s is not None and not overruled:
            tied = sum(c.prediction.no_borrow_tokens_per_s is not None for c in self.candidates)
            lines.insert(3, f"  picked among {tied} envelopes within {TIE:.0%} of the best "
                            f"prediction as the one leaning least on borrowing "
                            f"({p.no_borrow_tokens_per_s:,.0f} tokens/s without it)")
        for c in self.alternatives:
            lines.append(f"    {c.prediction.tokens_per_s:>10,.0f} tok/s  "
                         f"{c.prediction.step_time_s:7.2f} s  {c.envelope.label()}")
        if overruled:
            lines.insert(3, f"  picked by simulation over the planner's own pick, "
                            f"{self.planner_pick.label()} (see below)")
        if self.confirmed:
            lines.append(f"  confirmed by simulation ({self.confirm_steps} steps, length seed "
                         f"{self.confirm_seed}, {self.confirm_s:.1f} s): the best simulated of "
                         f"the {len(self.confirmed)} envelopes predicted closest to the best")
            for row in self.confirmed:
                mark = "*" if row["envelope"] == self.envelope.label() else " "
                sim = row["simulated_tokens_per_s"]
                got = f"{sim:>10,.0f} tok/s simulated," if sim is not None else "   refused by the simulator,"
                lines.append(f"   {mark}{got} {row['predicted_tokens_per_s']:>10,.0f} predicted  "
                             f"{row['envelope']}" + (f" ({row['refused']})" if sim is None else ""))
        by = Counter(r.constraint for r in self.rejected)
        if by:
            lines.append("  rejected: " + ", ".join(f"{k} {v}" for k, v in by.most_common()))
            for r in self.rejected[:3]:
                lines.append(f"    {r.envelope.label()}: {r.reason}")
        return "\n".join(lines)


def _degrees(ctx: PlanContext) -> list[int]:
    """Tensor-parallel degrees: powers of two that divide the attention heads, within a node.

    Tensor parallelism across nodes is left out: its per-layer all-reduces would ride the
    inter-node network, which the decode and training priors do not model (and which
    no deployed system chooses over data parallelism).
    """
    out, d = [], 1
    while d <= min(ctx.devices, ctx.hw.devices_per_node):
        if ctx.model.heads % d == 0:
            out.append(d)
        d *= 2
    return out


def candidate_envelopes(ctx: PlanContext) -> list[Envelope]:
    """Every split and layout whose degrees divide their pools (not yet checked)."""
    degrees, out = _degrees(ctx), []
    g = ctx.devices
    for rollout in range(1, g):
        train = g - rollout
        for r in degrees:
            if rollout % r:
                continue
            for t in degrees:
                if train % t == 0:
                    out.append(Envelope(rollout, train, r, train // t, t))
    return out


SCREEN = 0.8  # the recurrence runs on envelopes whose closed form is within 20 % of the best
TIE = 0.02  # predictions this close to the best are a tie (the pick's median error is ~3 %)


def evaluate(ctx: PlanContext, env: Envelope, pipeline: bool = True) -> Candidate | Rejection:
    """Check one envelope and, if it is compatible, predict it."""
    sized = check_envelope(ctx, env)
    if isinstance(sized, Rejection):
        return sized
    return Candidate(sized, predict(ctx, sized, pipeline=pipeline, screen=not pipeline))


def _no_fit_error(ctx: PlanContext, scenario, rejected: list[Rejection]) -> PlanError:
    mem = [r for r in rejected if r.needed_bytes > 0]
    by = ", ".join(f"{k} {v}" for k, v in Counter(r.constraint for r in rejected).most_common())
    m, hw = ctx.model, ctx.hw
    head = (f"no hot-switch-compatible envelope for {m.name} on {ctx.devices} x {hw.name} "
            f"(scenario {scenario.name!r})")
    if mem:
        best = min(mem, key=lambda r: r.needed_bytes / max(r.available_bytes, 1.0))
        return PlanError(
            f"{head}: model too large: {m.name} ({m.params / 1e9:.1f}B params, weights "
            f"{m.weights_bytes / GIB:.1f} GiB, training state {18 * m.params / GIB:.1f} GiB) "
            f"needs at least {best.needed_bytes / GIB:.2f} GiB per device in the most "
            f"favourable envelope ({best.envelope.label()}) but {best.available_bytes / GIB:.2f}"
            f" GiB is available ({usable_bytes(hw) / GIB:.2f} GiB usable of {hw.memory_gib} GiB"
            f"); closest: {best.reason}; rejected: {by}")
    first = rejected[0].reason if rejected else "no envelope to evaluate"
    hint = ("; --what-if plans layouts the runtime cannot run yet, for the simulator"
            if any(r.constraint == "runtime" for r in rejected) else "")
    return PlanError(f"{head}: rejected: {by}; e.g. {first}{hint}")


def plan(scenario, top_k: int = 5, steps: int | None = None, policy: str = "bidirl",
         runnable_only: bool = False) -> PlanResult:
    """Choose the envelope with the best predicted throughput for ``scenario`` run by ``policy``.

    ``steps`` is the horizon the throughput is predicted over (default: the scenario's
    ``steps``), because a short run pays the pipeline fill that a long one amortises.
    ``policy`` sets what the predictions may borrow and the staleness they keep
    (``context.borrow_options``): a policy that never borrows gets the split best without
    borrowing, not one that only a lending trainer makes good.
    ``runnable_only``: keep only layouts the real runtime executes (``planner.runnable``; what
    ``bidirl plan`` picks unless ``--what-if``); the others are rejected as ``runtime``.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    ctx = PlanContext.from_scenario(scenario, steps, policy)
    cands: list[Candidate] = []
    rejected: list[Rejection] = []
    envs = candidate_envelopes(ctx)
    for env in envs:
        why = unrunnable_reason(env, cpu_hardware(ctx.hw.name)) if runnable_only else None
        if why is not None:
            rejected.append(Rejection(env, "runtime", why))
            continue
        res = evaluate(ctx, env, pipeline=False)
        (rejected if isinstance(res, Rejection) else cands).append(res)
    if not cands:
        raise _no_fit_error(ctx, scenario, rejected)
    # Two passes: the closed form screens, the recurrence ranks what is left.  The two
    # models' ratio stayed within 0.47-1.43 over 5,483 simulated envelopes, so an
    # envelope 20 % below the best closed form cannot come out on top of the blend.
    top = max(c.prediction.steady_tokens_per_s for c in cands)
    cands = [Candidate(c.envelope, with_pipeline(ctx, c.envelope, c.prediction))
             if c.prediction.steady_tokens_per_s >= SCREEN * top else c for c in cands]
    cands.sort(key=lambda c: (c.prediction.screened_out, -c.prediction.tokens_per_s,
                              c.envelope.key()))
    cands = _break_tie(ctx, cands)
    best = cands[0]
    return PlanResult(scenario.name, best.envelope, best.prediction, cands[:top_k], rejected,
                      len(envs), len(cands), cands, ctx.steps, policy=policy, hardware=ctx.hw.name)


def _break_tie(ctx: PlanContext, ranked: list[Candidate]) -> list[Candidate]:
    """Among envelopes within ``TIE`` of the best prediction, pick the one that leans least
    on borrowing (the highest throughput predicted without it), and put it first.

    Predictions that close are indistinguishable at the models' error, and they are not
    equally safe: the borrowed share of a prediction is realised only if the runtime's
    online decisions come out as modelled, and they are taken on estimates (cold priors,
    then calibration) that the no-borrow share does not depend on.  Measured on the regret
    bench, the envelopes the planner missed by over 8 % were one-replica rollout pools
    carried by lent trainer units (docs/notes/2026-11-planner-experiments.md, tie rule).
    """
    if ctx.options == ("none",):  # a policy that never borrows: nothing to lean on
        return ranked
    top = ranked[0].prediction.tokens_per_s
    band = [i for i, c in enumerate(ranked) if not c.prediction.screened_out
            and c.prediction.tokens_per_s >= (1 - TIE) * top]
    if len(band) < 2:
        return ranked
    out = list(ranked)
    for i in band:
        c = out[i]
        alone = predict(ctx, c.envelope, options=("none",)).tokens_per_s
        out[i] = Candidate(c.envelope, replace(c.prediction, no_borrow_tokens_per_s=alone))
    pick = max(band, key=lambda i: (out[i].prediction.no_borrow_tokens_per_s,
                                    out[i].prediction.tokens_per_s))
    return [out[pick]] + out[:pick] + out[pick + 1:]

