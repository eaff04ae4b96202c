"""The planner's short list, confirmed by simulation: the recurrence ranks, the simulator picks.

The planner (``bidirl.planner.plan``, inner ring: no simulator) predicts every compatible
envelope from closed forms and a step recurrence, 1,168 envelopes at 256 devices in a
few seconds.  Its pick's median error is ~3 %, but the envelopes it misses by most are
those whose borrowing it over-predicts (one or two rollout replicas carried by lent
trainer units, auxiliary trainers that start later than modelled): on unseen random
clusters its regret reached 11.8 % (BENCHMARKS.md, Planner, "The short list, confirmed").
The discrete-event simulator runs the same policy code and is checked against measured
runs, but costs 0.05-1 s an envelope over a short horizon; so ``bidirl plan`` simulates
the envelopes the planner cannot tell apart, those predicted within ``CONFIRM_BAND`` of
its best (its median error over every envelope is ~4 %), at most ``k`` of them (default
``DEFAULT_K``), and takes the best simulated.  When the runner-up is predicted further
below than that, the prediction's gap is larger than its error and nothing is simulated.

What keeps it honest:

* the simulations draw their own response lengths (``seed = scenario seed +
  CONFIRM_SEED_OFFSET``), not those of the run they choose for, so a lucky draw can tip
  a near tie but not pick against a real difference;
* they cover ``min(plan horizon, CONFIRM_STEPS)`` steps: the pipeline fill is in them,
  as it is in a run;
* the planner's own prediction stays on the result (``PlanResult.prediction`` is the
  pick's recurrence figure) beside the simulated one, so a user sees both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from bidirl.planner.envelope import Envelope, scenario_with_envelope
from bidirl.planner.plan import PlanResult
from bidirl.sim.run import simulate
from bidirl.sim.scenario import Scenario, ScenarioError

__all__ = ["DEFAULT_K", "CONFIRM_BAND", "CONFIRM_STEPS", "CONFIRM_SEED_OFFSET", "confirm",
           "simulate_envelope"]

DEFAULT_K = 8  # at most this many simulations (the band holds 6 on average on the regret bench)
CONFIRM_BAND = 0.05  # envelopes predicted within 5 % of the best are simulated
CONFIRM_STEPS = 16  # steps simulated per envelope (or the plan's horizon, if shorter)
CONFIRM_SEED_OFFSET = 104_729  # a prime: the lengths drawn are not the run's own

Runner = Callable[[Scenario, Envelope, int, int], float]  # (scenario, envelope, steps, seed) -> tokens/s


def simulate_envelope(sc: Scenario, env: Envelope, steps: int, seed: int,
                      policy: str = "bidirl") -> float:
    """Simulated tokens/s of ``policy`` on ``sc`` with ``env`` (the default runner, for the
    policy the plan is for)."""
    res = simulate(scenario_with_envelope(sc, env), policy, steps=steps, seed=seed,
                   record_intervals=False)
    return res.throughput_tokens_per_s


def confirm(sc: Scenario, result: PlanResult, k: int = DEFAULT_K, band: float = CONFIRM_BAND,
            steps: int | None = None, runner: Runner | None = None,
            progress: Callable[[int, int, dict], None] | None = None) -> PlanResult:
    """``result`` with its pick replaced by the best simulated of its short list: the
    candidates predicted within ``band`` of the best prediction, at most ``k``.

    A short list of fewer than two (``k`` 0 or 1, or no runner-up within the band) returns
    ``result`` unchanged.  The candidates keep the planner's order (its tie-broken pick
    first, then best predicted first), screened-out ones excluded; a simulated tie keeps
    that order.  The returned result's ``confirmed`` lists each one's predicted and
    simulated tokens/s (``rank``: the planner's order); an envelope the simulator refuses
    (``ScenarioError``, e.g. a role that does not fit) gets ``simulated_tokens_per_s: None``
    and the reason, and is not picked.  ``runner`` (default ``simulate_envelope``) runs
    the policy the plan is for (``result.policy``).  ``progress(i, n, row)`` is called
    after each simulation (the CLI prints it: at 1,024 devices one takes ~2 s).
    """
    if k < 0:
        raise ValueError(f"k (envelopes to confirm by simulation) must be >= 0, got {k}")
    if not 0.0 <= band < 1.0:
        raise ValueError(f"band (share of the best prediction) must be in [0, 1), got {band}")
    ranked = [c for c in result.candidates if not c.prediction.screened_out]
    top = max((c.prediction.tokens_per_s for c in ranked), default=0.0)
    shortlist = [c for c in ranked if c.prediction.tokens_per_s >= (1.0 - band) * top][:k]
    if len(shortlist) < 2:
        return result
    runner = runner or partial(simulate_envelope, policy=result.policy)
    horizon = min(steps or result.steps or CONFIRM_STEPS, CONFIRM_STEPS)
    seed = sc.seed + CONFIRM_SEED_OFFSET
    rows, t0 = [], time.perf_counter()
    for rank, c in enumerate(shortlist):
        row = {"rank": rank, "envelope": c.envelope.label(),
               "predicted_tokens_per_s": round(c.prediction.tokens_per_s, 2)}
        try:
            row["simulated_tokens_per_s"] = round(runner(sc, c.envelope, horizon, seed), 2)
        except ScenarioError as e:
            row.update(simulated_tokens_per_s=None, refused=str(e))
        rows.append(row)
        if progress is not None:
            progress(rank + 1, len(shortlist), row)
    ran = [i for i, r in enumerate(rows) if r["simulated_tokens_per_s"] is not None]
    if not ran:  # nothing simulated: the planner's pick stands, with the reasons
        return replace(result, confirmed=rows, confirm_steps=horizon, confirm_seed=seed,
                       confirm_s=time.perf_counter() - t0, planner_pick=result.envelope)
    best = max(ran, key=lambda i: (rows[i]["simulated_tokens_per_s"], -i))
    pick = shortlist[best]
    order = [pick] + [c for c in result.candidates if c is not pick]
    return replace(result, envelope=pick.envelope, prediction=pick.prediction,
                   alternatives=order[:len(result.alternatives)], candidates=order,
                   confirmed=rows, confirm_steps=horizon, confirm_seed=seed,
                   confirm_s=time.perf_counter() - t0, planner_pick=result.envelope)
