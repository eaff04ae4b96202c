"""The planner's prediction of an envelope's throughput over a run's steps.

Two models of the same run: model A, the steady-state closed form (``closed_form``: one
period equation per borrowing option, fill and drain added), and model B, the
recurrence that follows the run step by step (``pipeline``: bursty fills, per-window
lending, handed-back prefixes).  ``predict`` solves model A for each borrowing option,
keeps the option with the shortest predicted wall time (``none`` on ties: the runtime
lends only when it pays) and returns the geometric mean of the two models, which ranks
and calibrates better than either (measured: docs/notes/2026-11-planner-experiments.md,
blend and screen); docs/planner.md summarises both and reports their measured error.
The planner's screen ranks by model A alone, with tails held at the steady step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from bidirl.planner.closed_form import Steady, evaluate, run_wall_s, solve
from bidirl.planner.cold_start import first_window_units
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope
from bidirl.planner.pipeline import Pipeline, Timeline
from bidirl.planner.stages import _aux_theta, _Model, _model

HORIZON_STEPS = 32  # the recurrence follows at most this many steps, then extrapolates
_WITHOUT_AUX = {"train_on_roll": "none", "both": "roll_on_train"}


@dataclass(frozen=True)
class Prediction:
    tokens_per_s: float  # over the context's ``steps``: geometric mean of the two below
    steady_tokens_per_s: float  # the steady-state closed form (fill and drain added)
    pipeline_tokens_per_s: float | None  # the step-by-step recurrence; None: screened out
    step_time_s: float  # steady-state period with the chosen borrowing
    wall_s: float
    regime: str  # which bound sets the period: rollout, train or staleness
    rollout_s: float  # saturated rollout period of the primary pool (T_fluid)
    latency_s: float  # one batch's rollout latency at the steady state (Lambda)
    train_s: float  # theta with the chosen borrowing
    running_per_replica: float  # b at the steady state
    weight_sync_s: float
    no_borrow_step_s: float
    borrowed: str  # one of context.OPTIONS (the steady-state model's choice)
    lent_windows: int = 0  # recurrence: idle windows that lent trainer units to rollout
    aux_steps: int = 0  # recurrence: steps that used auxiliary trainers
    first_lend: int | None = None  # units the policy lends at t = 0 on its priors (cold_start)
    no_borrow_tokens_per_s: float | None = None  # without borrowing (set in plan's tie band)
    screen: bool = False  # the screen's closed form (tails held at the steady step)

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @property
    def screened_out(self) -> bool:
        """Ranked by the closed form alone: too far below the best to need the recurrence."""
        return self.pipeline_tokens_per_s is None



def predict(ctx: PlanContext, env: Envelope, options: tuple[str, ...] | None = None,
            pipeline: bool = True, first_lend: int | None = None, screen: bool = False) -> Prediction:
    """Predicted throughput of a hot-switch-compatible (sized) envelope.

    Each borrowing option in ``options`` (default: those of the context's policy,
    ``ctx.options``) is solved; the best predicted throughput wins
    (``none`` on ties), as the runtime lends only when it pays.  The prediction is the
    geometric mean of the steady-state closed form and the step-by-step recurrence
    (``pipeline``); ``pipeline=False`` gives the closed form alone (the planner's screen).

    ``first_lend``: trainer units the policy lends at ``t = 0`` (``cold_start``).  The
    full prediction asks the policy; the closed form alone, when not told, assumes it
    lends at the fill whenever lending pays (the screen's optimistic bound, a
    millisecond per envelope cheaper), and ``with_pipeline`` corrects that.

    ``screen`` (with ``pipeline=False``): the planner's screen, every tail held at the
    steady state's step (``stages._held_tail``, O(1)) instead of drained at the load of the
    batches in flight (``stages._tail``, about a millisecond); ``with_pipeline`` redoes
    it drained.
    """
    options = ctx.options if options is None else options
    lends = bool({"roll_on_train", "both"} & set(options))
    if pipeline and lends and first_lend is None:
        first_lend = first_window_units(ctx, env)
    m = _model(ctx, env)
    s = ctx.staleness

    def ceiling() -> float:  # the bisection's upper end, shared by the options
        return ctx._cached(("ceiling", env.key(), screen),
                           lambda: evaluate(m, env, s, "none", 1e9, screen).period)

    def steady(option: str) -> Steady:  # one per envelope, option and tail form in a plan
        near = None if screen else ctx._memo.get(("solve", env.key(), option, True))
        return ctx._cached(("solve", env.key(), option, screen),
                           lambda: solve(m, env, s, option, screen, near.period if near else None,
                                         ceiling()))
    base = steady("none")
    best = None
    for option in options:
        st, end = steady(option), None
        if option in _WITHOUT_AUX and st.period <= (st.theta + m.weight_sync_s) * (1 + 1e-6):
            # Train-bound even with auxiliaries: every step starts at the weight sync that
            # admits a new batch, so no replica is idle (nothing admissible) when the policy
            # lends, only at the first step (the pipeline fill) and at the last s steps
            # (no batch left to admit); the steady state runs without them.
            st, end = steady(_WITHOUT_AUX[option]), st
        wall = run_wall_s(m, env, st, option, ctx.steps, s, end, first_lend != 0, screen)
        if best is None or wall < best[0] * (1 - 1e-9):
            best = (wall, option, st)
    wall, option, st = best
    gate = (st.latency + m.weight_sync_s + st.theta) / (s + 1)
    trained = st.theta + m.weight_sync_s
    regime = ("staleness" if gate >= max(st.fluid, trained) * (1 - 1e-9)
              else "rollout" if st.fluid >= trained else "train")
    steady = ctx.steps * ctx.tokens_per_step / wall
    closed = Prediction(
        tokens_per_s=steady, steady_tokens_per_s=steady, pipeline_tokens_per_s=None,
        step_time_s=st.period, wall_s=wall, regime=regime, rollout_s=base.fluid,
        latency_s=st.latency, train_s=st.theta, running_per_replica=st.running,
        weight_sync_s=m.weight_sync_s, no_borrow_step_s=base.period, borrowed=option,
        first_lend=first_lend if lends else None, screen=screen and not pipeline)
    return with_pipeline(ctx, env, closed, options, m) if pipeline else closed


def with_pipeline(ctx: PlanContext, env: Envelope, closed: Prediction,
                  options: tuple[str, ...] | None = None, m: _Model | None = None) -> Prediction:
    """A closed-form prediction completed with the recurrence: ``sqrt(A x B)``.

    A screen's closed form that assumed a lend at the fill is redone when the policy,
    asked now, declines it.
    """
    options = ctx.options if options is None else options
    lend_roll = bool({"roll_on_train", "both"} & set(options))
    if closed.screen:  # the screen's estimate: the closed form with drained tails
        closed = predict(ctx, env, options, pipeline=False, first_lend=closed.first_lend)
    if closed.first_lend is None and lend_roll:
        first = first_window_units(ctx, env)
        if first == 0 and closed.borrowed in ("roll_on_train", "both"):
            closed = predict(ctx, env, options, pipeline=False, first_lend=0)
        else:
            closed = replace(closed, first_lend=first)
    timeline, pipe_wall = pipeline_timeline(ctx, env, m, lend_roll, bool({"train_on_roll", "both"} & set(options)),
                                            closed.first_lend)
    tokens = ctx.steps * ctx.tokens_per_step
    pipe = tokens / pipe_wall
    combined = math.sqrt(closed.steady_tokens_per_s * pipe)
    return replace(closed, tokens_per_s=combined, pipeline_tokens_per_s=pipe,
                   wall_s=tokens / combined, lent_windows=timeline.lent_windows,
                   aux_steps=timeline.aux_steps)


def pipeline_timeline(ctx: PlanContext, env: Envelope, m: _Model | None = None,
                      lend_roll: bool = True, lend_aux: bool = True,
                      first_lend: int | None = None) -> tuple[Timeline, float]:
    """The recurrence's timeline and its wall time over ``ctx.steps``.

    Rollouter-on-TrainPool is judged window by window inside the recurrence (the policy's
    own rule); a run that never lends is also followed, and the shorter wins, because a
    lend that pays for its own window can still cost the windows after it.  Horizons
    past ``HORIZON_STEPS`` add the recurrence's mean mid-run period per extra step.
    """
    m = m or _model(ctx, env)
    if first_lend is None and lend_roll:
        first_lend = first_window_units(ctx, env)
    pipe = Pipeline(m, env, ctx.staleness, ctx.expected_max(ctx.group_size),
                    lambda idle: _aux_theta(m, env, idle),
                    ctx.rollout_model(env.rollout_tp).prefill_s, ctx.lengths.prompt_tokens,
                    ctx.lengths.mean, first_lend)
    horizon = min(ctx.steps, HORIZON_STEPS)
    extra = ctx.steps - horizon
    best = None
    for lend in ((True, False) if lend_roll else (False,)):
        t = pipe.run(horizon, lend, lend_aux)
        wall = t.wall_s + extra * t.steady_period_s
        if best is None or wall < best[1] * (1 - 1e-9):
            best = (t, wall)
        if not t.lent_windows:  # nothing was lent: the run without lending is this one
            break
    return best
