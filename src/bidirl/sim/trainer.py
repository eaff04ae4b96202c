"""The simulated trainer: training steps in flight, and auxiliaries joining them.

A step's timeline is planned when it starts (``sim/training.py:plan_step``); its parts are
timed callbacks, and its measurements reach the controller when the real runtime would
deliver them.  A ``JoinStep`` re-plans the step in progress: the joining auxiliary takes
unclaimed micro-batches from the tail (``policy.split.steal_schedule`` on true times), and
the primary's idle time, the merge and the step's end move with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bidirl.controller.actions import JoinStep, StartTrainStep
from bidirl.controller.events import ChunkComputed, StageMeasured, TrainStepFinished
from bidirl.frame.device_time import BUSY, IDLE, SWITCHING
from bidirl.policy.split import rank_progress, steal_schedule
from bidirl.sim.context import WAITING, SimContext
from bidirl.sim.training import StepTimeline, micro_features, micro_times, plan_step


@dataclass
class TrainedWork:
    """What the trainer did: tokens trained, device-seconds of training, step end times."""

    tokens: int = 0
    device_s: float = 0.0
    step_ends: list[float] = field(default_factory=list)


@dataclass
class Joiner:
    """An auxiliary that joined a step in progress (``JoinStep``)."""

    unit: int
    start: float
    scale: float  # its noise draw: every micro-batch it computes takes the truth's time x scale
    items: list[tuple[int, float]] = field(default_factory=list)  # (micro-batch, claim time)
    compute_end: float = 0.0
    ship: float | None = None
    arrive: float = 0.0
    token: int = 0


@dataclass
class StepInFlight:
    """The step being trained, for a join to re-plan: what is known when it started."""

    action: StartTrainStep
    start: float
    tl: StepTimeline
    static_arrive: float  # when the last chunk of the plan's auxiliaries arrives
    after_s: float  # all-reduce + optimizer + per-step overhead after the merge starts
    joiners: dict[int, Joiner] = field(default_factory=dict)
    token: int = 0


class SimTrainer:
    """Carries out ``StartTrainStep`` and ``JoinStep`` on the simulated training devices."""

    def __init__(self, sim: SimContext) -> None:
        self.sim = sim
        self.ready_at: dict[int, float] = {}  # lent auxiliary trainers: when each is up (after C_in)
        self.version = 0  # the newest weights trained
        self.trained = TrainedWork()
        self.step: StepInFlight | None = None

    def start(self, a: StartTrainStep) -> None:
        sim, spec = self.sim, self.sim.spec
        now = sim.env.now
        tl = plan_step(a, now, spec, sim.truth, self.ready_at, sim.hosting.colocated, sim.noise)
        devs = spec.train_devices
        sim.rec.set(devs, now, BUSY, "train", f"step {a.step}")
        for run in tl.aux:
            d = spec.unit_devices(run.unit)
            role = "aux_train"
            sim.at(run.start, sim.rec.set, d, run.start, BUSY, role, f"aux step {a.step}", True)
            if run.arrive > run.compute_end:
                sim.at(run.compute_end, sim.rec.set, d, run.compute_end, SWITCHING, role,
                       "C_grad", True)
            sim.at(run.arrive, sim.rec.set, d, run.arrive, IDLE, role, WAITING, True)
            sim.at(run.arrive, sim.deliver, ChunkComputed(run.unit, a.step))
        for t, m in tl.measurements:
            sim.at(t, sim.deliver, m)
        self.trained.device_s += tl.device_seconds
        self.trained.tokens += sum(mb.tokens for mb in a.micro_batches)
        st = StepInFlight(a, now, tl, max((r.arrive for r in tl.aux), default=now), tl.end - tl.merge_start)
        self.step = st
        for t, done in tl.primary_rounds:
            sim.at(t, self._primary_measured, st, done)
        self._schedule_end(st)

    def _primary_measured(self, st: StepInFlight, done: list[tuple[int, float]]) -> None:
        """A round of the primary's micro-batches is done: those no joiner took meanwhile."""
        taken = {k for j in st.joiners.values() for k, _ in j.items}
        own = [(i, sec) for i, sec in done if i not in taken]
        if own:
            feats = micro_features(st.action.micro_batches[i] for i, _ in own)
            self.sim.deliver(StageMeasured("train_micro", feats, sum(sec for _, sec in own)))

    def _schedule_end(self, st: StepInFlight) -> None:
        """(Re)schedule the primary's idle time, the merge and the step's end (a join moves them)."""
        sim = self.sim
        st.token += 1
        tok, devs, step = st.token, sim.spec.train_devices, st.action.step
        arrivals = [j.arrive for j in st.joiners.values()]
        merge_start = max([st.tl.primary_end, st.static_arrive] + arrivals)
        end = merge_start + st.after_s

        def at(t, fn, *args):
            sim.at(t, lambda: tok == st.token and fn(*args))

        if merge_start > st.tl.primary_end:
            at(st.tl.primary_end, sim.rec.set, devs, st.tl.primary_end, IDLE, "train", WAITING)
        at(merge_start, sim.rec.set, devs, merge_start, BUSY, "train", f"step {step} merge")
        at(end, self._stepped, step, end - st.start, st.tl.sync_measurement)

    def join(self, a: JoinStep) -> None:
        """Auxiliary ``a.unit`` takes unclaimed micro-batches from the tail (``steal_schedule``
        on true times); earlier joiners of the step are re-planned from what they hold."""
        sim, truth = self.sim, self.sim.truth
        st, now, u = self.step, sim.env.now, a.unit
        if st is None or st.action.step != a.step or self.version > a.step:
            sim.deliver(ChunkComputed(u, a.step))
            return
        fixed = {j: [x for x in run.items if x[1] <= now] for j, run in st.joiners.items()}
        taken = {i for items in fixed.values() for i, _ in items}
        aux_micro = dict(enumerate(micro_times(truth.aux.micro.theta, st.action.micro_batches)))
        micro = micro_times(truth.train.micro.theta, st.action.micro_batches)
        ranks = [[(i, micro[i] * f) for i in idx if i not in taken]
                 for idx, f in zip(st.tl.rank_items, st.tl.rank_factor)]
        progress = rank_progress(ranks, st.start, now)
        # A joiner that is done (its chunk delivered) keeps what it had; the others go on.
        runs = [j for j in st.joiners.values() if not (j.token and j.arrive <= now)]
        runs.append(Joiner(u, now, sim.noise()))
        free = [max(now, j.start + sum(aux_micro[i] * j.scale for i, _ in fixed.get(j.unit, ()))) for j in runs]
        plan = steal_schedule(progress, free, aux_micro, [j.scale for j in runs])
        st.tl.primary_end = plan.primary_end_s
        if not plan.stolen[-1]:  # nothing left to take: it may go home at once
            sim.deliver(ChunkComputed(u, a.step))
            return
        for j, new in zip(runs, plan.stolen):
            j.items = fixed.get(j.unit, []) + list(new)
            j.compute_end = j.start + sum(aux_micro[i] * j.scale for i, _ in j.items)
            if j.ship is None and j.items:
                j.ship = truth.switch["train_on_roll.c_grad"] * sim.noise()
            j.arrive = j.compute_end + (j.ship or 0.0)
            j.token += 1
            self._schedule_joiner(st, j)
        st.joiners[u] = runs[-1]
        sim.rec.set(sim.spec.unit_devices(u), now, BUSY, "aux_train", f"aux step {a.step}", True)
        self._schedule_end(st)

    def _schedule_joiner(self, st: StepInFlight, j: Joiner) -> None:
        sim = self.sim
        tok, d, role, step = j.token, sim.spec.unit_devices(j.unit), "aux_train", st.action.step

        def at(t, fn, *args):
            sim.at(t, lambda: tok == j.token and fn(*args))

        if j.arrive > j.compute_end:
            at(j.compute_end, sim.rec.set, d, j.compute_end, SWITCHING, role, "C_grad", True)
        at(j.arrive, sim.rec.set, d, j.arrive, IDLE, role, WAITING, True)
        feats = micro_features(st.action.micro_batches[i] for i, _ in j.items)
        done = [ChunkComputed(j.unit, step)]
        if j.items:
            done = [StageMeasured("aux_micro", feats, j.compute_end - j.start),
                    StageMeasured("train_on_roll.c_grad", (), j.ship)] + done
        for ev in done:
            at(j.arrive, sim.deliver, ev)

    def _stepped(self, step: int, seconds: float, sync: StageMeasured | None = None) -> None:
        sim = self.sim
        if sync is not None:  # the all-reduce is measured once it is done
            sim.deliver(sync)
        self.version = step + 1
        self.trained.step_ends.append(sim.env.now)
        sim.rec.set(sim.spec.train_devices, sim.env.now, IDLE, "train", WAITING)
        sim.deliver(TrainStepFinished(step, step + 1, seconds))
        if step + 1 >= sim.spec.steps:
            sim.finish()
