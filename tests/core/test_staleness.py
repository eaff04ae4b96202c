import pytest

from bidirl.core.staleness import (
    StalenessError,
    batch_of,
    check_trainable,
    may_start,
)


def test_batch_is_fixed_by_data_order():
    assert [batch_of(g, 4) for g in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    with pytest.raises(ValueError):
        batch_of(3, 0)


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_may_start_is_the_version_gap_rule(bound):
    for version in range(4):
        for batch in range(8):
            assert may_start(batch, version, bound) == (batch - version <= bound)


def test_check_trainable_names_the_sample():
    assert check_trainable(5, 4, 1) == 1
    with pytest.raises(StalenessError, match="group 7.*gap 2 exceeds staleness bound 1"):
        check_trainable(5, 3, 1, what="group 7")
    with pytest.raises(StalenessError, match="newer"):
        check_trainable(2, 3, 1)
