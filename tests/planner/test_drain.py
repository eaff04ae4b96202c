"""A batch's tail drains at the load of every batch in flight (``stages._tail``), and the
tokens-in-a-window tables it is built on (``residual.Residual``)."""

from __future__ import annotations

import numpy as np
import pytest

from bidirl.planner.residual import Residual
from bidirl.planner.stages import _drain, _Model
from bidirl.sim.engine import ReplicaEngine

A, C, K, PROMPT = 4e-3, 8e-6, 4e-8, 256  # a decode step: a + c b + k (sum of contexts)


def _model(lengths, responses: int, slots: int = 1000) -> _Model:
    """A replica's constants as ``stages._model`` resolves them: ``beta`` prices a running
    sequence at the time-weighted mean context ``P + E[L^2] / (2 E[L])``."""
    q = np.asarray(lengths, dtype=float)
    beta = C + K * (PROMPT + float((q * q).mean()) / (2 * q.mean()))
    return _Model(a=A, beta=beta, cap=float(slots), group_slots=slots, tokens=0.0,
                  longest_replica=float(q.max()), staggered=lambda x: float(q.max()),
                  residual=Residual(q), responses=responses, group_size=1, first_running=0.0,
                  prefill_step_s=0.0, prefill_group_s=0.0, micro_count=1.0, micro_s=1.0,
                  aux_micro_s=1.0, max_rank_s=1.0, overhead_s=0.0, weight_sync_s=0.0,
                  c_roll=0.0, c_roll_in=0.0, c_train=0.0)


def _engine_drain(lengths) -> float:
    """The simulator's replica: every response admitted at once, run until the last ends."""
    eng = ReplicaEngine((A, C, K), cap=len(lengths), prompt_tokens=PROMPT)
    for gid, n in enumerate(lengths):
        eng.admit(gid, (int(n),), None)
    end = 0.0
    while eng.fin:
        end = eng.next_event_time()
        eng.advance(end)
    return end


@pytest.mark.parametrize("lengths", [[3000] * 64, [500, 1000, 2000, 4000, 8000, 16000] * 8])
def test_a_lone_batch_drains_as_the_simulated_replica_does(lengths):
    """One replica, one batch started at once, nothing else in flight: the tail is
    ``a X + beta (tokens it decodes)``, which is what the engine's step model sums to (to
    the planner's grid of the lengths).  Holding the admission step charges every one of
    the ``X`` steps the full batch: equal for equal lengths, too long otherwise."""
    m = _model(lengths, len(lengths))
    full = A + m.beta * len(lengths)
    tail = _drain(m, max(lengths), full, ((0.0, 0.0, float(len(lengths))),))
    assert tail == pytest.approx(_engine_drain(lengths), rel=1e-3)
    held = max(lengths) * full
    assert tail == pytest.approx(held) if len(set(lengths)) == 1 else tail < 0.9 * held


def test_groups_started_in_the_tail_slow_it_and_finished_ones_do_not():
    lengths = [1000, 2000, 4000, 8000] * 16
    m = _model(lengths, len(lengths))
    own = ((0.0, 0.0, 64.0),)
    alone = _drain(m, 8000, A + m.beta * 64, own)
    refill = _drain(m, 8000, A + m.beta * 64, own + ((5.0, 10.0, 64.0),))
    long_done = _drain(m, 8000, A + m.beta * 64, own + ((-1e4, -9e3, 64.0),))
    assert refill > alone
    assert long_done == pytest.approx(alone)


def test_the_load_is_capped_by_the_replicas_slots():
    lengths = [4000] * 8
    m = _model(lengths, 8, slots=1)  # one group of one response at a time
    crowded = _drain(m, 4000, A, ((0.0, 0.0, 500.0),))
    assert crowded == pytest.approx(4000 * (A + m.beta * m.full_running))


def test_the_slowest_of_several_replicas_sets_the_tail_only_when_lengths_vary():
    varied = [500, 1000, 2000, 4000, 8000, 16000] * 8
    m = _model(varied, 48)
    w = ((0.0, 0.0, 48.0),)
    one, eight = _drain(m, 16000, A, w, 1), _drain(m, 16000, A, w, 8)
    assert eight > one
    same = _model([3000] * 48, 48)
    assert _drain(same, 3000, A, w, 8) == pytest.approx(_drain(same, 3000, A, w, 1))


def test_residual_windows_match_a_brute_force_mean():
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.exp(rng.normal(np.log(3000), 0.9, 3000)), 16384)
    r = Residual(lengths)

    def brute(x, lo, hi):
        offs = np.linspace(lo, hi, 601)
        return np.mean([np.mean(np.maximum(lengths - max(0.0, -o), 0)
                                - np.maximum(lengths - max(0.0, x - o), 0)) for o in offs])

    for x, lo, hi in ((16000, -3000, 0), (5000, -100, 4000), (8000, 2000, 2000), (3000, -2e4, -1e4),
                      (3000, 4000, 9000)):
        assert r.in_window(x, lo, hi) == pytest.approx(brute(x, lo, hi), rel=2e-3, abs=0.5)
    assert r.left(0) == pytest.approx(lengths.mean())
    assert r.left(5000) == pytest.approx(np.maximum(lengths - 5000, 0).mean())
    assert r.in_window(1e6, 0.0, 0.0) == pytest.approx(lengths.mean())  # the whole response
