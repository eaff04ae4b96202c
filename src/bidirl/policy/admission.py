"""Admission: borrow only when the predicted benefit exceeds the predicted switch cost.

Both directions are judged by the same yardstick, *when can the trainer start its next
step*, predicted with the calibrated stage-time models (``controller.estimates``) and the
measured switch costs.  ``benefit_s`` is how much earlier the trainer could start if the
borrowed devices came for free; ``cost_s`` is how much of that the switches (C_in, C_out,
C_grad) and the rollout capacity given away take back.  A borrow is admitted only when
``benefit_s > cost_s``, i.e. only at a predicted gain; the decision record is kept for
metrics (``SimResult.admission``).

Rollouter-on-TrainPool (the trainer waits for batch b)::

    X = queued + half of running work of batches <= b (tokens);  R = primary rollout rate
    no borrow:   ready0 = X / R
    k replicas:  ready_k = C_in + max((X - R C_in) / (R + k r), (X_run - R C_in) / R, 0)
    trainer start: ready0  vs  ready_k + C_out          (running work cannot move)

Trainer-on-RollPool (a step starts; some replicas are idle)::

    step_k  = makespan of the chunk plan with k auxiliaries (startup drain, C_grad)
    ready_k = when batch b+1 is ready if k replicas leave rollout for step_k + C_out
    next start = max(step_k + merge + weight sync, ready_k)   vs   the same with k = 0
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """One borrow decision, with the prediction it was based on."""

    direction: str  # "roll_on_train" or "train_on_roll"
    t: float
    units: int  # how many units the decision would lend
    benefit_s: float
    cost_s: float
    admit: bool
    guided: bool = True  # False: an opportunistic lend (no model consulted)

    @property
    def net_s(self) -> float:
        return self.benefit_s - self.cost_s


def decide(direction: str, t: float, units: int, benefit_s: float, cost_s: float,
           ) -> AdmissionDecision:
    """The rule itself: admit iff something would be lent and benefit exceeds cost."""
    return AdmissionDecision(direction, t, units, benefit_s, cost_s,
                             units > 0 and benefit_s > cost_s)


def rollout_ready_s(work_tokens: float, rate: float, away_rate: float = 0.0,
                    away_s: float = 0.0) -> float:
    """Time to generate ``work_tokens`` at ``rate``, of which ``away_rate`` is missing
    for the first ``away_s`` seconds (replicas lent out)."""
    if work_tokens <= 0:
        return 0.0
    reduced = rate - away_rate
    if reduced <= 0:
        return away_s + work_tokens / rate
    if work_tokens <= reduced * away_s:
        return work_tokens / reduced
    return away_s + (work_tokens - reduced * away_s) / rate


def roll_on_train(t: float, units: int, work_tokens: float, running_tokens: float,
                  pool_rate: float, unit_rate: float, c_in_s: float,
                  c_out_s: float) -> AdmissionDecision:
    """Lend ``units`` idle trainer units as rollout replicas until batch b is ready?"""
    if units <= 0 or pool_rate <= 0 or work_tokens <= 0:
        return decide("roll_on_train", t, 0, 0.0, 0.0)
    ready0 = work_tokens / pool_rate
    extra = units * unit_rate

    def ready(c_in: float) -> float:
        shared = (work_tokens - pool_rate * c_in) / (pool_rate + extra)
        pinned = (running_tokens - pool_rate * c_in) / pool_rate
        return c_in + max(shared, pinned, 0.0)

    free = ready(0.0)
    with_costs = ready(c_in_s) + c_out_s
    return decide("roll_on_train", t, units, ready0 - free, with_costs - free)


def train_on_roll(t: float, units: int, step0_s: float, step_free_s: float,
                  step_k_s: float, after_s: float, next_work_tokens: float,
                  pool_rate: float, unit_rate: float, away_s: float,
                  c_out_s: float) -> AdmissionDecision:
    """Lend ``units`` idle rollout replicas as auxiliary trainers for this step?

    ``step0_s``: predicted step without auxiliaries; ``step_free_s``/``step_k_s``: with
    them, ignoring / including C_in and C_grad.  ``after_s``: merge + weight sync.
    """
    if units <= 0:
        return decide("train_on_roll", t, 0, 0.0, 0.0)

    def next_start(step_s: float, lent: int, away: float) -> float:
        ready = rollout_ready_s(next_work_tokens, pool_rate, lent * unit_rate, away)
        return max(step_s + after_s, ready)

    j0 = next_start(step0_s, 0, 0.0)
    j_free = next_start(step_free_s, units, step_free_s)
    j_cost = next_start(step_k_s, units, away_s + c_out_s)
    return decide("train_on_roll", t, units, j0 - j_free, j_cost - j_free)
