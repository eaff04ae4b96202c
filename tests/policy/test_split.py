import pytest
from hypothesis import given
from hypothesis import strategies as st

from bidirl.policy.split import AuxExecutor, plan_chunks, split_by_capacity


@given(st.integers(0, 500), st.lists(st.floats(0.1, 100), min_size=1, max_size=12))
def test_split_sums_and_is_proportional(n, caps):
    shares = split_by_capacity(n, caps)
    assert sum(shares) == n
    total = sum(caps)
    for share, cap in zip(shares, caps):
        assert abs(share - n * cap / total) < 1 + 1e-9  # largest remainder: within one item
    assert shares == split_by_capacity(n, caps)  # deterministic


def test_split_ties_go_to_lower_index():
    assert split_by_capacity(1, [1, 1, 1]) == [1, 0, 0]
    assert split_by_capacity(5, [2, 1, 1]) == [3, 1, 1]
    assert split_by_capacity(0, [1, 2]) == [0, 0]
    with pytest.raises(ValueError):
        split_by_capacity(3, [0, 0])
    with pytest.raises(ValueError):
        split_by_capacity(-1, [1])


def test_plan_without_aux_keeps_everything():
    plan = plan_chunks(10, 2.0, 4, [], 1.0)
    assert plan.primary == 10 and plan.makespan_s == 6.0  # ceil(10 / 4) rounds


def test_plan_gives_whole_rounds_to_fast_aux():
    aux = [AuxExecutor(u, 0.0, 0.0) for u in range(4)]
    plan = plan_chunks(16, 1.0, 4, aux, 1.0)  # aux as fast as a rank: half each
    assert plan.primary == 8 and sum(plan.aux) == 8 and plan.makespan_s == pytest.approx(2.0)


def test_startup_drain_keeps_work_on_primary():
    late = [AuxExecutor(0, 3.0, 0.5)]
    plan = plan_chunks(8, 1.0, 1, late, 1.0)
    # The aux only starts at 3 s and ships 0.5 s late: it gets what it can finish by
    # the time the primary is done with the rest.
    assert plan.primary + sum(plan.aux) == 8
    assert plan.makespan_s == pytest.approx(max(plan.primary, 3.5 + plan.aux[0]))
    assert plan.aux[0] == 2
    too_late = plan_chunks(8, 1.0, 1, [AuxExecutor(0, 10.0, 0.0)], 1.0)
    assert too_late.primary == 8 and too_late.aux == (0,)


def test_a_cap_limits_the_aux_share_and_the_primary_takes_the_rest():
    free = [AuxExecutor(0, 0.0, 0.0)]
    assert plan_chunks(10, 1.0, 1, free, 1.0).aux == (5,)  # capacity alone: half
    capped = plan_chunks(10, 1.0, 1, [AuxExecutor(0, 0.0, 0.0, cap=2)], 1.0)
    assert capped.aux == (2,) and capped.primary == 8 and capped.makespan_s == pytest.approx(8.0)
    loose = plan_chunks(10, 1.0, 1, [AuxExecutor(0, 0.0, 0.0, cap=9)], 1.0)
    assert loose == plan_chunks(10, 1.0, 1, free, 1.0)  # a cap above the share changes nothing
