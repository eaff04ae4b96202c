import pytest

from bidirl.policy import admission, make_policy, policy_names
from bidirl.policy.batching import pack_micro_batches


def test_decide_admits_only_a_predicted_gain():
    assert admission.decide("roll_on_train", 0.0, 2, 5.0, 4.9).admit
    assert not admission.decide("roll_on_train", 0.0, 2, 5.0, 5.0).admit
    assert not admission.decide("roll_on_train", 0.0, 0, 5.0, 1.0).admit


def test_roll_on_train_weighs_switch_costs():
    # Trainer waits 100 s for batch b; borrowed replicas make b ready at 60 s (free) or
    # 63 s (after C_in), and b+1 at 150 -> 120.  Step + sync: 30 s.
    d = admission.roll_on_train(0.0, 4, 30.0, (100.0, 150.0), (60.0, 120.0), (63.0, 123.0), 2.0)
    assert d.admit and d.benefit_s > d.cost_s > 0
    # Only the tail is left (borrowing cannot shorten it): C_out makes it a loss.
    d = admission.roll_on_train(0.0, 4, 30.0, (100.0, 80.0), (100.0, 80.0), (100.0, 80.0), 2.0)
    assert not d.admit and d.benefit_s == 0.0


def test_train_on_roll_rejects_when_rollout_is_the_bottleneck():
    ok = admission.train_on_roll(0.0, 2, 100.0, 60.0, 70.0, 5.0, 50.0, 55.0)
    assert ok.admit
    # Next batch is far away anyway: a faster step buys nothing.
    no = admission.train_on_roll(0.0, 2, 100.0, 60.0, 70.0, 5.0, 200.0, 205.0)
    assert not no.admit


def test_micro_batches_keep_sample_order_and_tokens():
    groups = [(10, 20), (30,), (5, 5, 5)]
    mbs = pack_micro_batches(groups, prompt_tokens=10, target_tokens=50)
    assert [mb.samples for mb in mbs] == [2, 1, 3]  # 20+30 | 40 | 15+15+15
    assert sum(mb.tokens for mb in mbs) == sum(10 + x for g in groups for x in g)
    big = pack_micro_batches([(100,)], 0, 50)  # a sample longer than the target
    assert len(big) == 1 and big[0].tokens == 100 and big[0].seq_len == 100


def test_micro_batches_are_capped_in_samples_when_asked():
    """The trainer's micro_batch_size is a cap: short responses under a large token target
    must not pack a whole batch into one micro-batch (a step of one micro-batch cannot be
    split with an auxiliary trainer)."""
    groups = [(4,) * 8] * 8  # 64 samples of 14 tokens, far under the target
    assert [m.samples for m in pack_micro_batches(groups, 10, 10_000)] == [64]
    capped = pack_micro_batches(groups, 10, 10_000, max_samples=16)
    assert [m.samples for m in capped] == [16, 16, 16, 16]
    assert sum(m.tokens for m in capped) == 64 * 14
    assert [m.samples for m in pack_micro_batches(groups, 10, 14 * 10, max_samples=16)] == [10] * 6 + [4]
    with pytest.raises(ValueError, match="max_samples"):
        pack_micro_batches(groups, 10, 100, max_samples=0)


def test_all_seven_policies_are_registered():
    assert policy_names() == ["sync", "one-step-off", "async", "roll-borrow", "train-borrow",
                              "bidirl-opportunistic", "bidirl"]
    for name in policy_names():
        assert make_policy(name).name == name


def test_margin_rejects_a_gain_the_models_error_can_explain():
    # Benefit just above cost: admitted by models that predict well, rejected by models
    # that are 30 % off (the benefit shrunk by 30 % no longer beats the cost inflated by it).
    sure = admission.decide("train_on_roll", 0.0, 1, 1.05, 1.0, error=0.01)
    doubt = admission.decide("train_on_roll", 0.0, 1, 1.05, 1.0, error=0.3)
    assert sure.admit and not doubt.admit
    assert doubt.margin_s > 0.6 and doubt.net_s < 0 < sure.net_s
    # A clear gain survives the doubt; perfect models add no margin at all.
    assert admission.decide("roll_on_train", 0.0, 1, 3.0, 1.0, error=0.3).admit
    assert admission.decide("roll_on_train", 0.0, 1, 5.0, 4.9).margin_s == 0.0


def test_both_directions_pass_the_error_to_the_rule():
    args = (0.0, 2, 100.0, 60.0, 70.0, 5.0, 50.0, 55.0)  # benefit 40 s, cost 10 s
    assert admission.train_on_roll(*args).admit
    assert not admission.train_on_roll(*args, error=0.7).admit
    roll = (0.0, 4, 30.0, (100.0, 150.0), (60.0, 120.0), (63.0, 123.0), 2.0)
    assert admission.roll_on_train(*roll).admit
    assert not admission.roll_on_train(*roll, error=0.9).admit


def test_the_margin_comes_from_the_relevant_models_recent_error():
    from bidirl.controller.estimates import Estimates
    from bidirl.sim.scenario import load
    from bidirl.sim.world import build

    est = Estimates(build(load("tiny-cpu"))[0])
    assert est.admission_error("roll_on_train") == 0.0  # nothing measured yet: no evidence of error
    x = (10.0, 40.0, 4000.0)
    pred = est.rollout.decode.predict(x)
    for _ in range(10):
        est.observe("decode", x, pred * 1.2)  # the decode model is 20 % off, then learns
    assert 0.0 < est.admission_error("roll_on_train") <= est.rollout.decode.errors[0]
    assert est.admission_error("train_on_roll") == est.admission_error("roll_on_train")  # decode too
    mb = (1.0, 1000.0, 1e5)
    for _ in range(3):  # a cold auxiliary trainer, 3x slower than predicted: too few to count
        est.observe("aux_micro", mb, est.aux.micro.predict(mb) * 3)
    assert est.admission_error("train_on_roll") == est.admission_error("roll_on_train")
