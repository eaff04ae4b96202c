"""The fast forms of the chunk plan agree with the obvious ones they replaced.

``_aux_makespan`` used to bisect on time and ``plan_chunks`` used to scan every round
count; both now search on integers (they run inside the decision that starts a step).
The references below are those slow forms, kept here as the specification.
"""

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from bidirl.policy.split import AuxExecutor, ChunkPlan, _aux_makespan, plan_chunks, split_by_capacity


def makespan_by_enumeration(m: int, micro_s: float, offsets: Counter) -> float:
    """The m-th earliest micro-batch finish over all auxiliaries."""
    finishes = sorted(off + q * micro_s for off, n in offsets.items() for _ in range(n)
                      for q in range(1, m + 1))
    return finishes[m - 1]


def plan_by_scan(n_micro, primary_micro_s, dp, aux, aux_micro_s) -> ChunkPlan:
    """Every round count from the most to the fewest, as the first version did."""
    rounds_all = math.ceil(n_micro / dp)
    best = ChunkPlan(n_micro, tuple(0 for _ in aux), rounds_all * primary_micro_s)
    if not aux or n_micro == 0 or aux_micro_s <= 0:
        return best
    offsets = Counter(a.delay_s + a.tail_s for a in aux)
    for rounds in range(rounds_all - 1, -1, -1):
        n_p = min(n_micro, rounds * dp)
        t_p = rounds * primary_micro_s
        t_a = makespan_by_enumeration(n_micro - n_p, aux_micro_s, offsets) if n_micro > n_p else 0.0
        span = max(t_p, t_a)
        if span < best.makespan_s - 1e-9:
            caps = [max(0, math.floor((t_a - (a.delay_s + a.tail_s)) / aux_micro_s + 1e-9))
                    for a in aux]
            best = ChunkPlan(n_p, tuple(split_by_capacity(n_micro - n_p, caps)), span)
        elif t_p < t_a:
            break
    return best


offsets_st = st.dictionaries(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5, 4.0]), st.integers(1, 4),
                             min_size=1, max_size=3).map(Counter)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 60), st.sampled_from([0.3, 0.7, 1.0, 2.0]), offsets_st)
def test_makespan_is_the_mth_finish(m, micro_s, offsets):
    assert math.isclose(_aux_makespan(m, micro_s, offsets),
                        makespan_by_enumeration(m, micro_s, offsets), abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 80), st.sampled_from([0.5, 1.0, 1.5]), st.integers(1, 8),
       st.lists(st.tuples(st.sampled_from([0.0, 0.5, 2.0]), st.sampled_from([0.0, 0.1, 1.0])),
                max_size=5),
       st.sampled_from([0.5, 1.0, 2.0]))
def test_plan_matches_the_full_scan(n_micro, p_s, dp, delays, a_s):
    aux = [AuxExecutor(10 + i, d, t) for i, (d, t) in enumerate(delays)]
    fast, slow = plan_chunks(n_micro, p_s, dp, aux, a_s), plan_by_scan(n_micro, p_s, dp, aux, a_s)
    assert (fast.primary, fast.aux) == (slow.primary, slow.aux)
    assert math.isclose(fast.makespan_s, slow.makespan_s, abs_tol=1e-9)


def test_roll_admission_sees_the_batch_the_borrowed_replicas_serve():
    """At s = 2 the queue's head is batch b+2: a gain there must count (it used to be cut
    off at b+1, so the rule rejected every borrow the opportunistic ablation profited from)."""
    from bidirl.policy import admission

    step = 10.0
    ready0, free, paid = (50.0, 60.0, 300.0), (50.0, 60.0, 200.0), (50.0, 60.0, 203.0)
    two = admission.roll_on_train(0.0, 4, step, ready0[:2], free[:2], paid[:2], 2.0)
    three = admission.roll_on_train(0.0, 4, step, ready0, free, paid, 2.0)
    assert not two.admit and two.benefit_s == 0.0
    assert three.admit and three.benefit_s == 100.0 and three.cost_s == 3.0
