import pytest

from bidirl.core.ledger import DeviceLedger, GroupLedger, LedgerError, Pool, Role
from bidirl.core.samples import GroupState, LifecycleError, PromptGroup
from bidirl.core.staleness import StalenessError


def test_device_ledger_lend_and_reclaim():
    led = DeviceLedger.build([0, 1], [2, 3])
    assert led.lend(2, 1.0, 3.5) is Role.ROLLOUT
    assert led.lend(0, 1.0, 2.0) is Role.AUX_TRAIN
    assert led.lent(Pool.TRAIN) == [2]
    with pytest.raises(LedgerError, match="only a device hosting its native role"):
        led.lend(2, 2.0, 1.0)
    led.reclaim(2, 5.0, 1.0)
    with pytest.raises(LedgerError, match="not lent"):
        led.reclaim(2, 6.0, 1.0)
    with pytest.raises(LedgerError, match="unknown device"):
        led.lend(9, 0.0, 0.0)
    assert led.counts() == {"roll_on_train": 1, "train_on_roll": 1}
    assert led.switch_time_s() == pytest.approx(6.5)


def test_device_in_both_pools_is_rejected():
    with pytest.raises(LedgerError, match="both pools"):
        DeviceLedger.build([0, 1], [1, 2])


def _complete(led: GroupLedger, gid: int, batch: int, version: int) -> PromptGroup:
    g = PromptGroup(gid, batch, 4)
    led.add(g)
    g.move(GroupState.GENERATING, 0.0)
    g.note_tokens(10, version)
    g.move(GroupState.COMPLETE, 1.0)
    return g


def test_group_ledger_audit_finds_lost_and_double_trained():
    led = GroupLedger()
    for gid in range(4):
        _complete(led, gid, gid // 2, 0)
    led.mark_trained(0, 0, 1, 2.0)
    led.mark_trained(1, 0, 1, 2.0)
    report = led.audit(bound=1)
    assert report.groups_lost == [2, 3] and not report.ok
    with pytest.raises(LifecycleError):
        led.mark_trained(0, 0, 1, 3.0)  # already trained
    with pytest.raises(LedgerError, match="created twice"):
        led.add(PromptGroup(0, 0, 4))
    with pytest.raises(LedgerError, match="belongs to batch 1"):
        led.mark_trained(2, 0, 1, 3.0)


def test_stale_group_cannot_be_trained():
    led = GroupLedger()
    _complete(led, 0, 3, 1)
    with pytest.raises(StalenessError):
        led.mark_trained(0, 3, 1, 1.0)


def test_lifecycle_rejects_illegal_moves():
    g = PromptGroup(0, 0, 2)
    with pytest.raises(LifecycleError):
        g.move(GroupState.COMPLETE, 0.0)
    g.move(GroupState.GENERATING, 0.0)
    g.note_tokens(5, 2)
    g.move(GroupState.PARTIAL, 1.0)
    g.move(GroupState.GENERATING, 2.0)
    g.note_tokens(5, 1)  # resumed on an older replica: the oldest token counts
    assert (g.v_first, g.v_last, g.tokens_generated) == (1, 2, 10)


def test_a_filtered_group_is_an_outcome_trained_and_filtered_never_both():
    led = GroupLedger()
    for gid in range(3):
        _complete(led, gid, 0, 0)
    g = PromptGroup(3, 0, 4)  # completes with all rewards equal: filtered, not trained
    led.add(g)
    g.move(GroupState.GENERATING, 0.0)
    led.mark_filtered(3, 1.0)
    for gid in range(3):
        led.mark_trained(gid, 0, 1, 2.0)
    report = led.audit(bound=1)
    assert report.ok and report.groups_trained == 3 and report.groups_filtered == 1
    assert report.keep_rate == 0.75 and not report.groups_lost
    with pytest.raises(LifecycleError):  # a filtered group is never trained
        led.mark_trained(3, 0, 1, 3.0)
    led.filtered_count[0] += 1  # a trained group recorded as filtered too: caught
    assert not led.audit(bound=1).ok and led.audit(bound=1).filtered_twice == [0]
