"""DAPO's zero-spread rule: a group whose training rewards are all equal is filtered."""

from bidirl.algo.dynamic_sampling import zero_spread


def test_all_equal_rewards_have_no_spread_and_any_difference_keeps_the_group():
    assert zero_spread([1.0, 1.0, 1.0, 1.0]) and zero_spread([0.0, 0.0]) and zero_spread([-0.25] * 8)
    assert not zero_spread([1.0, 1.0, 0.0, 1.0])
    assert not zero_spread([0.5, 0.5 + 1e-12])  # compared, not subtracted: no tolerance
    assert not zero_spread([1.0])  # a group of one is kept, as veRL keeps it
