"""The join rule at both queue depths a primary rank may keep (``policy.split``).

At depth 2 a rank's next micro-batch is claimed as soon as its current one starts the queued
one, so a joiner that arrives with two left takes nothing; at depth 1 it takes the one that
would have been queued, and the rank claims the rest one by one as each ends; a step alone
ends at the same time at both depths."""

from __future__ import annotations

import pytest

from bidirl.policy import split
from bidirl.policy.split import rank_progress, steal_schedule

ITEMS = [[(i, 1.0) for i in range(4)]]  # one rank, four micro-batches of 1 s from t = 0
AUX = {i: 0.8 for i in range(4)}


def test_depth_2_holds_the_queued_one_and_the_joiner_takes_nothing():
    p = rank_progress(ITEMS, 0.0, 2.5, depth=2)  # computing #2, #3 queued behind it
    assert p[0].current_end_s == 3.0 and p[0].queued_s == 1.0 and p[0].todo == ()
    plan = steal_schedule(p, [2.5], AUX)
    assert plan.stolen == ((),) and plan.primary_end_s == 4.0


def test_depth_1_leaves_it_to_the_joiner_and_the_step_ends_sooner():
    p = rank_progress(ITEMS, 0.0, 2.5, depth=1)
    assert p[0].queued_s is None and p[0].todo == ((3, 1.0),)
    plan = steal_schedule(p, [2.5], AUX)
    assert plan.stolen == (((3, 2.5),),)
    assert plan.primary_end_s == 3.0 and plan.aux_end_s == (pytest.approx(3.3),)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_rank_alone_computes_all_it_has_at_either_depth(depth):
    """No joiner: the rank claims its todo one by one and ends when the last one ends."""
    items = [[(i, 0.5 + 0.1 * i) for i in range(6)]]
    plan = steal_schedule(rank_progress(items, 0.0, 0.7, depth=depth), [], {})
    assert plan.primary_end_s == pytest.approx(sum(x for _, x in items[0]))


def test_a_late_joiner_at_depth_1_takes_from_the_tail_only_what_is_left():
    """Computing #0 with #1..#3 unclaimed, a joiner free at 0.5 takes #3 (0.5-1.3), the rank
    claims #1 when #0 ends (1.0-2.0), the joiner takes #2 (1.3-2.1); nothing is left twice."""
    p = rank_progress(ITEMS, 0.0, 0.5, depth=1)
    plan = steal_schedule(p, [0.5], AUX)
    assert plan.stolen == (((3, 0.5), (2, pytest.approx(1.3))),)
    assert plan.primary_end_s == 2.0 and plan.aux_end_s == (pytest.approx(2.1),)


def test_the_default_is_the_modules_depth(monkeypatch):
    monkeypatch.setattr(split, "PRIMARY_DEPTH", 1)
    assert rank_progress(ITEMS, 0.0, 2.5)[0].queued_s is None
    monkeypatch.setattr(split, "PRIMARY_DEPTH", 2)
    assert rank_progress(ITEMS, 0.0, 2.5)[0].queued_s == 1.0


def test_an_unknown_depth_is_refused():
    with pytest.raises(ValueError, match="depth: 3 calls .* allowed: 1, 2"):
        rank_progress(ITEMS, 0.0, 1.0, depth=3)
