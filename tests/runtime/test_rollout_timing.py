"""The rollout replica's step timing, without an engine: decode steps pass through, prefill
steps gather into bursts measured beyond the recent decode steps' median."""

from __future__ import annotations

import pytest

from bidirl.runtime.messages import PrefillBurst
from bidirl.runtime.rollout_timing import DECODE_REF_STEPS, StepTiming


def test_decode_steps_are_reported_as_they_ran_and_taken_once():
    t = StepTiming()
    t.decode_step(3, 300, 0.010)
    t.decode_step(4, 420, 0.012)
    assert t.take() == ([(3, 300, 0.010), (4, 420, 0.012)], [])
    assert t.take() == ([], [])


def test_a_burst_sums_its_steps_and_is_measured_beyond_the_recent_decode_median():
    t = StepTiming()
    for s in (0.010, 0.050, 0.012, 0.011):  # the first falls out of the last DECODE_REF_STEPS
        t.decode_step(2, 100, s)
    assert DECODE_REF_STEPS == 3  # median of 0.050, 0.012, 0.011: 0.012
    t.prefill_step(24, 0.030, decoding=2, context=110, burst_over=False)
    t.prefill_step(12, 0.020, decoding=3, context=140, burst_over=True)
    _, bursts = t.take()
    assert len(bursts) == 1
    b = bursts[0]
    assert (b.tokens, b.steps, b.batch, b.context) == (36, 2, 5, 250)
    assert b.seconds == pytest.approx(0.050)
    assert b.beyond_median_s == pytest.approx((0.030 - 0.012) + (0.020 - 0.012))


def test_a_burst_with_nothing_decoding_is_all_prefill_and_never_below_zero():
    t = StepTiming()
    t.decode_step(2, 100, 0.5)
    t.prefill_step(10, 0.02, decoding=0, context=0, burst_over=True)  # nothing decoded: no reference
    t.prefill_step(10, 0.02, decoding=1, context=50, burst_over=True)  # faster than the reference
    _, bursts = t.take()
    assert [b.beyond_median_s for b in bursts] == [pytest.approx(0.02), 0.0]
    assert all(isinstance(b, PrefillBurst) for b in bursts)


def test_a_burst_cut_short_measures_nothing():
    t = StepTiming()
    t.prefill_step(10, 0.02, decoding=0, context=0, burst_over=False)
    t.cut_burst()
    t.prefill_step(5, 0.01, decoding=0, context=0, burst_over=True)
    _, bursts = t.take()
    assert [(b.tokens, b.steps) for b in bursts] == [(5, 1)]
