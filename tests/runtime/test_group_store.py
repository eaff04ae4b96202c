"""The group store hands out, resumes and retires responses without losing or duplicating any."""

import pytest

from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.messages import ResponseResult


def _result(req, tokens, finished, version):
    return ResponseResult(req.group_id, req.index, req.prompt_ids,
                          list(req.prefix_ids) + tokens,
                          list(req.prefix_logprobs) + [-0.5] * len(tokens),
                          list(req.prefix_versions) + [version] * len(tokens),
                          finished, "stop" if finished else None, req.max_new_tokens,
                          req.temperature, req.seed)


def test_partial_resume_keeps_prefix_and_versions():
    store = GroupStore(n=2, max_new_tokens=8, temperature=1.0, seed=0)
    store.add(7, "e0p0", [1, 2, 3], "add", "5")
    reqs = store.requests_for(7)
    assert [r.index for r in reqs] == [0, 1]
    done = store.absorb_finished([_result(reqs[0], [4, 5], True, version=3)])
    assert done == []
    store.absorb_partials([_result(reqs[1], [6], False, version=3)])
    resumed = store.requests_for(7)
    assert len(resumed) == 1 and resumed[0].prefix_ids == [6] and resumed[0].prefix_versions == [3]
    assert resumed[0].seed != reqs[1].seed  # a fresh random stream for the continuation
    done = store.absorb_finished([_result(resumed[0], [9], True, version=4)])
    assert done == [7]
    assert store.groups[7].done[1].token_ids == [6, 9]
    assert store.versions(7) == (3, 4, 4)
    rewards = store.score(7, lambda ds, s, gt, ei: float(len(s)), decode=lambda ids: "x" * len(ids))
    assert rewards == [2.0, 2.0]


def test_double_finish_is_an_error():
    store = GroupStore(n=1, max_new_tokens=4, temperature=1.0, seed=0)
    store.add(0, "u", [1], "add", "1")
    (req,) = store.requests_for(0)
    store.absorb_finished([_result(req, [2], True, 0)])
    with pytest.raises(RuntimeError, match="finished twice"):
        store.absorb_finished([_result(req, [2], True, 0)])


def test_state_round_trip_keeps_in_flight_partials():
    store = GroupStore(n=2, max_new_tokens=8, temperature=1.0, seed=1)
    store.add(0, "u0", [1, 2], "add", "3")
    reqs = store.requests_for(0)
    store.absorb_finished([_result(reqs[0], [5], True, 0)])
    store.absorb_partials([_result(reqs[1], [6, 7], False, 0)])
    other = GroupStore(n=2, max_new_tokens=8, temperature=1.0, seed=1)
    other.load_state_dict(store.state_dict())
    assert other.groups[0].done[0].token_ids == [5]
    assert other.requests_for(0)[0].prefix_ids == [6, 7]


def test_overlong_shaping_penalises_training_rewards_near_the_cap():
    """DAPO's buffer (algorithm.overlong_buffer): cap 8, buffer 4: lengths 3, 6 and 8 get
    0, -0.5 * 2 / 4 and -0.5 * 4 / 4 with penalty factor 0.5, recorded as extra keys; a
    bad reward scored 0 is not shaped."""
    from bidirl.algo.algorithm_config import OverlongBuffer

    store = GroupStore(n=4, max_new_tokens=8, temperature=1.0, seed=0, on_bad_reward="zero",
                       overlong=OverlongBuffer(enable=True, len=4, penalty_factor=0.5))
    store.add(0, "u", [1], "add", "1")
    reqs = store.requests_for(0)
    store.absorb_finished([_result(r, [2] * n, True, 0) for r, n in zip(reqs, (3, 6, 8, 8))])
    rewards = store.score(0, lambda ds, s, gt, ei: None if s == "bad" else 1.0,
                          decode=lambda ids: "bad" if ids is store.groups[0].done[3].token_ids else "ok")
    assert rewards == [1.0, 1.0 - 0.25, 1.0 - 0.5, 0.0]
    assert store.groups[0].extras[1] == {"overlong_reward": -0.25, "overlong": 1.0}
    assert store.groups[0].extras[0] == {"overlong_reward": 0.0, "overlong": 0.0}
    assert 3 in store.groups[0].bad and 3 not in store.groups[0].extras
    assert store.extra_means([0])["overlong"] == pytest.approx(2 / 3)
    plain = GroupStore(n=1, max_new_tokens=8, temperature=1.0, seed=0, overlong=OverlongBuffer())  # off
    plain.add(0, "u", [1], "add", "1")
    plain.absorb_finished([_result(plain.requests_for(0)[0], [2] * 8, True, 0)])
    assert plain.score(0, lambda *a: 1.0, decode=str) == [1.0] and plain.groups[0].extras == {}


def test_dynamic_sampling_judges_the_metric_it_is_given():
    """``algorithm.filter_groups.metric``: the shaped training rewards (null / seq_reward /
    seq_final_reward) differ by the overlong penalty, so they have a spread; the function's
    own values (``score``; ``acc`` of a plain number) are all 1 and have none; a dict's key
    is read as it is; a key the function never returns is a one-line error naming the metric."""
    from bidirl.algo.algorithm_config import OverlongBuffer
    from bidirl.algo.dynamic_sampling import zero_spread
    from bidirl.runtime.reward_call import BadRewardError

    def scored(reward_fn):
        store = GroupStore(n=2, max_new_tokens=8, temperature=1.0, seed=0,
                           overlong=OverlongBuffer(enable=True, len=4, penalty_factor=1.0))
        store.add(0, "u", [1], "add", "1")
        reqs = store.requests_for(0)
        store.absorb_finished([_result(r, [2] * n, True, 0) for r, n in zip(reqs, (3, 8))])
        store.score(0, reward_fn, decode=str)
        return store

    plain = scored(lambda *a: 1.0)
    for metric in (None, "seq_reward", "seq_final_reward"):
        assert plain.filter_values(0, metric) == [1.0, 0.0] and not zero_spread(plain.filter_values(0, metric))
    assert plain.filter_values(0, "score") == plain.filter_values(0, "acc") == [1.0, 1.0]
    assert zero_spread(plain.filter_values(0, "acc"))
    with_acc = scored(lambda *a: {"score": 0.5, "acc": 1.0})
    assert with_acc.filter_values(0, "acc") == [1.0, 1.0] and with_acc.filter_values(0, "score") == [0.5, 0.5]
    with pytest.raises(BadRewardError, match=r"^algorithm.filter_groups.metric=pred: the reward function gave "
                                             r"group 0 response 0 no 'pred' \(its keys: \['acc', 'overlong'"):
        with_acc.filter_values(0, "pred")
