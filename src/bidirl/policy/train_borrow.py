"""``train-borrow``: ``async`` + idle rollout replicas host auxiliary trainers.

Trainer-on-RollPool.  When a step starts while some replicas are idle (the staleness
bound stops them, or rollout is simply ahead), the policy may lend them as auxiliary
trainers: each loads the primary's current weights (C_in), computes the gradient of a
contiguous chunk of the step's micro-batches and ships it to the primary (C_grad); the
primary merges the chunks in chunk order and alone steps the optimizer.  After the step
the auxiliaries go home (C_out) and take rollout work again.

``AuxLending`` is the mechanism, shared with ``bidirl`` and ``bidirl-opportunistic``.
Guided: at step start, try k = 1, 2, 4, ... idle replicas and keep the k with the best
predicted next-step start (``admission.train_on_roll``), if any beats not borrowing.
A replica that runs dry *while a step is in progress* (it rolled the next batch and the
staleness bound stops it) can join that step (``JoinStep``): once up, it takes the
primary's unclaimed micro-batches from the tail (``split.steal_schedule``).  Guided: only
if the admission predicts that the step, and so the next one's start, comes earlier by
more than the switches cost.  Opportunistic: always.  A replica lent mid-step whose step
ends before it is up joins the next one instead, or goes home first if no replica is
left to roll out that step's batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from bidirl.controller.actions import Action, JoinStep, Lend, MicroBatch, Reclaim
from bidirl.controller.events import (
    ChunkComputed,
    DeviceLent,
    Event,
    GroupsCompleted,
    StageMeasured,
    TrainStepFinished,
)
from bidirl.controller.state import ClusterState, Phase, UnitStatus
from bidirl.core.ledger import Role
from bidirl.policy import admission, predict
from bidirl.policy.asynchronous import AsyncPolicy
from bidirl.policy.base import AWAY, micro_means, micro_times, primary_ranks, reclaim_away, register
from bidirl.policy.split import AuxExecutor, plan_chunks, rank_progress, steal_schedule


class AuxLending:
    """Lend idle rollout replicas as auxiliary trainers."""

    def __init__(self, guided: bool = True) -> None:
        self.guided = guided
        # Joins of a step close when one is judged to gain nothing: the step's remaining work
        # only shrinks, so a later replica would gain nothing either (and at scale, hundreds go
        # idle in a step).  A join rejected for its cost (the next batch still rolling out) is
        # judged again for another replica, each replica once a step.  The first primary
        # measurement of a step reopens them once: a judgement on the prior (a first step)
        # may turn out wrong.
        self._closed = -1  # the step whose joins are closed
        self._judged: set[tuple[int, int]] = set()  # (step, replica) rejected for its cost
        self._measured = -1  # the step whose first primary measurement was seen
        self._joining: dict[int, int] = {}  # unit -> the step it was last lent to join

    def actions(self, s: ClusterState, event: Event) -> Iterator[Action]:
        if isinstance(event, ChunkComputed):  # nothing left for it this step: home to roll out
            if s.units.status[event.unit] is UnitStatus.LENT and event.unit in s.step_chunks:
                yield Reclaim(event.unit)
        elif isinstance(event, TrainStepFinished):
            for u in sorted(s.step_chunks):  # their chunk is merged: send them home
                if s.units.status[u] is UnitStatus.LENT:
                    yield Reclaim(u)
        elif isinstance(event, GroupsCompleted) and self._may_join(s, event.replica):
            yield from self._join(s, event.replica)
        elif (self.guided and isinstance(event, StageMeasured) and event.stage == "train_micro"
              and s.phase is Phase.TRAINING and self._measured != s.next_step):
            self._measured = s.next_step
            if self._closed == s.next_step:
                self._closed = -1
            self._judged = {k for k in self._judged if k[0] > s.next_step}
            for r in sorted(s.units.idle_replicas):
                if self._may_join(s, r):
                    yield from self._join(s, r)
        elif isinstance(event, DeviceLent) and event.unit in self._joining:
            u = event.unit  # lent mid-step: join it if it still runs (else it waits for the next)
            step = self._joining[u]
            if (s.phase is Phase.TRAINING and s.step_action is not None and s.step_action.step == step
                    and s.units.status[u] is UnitStatus.LENT):
                yield JoinStep(u, step)
        if self._stranded(s):
            yield from reclaim_away(s, range(s.spec.n_replicas))

    @staticmethod
    def _may_join(s: ClusterState, r: int) -> bool:
        """Replica ``r`` is home and idle during a step, with nothing it may start (it may have
        computed a chunk of this step already, gone home and rolled the next batch out)."""
        return (s.spec.aux_trainers and r in s.units.idle_replicas and s.phase is Phase.TRAINING
                and not s.units.colocated[r] and s.next_group(r, s.spec.steps - 1) is None)

    def _join(self, s: ClusterState, r: int) -> Iterator[Action]:
        if self.guided and (self._closed == s.next_step or (s.next_step, r) in self._judged):
            return
        d = self.judge_join(s) if self.guided else admission.AdmissionDecision(
            "train_on_roll", s.t, 1, 0.0, 0.0, True, guided=False)
        s.admissions.append(d)
        if not d.admit and d.benefit_s > 0:
            self._judged.add((s.next_step, r))
        elif d.admit:
            self._joining[r] = s.next_step
            yield Lend(r, Role.AUX_TRAIN)
        else:  # nothing to gain: nor will there be for anyone later in this step
            self._closed = s.next_step

    def judge_join(self, s: ClusterState) -> admission.AdmissionDecision:
        """Should an idle replica join the step in progress?

        The step's remaining primary work is laid out as if each rank had computed its
        micro-batches back to back since the step started (``split.rank_progress``); the
        join is then played out on predicted times (``split.steal_schedule``), free (no C_in,
        no C_grad) and paid, and judged like a lend at step start (``admission.train_on_roll``)
        with the replica away until its share is in and it is home again.
        """
        est, spec, a = s.est, s.spec, s.step_action
        p_s, a_s = micro_times(s, a.micro_batches)
        ranks = [[(i, p_s[i]) for i in idx] for idx in primary_ranks(a, spec.train_dp)]
        progress = rank_progress(ranks, s.step_started, s.t)
        aux_micro = dict(enumerate(a_s))
        c_in = est.switch.estimate("train_on_roll.c_in")
        c_grad = est.switch.estimate("train_on_roll.c_grad")
        c_out = est.switch.estimate("train_on_roll.c_out")
        # Auxiliaries already joining (or on their way to) take from the same tail.
        others = [s.t] * sum(1 for u, step in self._joining.items()
                             if step == s.next_step and s.units.status[u] in AWAY)
        base = steal_schedule(progress, others, aux_micro)
        alone = max(base.primary_end_s, max(base.aux_end_s, default=s.t)) - s.t
        free = steal_schedule(progress, others + [s.t], aux_micro)
        paid = steal_schedule(progress, others + [s.t + c_in], aux_micro)
        if not paid.stolen[-1]:
            return admission.decide("train_on_roll", s.t, 0, 0.0, 0.0)
        step_free = max(free.primary_end_s, max(free.aux_end_s)) - s.t
        step_k = max(paid.primary_end_s, paid.aux_end_s[-1] + c_grad, max(paid.aux_end_s[:-1], default=0.0)) - s.t
        b1 = s.next_step + 1
        away = (paid.aux_end_s[-1] - s.t) + c_grad + c_out
        return admission.train_on_roll(
            s.t, 1, alone, step_free, step_k, est.merge_s() + est.weight_sync_s(),
            predict.ready_in(s, b1), predict.ready_in(s, b1, remove=1, remove_s=away),
            error=est.admission_error("train_on_roll"))

    @staticmethod
    def _stranded(s: ClusterState) -> bool:
        """The trainer waits for a batch that nothing can roll out.

        A replica lent mid-step waits for the next step, but that step needs its batch
        first: with every primary replica away as an auxiliary trainer (none on its way
        home) and no borrowed replica on the train pool, no event would ever come, so the
        auxiliaries must go home and roll the batch out.
        """
        return (s.phase is Phase.IDLE and s.pending_sync is None and not s.finished
                and not s.queue.batch_ready(s.next_step) and s.units.trainer_home()
                and all(s.units.status[u] in AWAY for u in range(s.spec.n_replicas)))

    def for_step(self, s: ClusterState, mbs: Sequence[MicroBatch]) -> Iterator[Action]:
        """Lend auxiliaries for the step about to start; returns the executors to use."""
        est = s.est
        c_in = est.switch.estimate("train_on_roll.c_in")
        c_grad = est.switch.estimate("train_on_roll.c_grad")
        ready = []
        for u in range(s.spec.n_replicas):  # once per step
            if s.units.status[u] in AWAY and not s.units.colocated[u]:
                delay = c_in if s.units.status[u] is UnitStatus.LENDING else 0.0
                ready.append(AuxExecutor(u, delay, c_grad))
        new: list[AuxExecutor] = []
        if self.guided and s.spec.aux_trainers and s.units.idle_replicas and mbs:
            # Every replica with nothing running is a candidate, including one that this very
            # event (the weight sync that lets the next batch start) is about to fill: lending
            # it delays that rollout, and the admission prices exactly that delay
            # (``ready_in(remove=k)``).  When training is the bottleneck, the rollout of the
            # next batch fits after the auxiliary's chunk, and that is where the step's
            # bubble on the rollout pool goes.
            idle = est.nearest_first("train_on_roll.c_in", s.units.idle_replicas)  # multi-node: near ones first
            c_idle = max(est.switch_s("train_on_roll.c_in", u) for u in idle)
            new = self._choose(s, mbs, ready, idle, c_idle, c_grad)
        for a in new:
            yield Lend(a.unit, Role.AUX_TRAIN)
        return ready + new

    def _choose(self, s: ClusterState, mbs: Sequence[MicroBatch], ready: list[AuxExecutor],
                idle: list[int], c_in: float, c_grad: float) -> list[AuxExecutor]:
        """The auxiliaries to lend (with their micro-batch caps), or none.

        For k = 1, 2, 4, .. idle replicas, the cap on each one's share trades the step's
        length against the next batch's readiness: a lent replica goes home as soon as
        its chunk is in (``ChunkComputed``) and rolls out again, so a smaller share makes
        the step longer but the next batch earlier.  Where the two cross is found by
        bisection (one grows with the cap, the other shrinks); the capacity-only split
        (no cap) is judged too.
        """
        spec, est = s.spec, s.est
        p_s, a_s = micro_means(s, mbs)
        n, dp = len(mbs), spec.train_dp
        step0 = plan_chunks(n, p_s, dp, ready, a_s).makespan_s
        b1 = s.next_step + 1
        after = est.merge_s() + est.weight_sync_s()
        c_out = est.switch.estimate("train_on_roll.c_out")
        # the steps up to the queue's head follow this one (admission.train_on_roll)
        horizon = range(b1, max(b1, min(s.spec.steps - 1, s.next_step + s.spec.staleness)) + 1)
        ready0 = tuple(predict.ready_in(s, k) for k in horizon)
        step_s = est.step_s.value + est.weight_sync_s()
        best: tuple[admission.AdmissionDecision, list[AuxExecutor]] | None = None
        for k in sorted({min(1 << i, len(idle)) for i in range(len(idle).bit_length() + 1)}):  # 1, 2, 4, .., all
            free = [AuxExecutor(u, 0.0, 0.0) for u in idle[:k]]
            step_free = plan_chunks(n, p_s, dp, ready + free, a_s).makespan_s

            def judge(cap: int | None, k: int = k, step_free: float = step_free):
                paid = [AuxExecutor(u, c_in, c_grad, cap) for u in idle[:k]]
                plan = plan_chunks(n, p_s, dp, ready + paid, a_s)
                shares = plan.aux[len(ready):]
                away = c_in + max(shares, default=0) * a_s + c_grad + c_out
                ready_ks = tuple(predict.ready_in(s, i, remove=k, remove_s=away) for i in horizon)
                ready_k = ready_ks[0]
                d = admission.train_on_roll(s.t, k, step0, step_free, plan.makespan_s, after, ready0, ready_ks,
                                            error=est.admission_error("train_on_roll"), step_s=step_s)
                if sum(1 for m in shares if m) < k:  # a lent replica would get nothing to do
                    d = admission.decide("train_on_roll", s.t, k, d.benefit_s, float("inf"))
                # Does the next batch (not this step) decide when the next step starts?
                return d, paid, plan, ready_k >= plan.makespan_s + after

            d_full, paid_full, plan_full, _ = judge(None)
            q_max = max(plan_full.aux[len(ready):], default=0)
            options = [(d_full, paid_full)]
            lo, hi = 1, max(q_max, 1)
            while lo < hi:  # the smallest cap at which the next batch, not the step, is late
                mid = (lo + hi) // 2
                if judge(mid)[3]:
                    hi = mid
                else:
                    lo = mid + 1
            for q in {lo - 1, lo} - {0}:
                if q < q_max:
                    d, paid, _, _ = judge(q)
                    options.append((d, paid))
            for d, paid in options:
                if best is None or d.net_s > best[0].net_s:
                    best = (d, paid)
        assert best is not None
        s.admissions.append(best[0])
        return best[1] if best[0].admit else []


@register("train-borrow")
class TrainBorrowPolicy(AsyncPolicy):
    lends_rollout_devices = True

    def __init__(self) -> None:
        self.aux = AuxLending(guided=True)
