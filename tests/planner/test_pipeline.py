"""The pipeline recurrence: a hand-computed timeline, its invariants, and how the planner
uses it (blend with the closed form, screen)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from bidirl.planner.context import PlanContext
from bidirl.planner.pipeline import Pipeline
from bidirl.planner.plan import SCREEN, plan
from bidirl.planner.predict import pipeline_timeline, predict
from bidirl.planner.residual import Residual
from bidirl.planner.stages import _Model, _model


@dataclass(frozen=True)
class _Env:
    rollout_replicas: int = 1
    borrowable_replicas: int = 0
    aux_trainer_ranks: int = 0


def _hand_model(**changes) -> _Model:
    """One replica of 4 group slots, groups of 2, a fixed 10 ms decode step (beta = 0)."""
    base = dict(a=0.01, beta=0.0, cap=8.0, group_slots=4, tokens=0.0,
                longest_replica=100.0, staggered=lambda x: 100.0, residual=Residual([100.0]),
                responses=4, group_size=2,
                first_running=8.0, prefill_step_s=0.0, prefill_group_s=0.5, micro_count=1.0,
                micro_s=3.0, aux_micro_s=3.0, max_rank_s=3.0, overhead_s=1.0,
                weight_sync_s=0.25, c_roll=2.0, c_roll_in=1.5, c_train=0.5)
    return _Model(**{**base, **changes})


def test_timeline_matches_a_hand_computed_pipeline():
    """2 groups per batch, 4 slots, s = 1: batches 0 and 1 start at 0 and are ready at
    100 x 10 ms + 0.5 s prefill = 1.5 s; batch k + 2 is admitted at sync_end(k)."""
    m = _hand_model()
    pipe = Pipeline(m, _Env(), s=1, group_longest=100.0, theta_fn=lambda idle: math.inf)
    t = pipe.run(4, lend_roll=False, lend_aux=False)
    theta, w, ready = 4.0, 0.25, 1.5
    e0 = ready + theta  # 5.5: the trainer waits for batch 0
    e1 = e0 + w + theta  # 9.75: batch 1 was ready long ago
    # batch 2 is admitted at sync_end(0) = 5.75, ready at 7.25; step 2 waits for sync_end(1)
    e2 = e1 + w + theta  # 14.0
    # batch 3 is admitted at sync_end(1) = 10.0, ready at 11.5 < sync_end(2) = 14.25
    e3 = e2 + w + theta  # 18.25
    assert t.step_ends_s == pytest.approx((e0, e1, e2, e3))
    assert t.wall_s == pytest.approx(e3)
    assert t.lent_windows == 0 and t.aux_steps == 0


def test_a_full_pool_makes_later_batches_queue_for_slots():
    """4 groups per batch fill the 4 slots: batch 1 starts only when batch 0's groups end
    (tau = 1.5 s), so it is ready at 3.0 s, not 1.5 s."""
    m = _hand_model(responses=8)
    pipe = Pipeline(m, _Env(), s=1, group_longest=100.0, theta_fn=lambda idle: math.inf)
    t = pipe.run(2, lend_roll=False, lend_aux=False)
    e0 = 1.5 + 4.0
    assert t.step_ends_s[0] == pytest.approx(e0)
    assert t.step_ends_s[1] == pytest.approx(max(3.0, e0 + 0.25) + 4.0)


def test_borrowed_replicas_only_help_when_groups_queue():
    """Rollout-bound (0.2 s steps): batch 1 queues behind batch 0, so a borrowed replica
    (up at C_in = 0.2 s) starts it at once and the trainer starts step 1 at 0.2 + 1.5 s
    instead of 3.0 s.  Train-bound, the same borrow would only add C_out: not taken."""
    cheap = dict(responses=8, c_roll_in=0.2, c_roll=0.3)
    env = _Env(borrowable_replicas=1)

    def run(lend: bool, **changes):
        m = _hand_model(**{**cheap, **changes})
        pipe = Pipeline(m, env, s=1, group_longest=100.0, theta_fn=lambda idle: math.inf)
        return pipe.run(2, lend_roll=lend, lend_aux=False)

    fast_train = dict(max_rank_s=0.1, overhead_s=0.1)
    alone, lent = run(False, **fast_train), run(True, **fast_train)
    assert lent.lent_windows == 1
    assert lent.step_ends_s[0] == pytest.approx(1.5 + 0.1 + 0.2)  # + C_out, reclaiming
    assert lent.step_ends_s[1] == pytest.approx(max(1.8 + 0.25, 1.7) + 0.2)
    assert alone.step_ends_s[1] == pytest.approx(3.0 + 0.2)
    assert run(True).lent_windows == 0  # train-bound: the borrow does not pay
    roomy = Pipeline(_hand_model(c_roll_in=0.2, c_roll=0.3, max_rank_s=0.1, overhead_s=0.1),
                     env, s=1, group_longest=100.0,
                     theta_fn=lambda idle: math.inf).run(4, lend_roll=True, lend_aux=False)
    assert roomy.lent_windows == 0  # every admissible group has a primary slot


def test_auxiliary_trainers_shorten_steps_only_on_idle_replicas():
    m = _hand_model()
    fast = Pipeline(m, _Env(aux_trainer_ranks=1), s=1, group_longest=100.0,
                    theta_fn=lambda idle: 2.0 if idle > 0 else 4.0)
    t = fast.run(4, lend_roll=False, lend_aux=True)
    # Step 0: batches 0 and 1 are done and batch 2 waits for version 1: the replica is
    # idle.  Steps 1 and 2 start with the sync that admits a new batch: it has work.
    # Step 3: nothing is left to admit.
    assert t.aux_steps == 2
    assert t.step_ends_s == pytest.approx((3.5, 7.75, 12.0, 14.25))
    # A full pool: batch 1 starts when batch 0 ends, so the replica is busy at step 0.
    busy = Pipeline(_hand_model(responses=8), _Env(aux_trainer_ranks=1), s=1,
                    group_longest=100.0, theta_fn=lambda idle: 2.0 if idle > 0 else 4.0)
    t = busy.run(2, lend_roll=False, lend_aux=True)
    assert t.aux_steps == 1 and t.step_ends_s[0] == pytest.approx(1.5 + 4.0)


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_recurrence_invariants_on_a_real_envelope(make_scenario, staleness):
    """Steps end in order, at least a weight sync plus the fastest step apart; longer runs
    take longer; the chosen lending never loses to not lending."""
    sc = make_scenario(devices=16, staleness=staleness)
    ctx = PlanContext.from_scenario(sc, steps=12)
    env = plan(sc, steps=12).envelope
    m = _model(ctx, env)
    t, wall = pipeline_timeline(ctx, env)
    gaps = [b - a for a, b in zip(t.step_ends_s, t.step_ends_s[1:])]
    assert all(g >= m.weight_sync_s + m.overhead_s - 1e-9 for g in gaps)
    assert wall == pytest.approx(t.wall_s)
    _, no_lend = pipeline_timeline(ctx, env, lend_roll=False)
    assert wall <= no_lend * (1 + 1e-9)
    longer = replace(ctx, steps=24)
    assert pipeline_timeline(longer, env)[1] > wall


def test_long_runs_extrapolate_the_mid_run_period(make_scenario):
    sc = make_scenario(devices=16)
    env = plan(sc, steps=10).envelope
    ctx = PlanContext.from_scenario(sc, steps=1000)
    t, wall = pipeline_timeline(ctx, env)
    assert len(t.step_ends_s) < 1000  # the recurrence stops at its horizon
    assert wall == pytest.approx(t.wall_s + (1000 - len(t.step_ends_s)) * t.steady_period_s)


def test_prediction_blends_the_two_models(make_scenario):
    sc = make_scenario(devices=16, staleness=2)
    ctx = PlanContext.from_scenario(sc, steps=8)
    p = predict(ctx, plan(sc, steps=8).envelope)
    assert p.tokens_per_s == pytest.approx(math.sqrt(p.steady_tokens_per_s
                                                     * p.pipeline_tokens_per_s))
    closed = predict(ctx, plan(sc, steps=8).envelope, pipeline=False)
    assert closed.screened_out and closed.tokens_per_s == closed.steady_tokens_per_s


def test_screen_keeps_every_candidate_near_the_best_closed_form(make_scenario):
    sc = make_scenario(devices=24, staleness=2)
    res = plan(sc, steps=8)
    ctx = PlanContext.from_scenario(sc, steps=8)
    # the screen's closed form (the pipeline pass may redo it, when the policy would not lend at the fill)
    screen = {c.envelope: predict(ctx, c.envelope, pipeline=False).steady_tokens_per_s for c in res.candidates}
    top = max(screen.values())
    for c in res.candidates:
        near = screen[c.envelope] >= SCREEN * top
        assert c.prediction.screened_out is not near
    assert not res.prediction.screened_out
    ranked = [c.prediction.screened_out for c in res.candidates]
    assert ranked == sorted(ranked)  # screened-out candidates come last
