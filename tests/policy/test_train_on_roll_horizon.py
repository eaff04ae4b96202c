"""Trainer-on-RollPool is judged up to the queue's head: at staleness >= 2 the batch after
next pays for replicas lent away even when the next one is complete already."""

from bidirl.policy.admission import train_on_roll


def test_a_lend_that_delays_a_later_batch_is_rejected():
    # step 10 s without auxiliaries, 6 s with them (7 s with their switch costs); merge +
    # weight sync 1 s; batch b+1 is complete (0), batch b+2 ready in 30 s, or in 45 s with the
    # replicas away; a later step takes 11 s.
    args = dict(t=0.0, units=4, step0_s=10.0, step_free_s=6.0, step_k_s=7.0, after_s=1.0)
    next_only = train_on_roll(**args, ready0_s=0.0, ready_k_s=0.0)
    assert next_only.admit  # batch b+1 alone: the shorter step is all there is to see
    chain = train_on_roll(**args, ready0_s=(0.0, 30.0), ready_k_s=(0.0, 45.0), step_s=11.0)
    assert not chain.admit and chain.cost_s > chain.benefit_s
    # b+2 decides when step b+2 starts either way: the step saved now is worth nothing
    absorbed = train_on_roll(**args, ready0_s=(0.0, 30.0), ready_k_s=(0.0, 30.0), step_s=11.0)
    assert absorbed.benefit_s == 0.0 and not absorbed.admit
    # b+2 is ready before the chain reaches it: the saving carries through, as at s = 1
    short = train_on_roll(**args, ready0_s=(0.0, 5.0), ready_k_s=(0.0, 5.0), step_s=11.0)
    assert short.admit and short.benefit_s == next_only.benefit_s


def test_one_batch_horizon_is_the_old_rule():
    args = dict(t=0.0, units=2, step0_s=10.0, step_free_s=6.0, step_k_s=7.0, after_s=1.0)
    for r0, rk in ((0.0, 0.0), (9.0, 12.0), (20.0, 20.0)):
        a = train_on_roll(**args, ready0_s=r0, ready_k_s=rk)
        b = train_on_roll(**args, ready0_s=(r0,), ready_k_s=(rk,), step_s=99.0)
        assert (a.benefit_s, a.cost_s, a.admit) == (b.benefit_s, b.cost_s, b.admit)
