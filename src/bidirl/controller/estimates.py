"""The scheduler's beliefs: calibrated stage-time models, switch costs, workload statistics.

Everything a policy predicts goes through here, so that the admission rule and the work
split use the same numbers, and so that those numbers improve as measurements arrive
(``StageMeasured`` events feed ``perf.stage_models``; lend/reclaim costs feed
``perf.switch_costs.SwitchCostEstimator``).  Workload statistics (mean response length,
how long a group takes from start to completion) are exponential moving averages: the
paper uses no length prediction, and neither do we.  The keep rate of DAPO's dynamic
sampling (the share of completed groups not filtered) is measured the same way, over a
recent window (``KeepRate``).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from bidirl.controller.actions import MicroBatch
from bidirl.controller.cluster import ClusterSpec
from bidirl.perf.calibration import SCALE_WINDOW, WARMUP, LinearTimeModel
from bidirl.perf.stage_models import RolloutStageModel, TrainStageModel, weight_sync_prior
from bidirl.perf.switch_costs import SwitchCostEstimator, switch_priors

# The stage models each admission's prediction rests on (its margin uses their error).
ADMISSION_MODELS = {"roll_on_train": ("decode",),
                    "train_on_roll": ("train_micro", "aux_micro", "decode")}
EMA_ALPHA = 0.02  # ~50 samples of memory: follows drift in response lengths, ignores noise
AUX_WARM_MEASUREMENTS = 4  # auxiliary micro-batch measurements before its own model is trusted
AUX_CHOICE_WINDOW = 8  # recent measurements on which the auxiliary's two candidates are compared


class AuxMicroModel:
    """An auxiliary trainer's micro-batch time: the primary rank's calibrated model, scaled
    by the devices each has and by the ratio the auxiliary's own measurements show, unless
    its own fit has predicted them better.

    An auxiliary that has not computed yet runs on the same kind of device as a primary
    rank: the primary's model (fitted on many more measurements, once it has any) is a far
    better guess than the roofline prior (which sized the first real shares several-fold
    off), and it stays the better one while the auxiliary has a handful of measurements of
    its own (1-12 a run on this machine's real runs): a three-coefficient fit of so few
    scatters far more than the one ratio ``measured / (primary's prediction x scale)``,
    learned as the median of their logarithms, pulled toward 1 while there are few.  The
    primary's prediction includes its drift: on a shared machine a slow spell slows every
    core, the auxiliary's too.  Both candidates
    are scored on every measurement before it is learned; the one with the lower recent
    median error predicts (the primary's until the auxiliary has ``warm`` measurements).
    The rule lives here, not in a policy, so that the error this model reports is the
    error of the prediction the scheduler used.  Everything else (``theta``,
    ``observations``, the robust scale) is the auxiliary's own model's.
    """

    def __init__(self, own: LinearTimeModel, primary: LinearTimeModel, scale: float,
                 warm: int = AUX_WARM_MEASUREMENTS) -> None:
        self.own, self.primary, self.scale, self.warm = own, primary, scale, warm
        self.errors: deque[float] = deque(maxlen=4096)  # of the prediction used
        self._recent: deque[float] = deque(maxlen=SCALE_WINDOW)
        self._log_ratio: deque[float] = deque(maxlen=SCALE_WINDOW)
        self._err_from_primary: deque[float] = deque(maxlen=AUX_CHOICE_WINDOW)
        self._err_own: deque[float] = deque(maxlen=AUX_CHOICE_WINDOW)

    def ratio(self) -> float:
        """The auxiliary's time over the primary's fit x scale: the median of the measured
        log ratios, shrunk toward 0 (ratio 1) by ``n / (n + 1)``."""
        n = len(self._log_ratio)
        return math.exp(median(self._log_ratio) * n / (n + 1)) if n else 1.0

    def _from_primary(self, x) -> float:
        return self.primary.predict(x) * self.scale * self.ratio()

    def borrowing(self) -> bool:
        """Whether predictions come from the primary's model (times the learned ratio)."""
        if not self.primary.observations:
            return False  # a cold primary: its prior is no better than the auxiliary's own
        if self.own.observations < self.warm:
            return True
        return median(self._err_from_primary) <= median(self._err_own)

    def predict(self, x) -> float:
        return self._from_primary(x) if self.borrowing() else self.own.predict(x)

    def observe(self, x, measured_s: float) -> float:
        if measured_s <= 0:
            return 0.0
        used = self.predict(x)
        base = self.primary.predict(x) * self.scale if self.primary.observations else 0.0
        if base > 0:
            self._err_from_primary.append(abs(self._from_primary(x) - measured_s) / measured_s)
            self._log_ratio.append(math.log(measured_s / base))
        self._err_own.append(self.own.observe(x, measured_s))
        err = abs(used - measured_s) / measured_s  # the error of what was used
        self.errors.append(err)
        self._recent.append(err)
        return err

    def median_rel_error(self) -> float | None:
        return median(self.errors) if self.errors else None

    def recent_rel_error(self) -> float | None:
        return median(self._recent) if self._recent else None

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "own":  # copy/pickle probe before ``own`` exists
            raise AttributeError(name)
        return getattr(self.own, name)


class Ema:
    """Exponential moving average that starts from a prior until the first sample."""

    __slots__ = ("value", "alpha", "samples")

    def __init__(self, prior: float, alpha: float = EMA_ALPHA) -> None:
        self.value, self.alpha, self.samples = prior, alpha, 0

    def add(self, x: float) -> None:
        self.samples += 1
        a = max(self.alpha, 1.0 / self.samples)  # plain mean while samples are few
        self.value += a * (x - self.value)


KEEP_WINDOW = 256  # recent group outcomes the keep rate is measured over
KEEP_FLOOR = 0.02  # the least keep rate a prediction divides by (all filtered so far)


class KeepRate:
    """The share of completed groups kept (not filtered) lately: ``(kept + 1) / (seen + 1)``
    over the last ``KEEP_WINDOW`` outcomes, so the prior is 1.0 (nothing filtered) until
    groups complete, and one filtered group at the start does not read as "none kept".  A
    run without dynamic sampling keeps every group: 1.0 throughout."""

    __slots__ = ("recent", "recent_kept", "kept", "seen")

    def __init__(self, window: int = KEEP_WINDOW) -> None:
        self.recent: deque[bool] = deque(maxlen=window)
        self.recent_kept = 0  # kept among ``recent``
        self.kept = 0  # over the whole run
        self.seen = 0

    def add(self, kept: bool) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.recent_kept -= self.recent[0]
        self.recent.append(kept)
        self.recent_kept += kept
        self.kept += kept
        self.seen += 1

    @property
    def value(self) -> float:
        return max(KEEP_FLOOR, (self.recent_kept + 1) / (len(self.recent) + 1))


class Estimates:
    """Calibrated predictions of stage times for one cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        hw, m = spec.profiles()
        scale = spec.prior_scale
        self.spec = spec
        self.rollout = RolloutStageModel(hw, m, spec.rollout_tp, scale, vision_s_per_prompt=spec.prompt_vision_s,
                                         prompt_tokens=spec.prompt_tokens)
        self.train = TrainStageModel(hw, m, spec.train_tp, scale)
        self.aux = TrainStageModel(hw, m, spec.rollout_tp, scale)
        self.aux.micro = AuxMicroModel(self.aux.micro, self.train.micro, spec.train_tp / max(spec.rollout_tp, 1))
        self.switch = SwitchCostEstimator(switch_priors(hw, m, spec.rollout_tp, spec.rollout_tp))
        # t = a + b * GB moved: a delta sync moves less than the weights (runtime/weight_sync.py)
        latency, per_gb = weight_sync_prior(hw, spec.devices > hw.devices_per_node)
        self.weight_sync = LinearTimeModel("weight_sync", (latency * scale, per_gb * scale))
        self.sync_gb = m.weights_bytes / 1e9  # what the next sync is expected to move: the last one's
        # The online-calibrated models, keyed by the ``StageMeasured.stage`` that feeds each.
        self.models = {"decode": self.rollout.decode, "prefill": self.rollout.prefill,
                       "train_micro": self.train.micro, "aux_micro": self.aux.micro,
                       "train_sync": self.train.sync, "weight_sync": self.weight_sync}
        self.colocated: deque[float] = deque(maxlen=8)
        self._colocated_prior = self.switch.estimate("roll_on_train.c_in")
        self.response_len = Ema(spec.max_response_tokens / 4)
        self.group_s = Ema(0.0)
        # Seconds from a batch's last group start to its completion: the long tail.
        self.batch_tail = Ema(0.0, alpha=0.2)
        self.step_s = Ema(0.0, alpha=0.2)  # a whole training step, as measured
        self.keep_rate = KeepRate()  # groups kept / completed (DAPO's dynamic sampling)
        self._optimizer_s = self.train.optimizer_s()

    # -- learning -------------------------------------------------------------------
    def observe(self, stage: str, features: tuple[float, ...], seconds: float) -> None:
        """Feed one measurement to the model of ``stage``."""
        if stage == "weight_sync":
            self.observe_sync(seconds)
        elif stage in self.models:
            self.models[stage].observe(features, seconds)
        elif stage == "colocated_switch":
            self.colocated.append(seconds)
        else:
            self.switch.observe(stage, seconds)

    def learn_start_up(self, switches, weight_loads=()) -> None:
        """What a run measured before its loop, learned before the first decision.

        The real runtime's pre-warm (``runtime/placement.py:prewarm``) times one hot round
        trip of every role a device may be lent for, ``(kind, unit, seconds)`` with ``kind``
        e.g. ``roll_on_train.c_in``, and one weight load on the replicas.  The scheduler
        starts from those instead of the roofline priors (a C_in prior of 0.23 s against
        0.04 s measured turned down the lend of the idle trainer at the start of a run);
        the simulator replays the same for a run it was calibrated on
        (``calibration.prewarmed``).  The weight load is learned, not scored: no
        prediction was used for it.
        """
        for kind, unit, seconds in switches:
            if kind.endswith(".c_in"):  # per node pair: where the weights come from
                self.observe_switch(kind, unit, seconds)
            else:
                self.observe(kind, (), seconds)
        for seconds in weight_loads:
            self.observe_sync(seconds, scored=False)

    def observe_sync(self, seconds: float, bytes_moved: int | None = None, scored: bool = True) -> None:
        """A weight sync's time, at ``bytes_moved`` (None: the whole weights): the per-byte
        cost the model learns once deltas and full syncs both occur."""
        if bytes_moved is not None:
            self.sync_gb = bytes_moved / 1e9
        self.weight_sync.observe((1.0, self.sync_gb), seconds, scored=scored)

    # -- rollout --------------------------------------------------------------------
    def tail_s(self, batch: float) -> float:
        """Predicted time from a batch's last group start to its completion.

        Before anything has completed, half the longest response decoded at ``batch``
        running sequences per replica."""
        if self.batch_tail.samples:
            return self.batch_tail.value
        if self.group_s.samples:
            return 2.0 * self.group_s.value  # the slowest of many groups, not the mean
        s = self.spec
        ctx = s.prompt_tokens + self.response_len.value
        b = max(1.0, batch)
        return s.max_response_tokens / 2 * self.rollout.decode_step_s(b, ctx * b)

    def step_slowdown(self, load_now: float, load_then: float) -> float:
        """How much slower a decode step gets when a replica's batch grows."""
        ctx = self.spec.prompt_tokens + self.response_len.value / 2
        now = self.rollout.decode_step_s(max(load_now, 1.0), max(load_now, 1.0) * ctx)
        then = self.rollout.decode_step_s(max(load_then, 1.0), max(load_then, 1.0) * ctx)
        return max(1.0, then / now) if now > 0 else 1.0

    def replica_rate(self) -> float:
        """Decode tokens/s of one replica kept at its concurrency cap."""
        ctx = self.spec.prompt_tokens + self.response_len.value / 2
        return self.rollout.tokens_per_s(self.spec.replica_cap, ctx)

    # -- training -------------------------------------------------------------------
    def micro_s(self, mb: MicroBatch, aux: bool = False) -> float:
        model = self.aux if aux else self.train
        return model.microbatch_s(mb.tokens, mb.seq_len)

    def merge_s(self) -> float:
        """Primary's work after the last gradient arrives: dp all-reduce + optimizer."""
        s = self.spec
        return self.train.sync_s(s.train_dp, s.train_spans_nodes) + self._optimizer_s

    def weight_sync_s(self) -> float:
        return self.weight_sync.predict((1.0, self.sync_gb))

    # -- switches across nodes ---------------------------------------------------------
    def node_of(self, device: int) -> int:
        """The node of ``device``: consecutive devices share a node (``planner.envelope``)."""
        return device // max(1, self.spec.devices_per_node)

    def switch_pair(self, kind: str, unit: int) -> tuple[int, int]:
        """(source, destination) node of what ``kind`` moves when ``unit`` is lent: the
        newest weights go from the primary trainer's first device to the unit; a gradient
        the other way."""
        here = self.node_of(self.spec.unit_devices(unit)[0])
        weights = self.node_of(self.spec.train_devices[0])
        return (here, weights) if kind.endswith("c_grad") else (weights, here)

    def switch_s(self, kind: str, unit: int | None = None) -> float:
        """Estimated seconds of switch ``kind``; with ``unit``, for that unit's node pair."""
        return self.switch.estimate(kind, None if unit is None else self.switch_pair(kind, unit))

    def observe_switch(self, kind: str, unit: int, seconds: float) -> None:
        self.switch.observe(kind, seconds, self.switch_pair(kind, unit))

    def nearest_first(self, kind: str, units) -> list[int]:
        """``units`` cheapest ``kind`` first; on a tie, the ones on the node holding the newest
        weights first, then by id."""
        def key(u: int) -> tuple[float, bool, int]:
            src, dst = self.switch_pair(kind, u)
            return self.switch_s(kind, u), src != dst, u

        return sorted(units, key=key)

    def colocated_switch_s(self) -> float:
        return median(self.colocated) if self.colocated else self._colocated_prior

    def median_errors(self) -> dict[str, float | None]:
        return {stage: m.median_rel_error() for stage, m in self.models.items()}

    def admission_error(self, direction: str) -> float:
        """The recent median relative error of the models ``direction``'s admission rests
        on (the largest), times the predicted figures: the admission margin.

        A model with fewer than ``WARMUP`` measurements does not count: its few errors say
        more about a cold start (an auxiliary trainer's first backward pass) than about the
        model, and a borrow it vetoed would never measure it again.  The others (decode,
        the primary's micro-batches) still set the margin."""
        errs = (m.recent_rel_error() for m in (self.models[st] for st in ADMISSION_MODELS[direction])
                if m.observations >= WARMUP)
        return max((e for e in errs if e is not None), default=0.0)
