"""Admission: borrow only when the predicted benefit exceeds the switch cost and the doubt.

Both directions are judged by one yardstick, *when can the trainer start its next
step*, predicted with the calibrated stage-time models and the measured switch costs
(``policy.predict``).  ``benefit_s`` is how much earlier the trainer could start if the
borrow were free (no C_in / C_out / C_grad, no rollout capacity given away); ``cost_s`` is
how much of that the switches and the lost capacity take back.  A borrow is admitted
only when ``benefit_s > cost_s + margin_s``: at a predicted gain that the models' own
error cannot explain away.  ``margin_s = error * (benefit_s + cost_s)`` where ``error`` is
the recent median relative error of the stage models the prediction rests on
(``Estimates.admission_error``), so the rule reads *the benefit shrunk by the models'
error still beats the cost inflated by it*.  With models that predict well (the
simulator: a few percent) the margin is a few percent of the figures and changes only
decisions that were a coin toss; on a noisy machine (30 % error) a borrow must promise
about twice its cost.  Every decision record is kept for metrics (``SimResult.admission``).

Rollouter-on-TrainPool (the trainer waits for batch b; the borrowed replicas run the
queue's head, batch h in b+1..b+s, so the horizon is the start of step h)::

    start(b) = ready(b) [+ C_out];  start(i+1) = max(start(i) + step + weight sync, ready(i+1))
    ready_k: k more replicas after C_in

(With h = b+1 this is the two-step rule max(ready(b) [+ C_out] + step, ready(b+1)).  A
horizon of b+1 alone misses the whole benefit at s >= 2, where the queue's head is b+2.)

Trainer-on-RollPool (a step starts while k replicas are idle; the steps up to the queue's
head, b+1 .. b+s, follow it)::

    start(b+1) = max(step + merge + weight sync, ready(b+1));
    start(i+1) = max(start(i) + step + weight sync, ready(i+1))        judged at start(b+s)
    step_k: chunk plan with k auxiliaries (startup drain, C_grad);
    ready_k(i): k replicas away for step_k + C_out, the others more crowded

(At s = 1 this is ``max(step + merge + weight sync, ready(b+1))``.  At s >= 2 the next batch
is often complete already, so a horizon of b+1 alone sees no cost in lending every idle
replica, while the batches being rolled out, b+2 .. b+s, pay for it; measured on the paper
grid, that made ``bidirl`` lose to ``bidirl-opportunistic`` by up to 7 % at s = 2.)
"""

from __future__ import annotations

from collections.abc import Sequence
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
    margin_s: float = 0.0  # the doubt: models' recent relative error x (benefit + cost)

    @property
    def net_s(self) -> float:
        """The gain one can count on: benefit beyond cost and margin."""
        return self.benefit_s - self.cost_s - self.margin_s


def decide(direction: str, t: float, units: int, benefit_s: float, cost_s: float,
           error: float = 0.0) -> AdmissionDecision:
    """The rule itself: admit iff something would be lent and the benefit exceeds the cost
    plus the margin ``error * (benefit + cost)`` (``error``: the models' relative error)."""
    margin = error * (abs(benefit_s) + abs(cost_s)) if error > 0 else 0.0
    return AdmissionDecision(direction, t, units, benefit_s, cost_s,
                             units > 0 and benefit_s > cost_s + margin, margin_s=margin)


def roll_on_train(t: float, units: int, step_s: float, ready0: tuple[float, ...],
                  ready_free: tuple[float, ...], ready_k: tuple[float, ...],
                  c_out_s: float, error: float = 0.0) -> AdmissionDecision:
    """Lend ``units`` idle trainer units as rollout replicas until batch b is ready?

    Judged over the steps the borrowed replicas work for: while the trainer waits for
    batch b they take the queue's head, a batch in b+1..b+s.  Each ``ready*`` holds the
    seconds until batches b, b+1, ... are ready without borrowing, with free borrowed
    replicas, and with C_in paid.  ``step_s``: the trainer's step plus weight sync.  The
    trainer starts step b at ready(b) (+ C_out when it must reclaim first) and each later
    step at max(previous start + step_s, ready); the benefit is how much earlier the last
    of those steps starts.  ``error``: the models' relative error (the margin, see above).
    """
    if units <= 0:
        return decide("roll_on_train", t, 0, 0.0, 0.0)
    j0 = last_start(ready0, step_s, 0.0)
    j_free = min(j0, last_start(ready_free, step_s, 0.0))
    return decide("roll_on_train", t, units, j0 - j_free, last_start(ready_k, step_s, c_out_s) - j_free,
                  error)


def last_start(ready: Sequence[float], step_s: float, c_out: float) -> float:
    """When the trainer starts the last of the steps whose batches are ready at ``ready``:
    the first at ``ready[0] + c_out``, each later one at ``max(previous + step_s, ready)``."""
    j = ready[0] + c_out
    for r in ready[1:]:
        j = max(j + step_s, r)
    return j


def train_on_roll(t: float, units: int, step0_s: float, step_free_s: float,
                  step_k_s: float, after_s: float, ready0_s: float | Sequence[float],
                  ready_k_s: float | Sequence[float], error: float = 0.0,
                  step_s: float = 0.0) -> AdmissionDecision:
    """Lend ``units`` idle rollout replicas as auxiliary trainers for this step?

    ``step0_s``: predicted step (until the last gradient is in) without auxiliaries;
    ``step_free_s`` / ``step_k_s``: with them, ignoring / including C_in and C_grad.
    ``after_s``: merge + weight sync.  ``ready0_s`` / ``ready_k_s``: when the next batches
    (b+1, then up to the queue's head) are complete without / with the replicas lent away;
    a single number is batch b+1 alone.  ``step_s``: a later step plus weight sync (the
    chain).  ``error``: the models' relative error (the margin, see above).
    """
    if units <= 0:
        return decide("train_on_roll", t, 0, 0.0, 0.0)
    r0 = (ready0_s,) if isinstance(ready0_s, (int, float)) else tuple(ready0_s)
    rk = (ready_k_s,) if isinstance(ready_k_s, (int, float)) else tuple(ready_k_s)

    def chain(step: float, ready: tuple[float, ...]) -> float:
        return last_start((max(step + after_s, ready[0]),) + ready[1:], step_s, 0.0)

    j0 = chain(step0_s, r0)
    j_free = chain(min(step_free_s, step0_s), r0)
    return decide("train_on_roll", t, units, j0 - j_free, chain(step_k_s, rk) - j_free, error)
