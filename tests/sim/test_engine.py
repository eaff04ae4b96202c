"""The analytic continuous-batching engine against step-by-step arithmetic."""

import pytest

from bidirl.perf.profiles import HARDWARE, MODELS
from bidirl.perf.stage_models import RolloutStageModel
from bidirl.sim.engine import ReplicaEngine

MODEL = RolloutStageModel(HARDWARE["H100-80GB"], MODELS["Qwen3-8B"], 1)


def _stepwise(lengths: list[int], prompt: int) -> float:
    """Decode one step at a time; the batch shrinks as responses finish."""
    left, ctx, t = list(lengths), [prompt] * len(lengths), 0.0
    while left:
        t += MODEL.decode_step_s(len(left), sum(ctx))
        ctx = [c + 1 for c in ctx]
        keep = [i for i, n in enumerate(left) if n > 1]
        left, ctx = [left[i] - 1 for i in keep], [ctx[i] for i in keep]
    return t


def test_group_completion_time_matches_stepwise():
    lengths = (5, 17, 17, 40)
    eng = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=100)
    eng.admit(7, lengths, None)
    t = eng.next_event_time()
    assert t == pytest.approx(_stepwise(list(lengths), 100), rel=1e-12)
    assert eng.advance(t * (1 - 1e-6)) == []
    assert eng.advance(t) == [7]
    assert eng.running == 0


def test_first_group_to_complete_is_reported_first():
    eng = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=10)
    eng.admit(1, (30, 30), None)
    eng.admit(2, (5, 10), None)
    t = eng.next_event_time()
    assert eng.advance(t) == [2]
    assert eng.advance(eng.next_event_time()) == [1]


def test_cut_steps_add_up():
    """A pause in the middle (e.g. an event) does not change when a response finishes."""
    a = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=50)
    b = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=50)
    for eng in (a, b):
        eng.admit(0, (100, 300), None)
    for frac in (0.1, 0.37, 0.5, 0.9):
        b.advance(frac * a.next_event_time())
    assert b.next_event_time() == pytest.approx(a.next_event_time(), rel=1e-9)


def test_interrupt_hands_back_whole_step_prefixes():
    eng = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=10)
    eng.admit(3, (4, 50, 60), None)
    t4 = _stepwise([4, 4, 4], 10)  # the first response finishes after 4 steps
    done = eng.advance(t4 * 2.5)  # somewhere in the middle of later steps
    assert done == []
    (gid, tokens, prefixes), = eng.interrupt()
    steps = min(prefixes.values())
    assert gid == 3 and set(prefixes) == {1, 2} and steps >= 8
    assert tokens == 4 + prefixes[1] + prefixes[2]
    # Resuming elsewhere needs only the remaining tokens, after a prefill of the prefix.
    other = ReplicaEngine(MODEL.decode.theta, 256, prompt_tokens=10)
    prefill = other.admit(3, (4, 50, 60), prefixes)
    assert prefill == 10 + prefixes[1] + prefixes[2]
    assert other.running == 2
    t = other.next_event_time()
    assert other.advance(t) == [3]


def _stepwise_capped(lengths: list[int], prompt: int, cap: int) -> float:
    """Step by step with at most ``cap`` running; a freed slot starts the next waiting one."""
    waiting = list(lengths)
    left, ctx, t = [], [], 0.0
    while waiting and len(left) < cap:
        left.append(waiting.pop(0))
        ctx.append(prompt)
    while left:
        t += MODEL.decode_step_s(len(left), sum(ctx))
        ctx = [c + 1 for c in ctx]
        keep = [i for i, n in enumerate(left) if n > 1]
        left, ctx = [left[i] - 1 for i in keep], [ctx[i] for i in keep]
        while waiting and len(left) < cap:
            left.append(waiting.pop(0))
            ctx.append(prompt)
    return t


def test_a_group_larger_than_the_cap_runs_in_waves():
    """vLLM's max_num_seqs: responses beyond the cap wait for a free slot."""
    lengths = (5, 17, 9, 40, 12, 3, 30, 8)
    eng = ReplicaEngine(MODEL.decode.theta, 3, prompt_tokens=100)
    eng.admit(7, lengths, None)
    assert eng.running == 3
    t = eng.next_event_time()
    assert t == pytest.approx(_stepwise_capped(list(lengths), 100, 3), rel=1e-12)
    wide = ReplicaEngine(MODEL.decode.theta, 8, prompt_tokens=100)
    wide.admit(7, lengths, None)
    assert wide.next_event_time() < t  # the cap costs time
    assert eng.advance(t * (1 - 1e-6)) == []
    assert eng.advance(t) == [7] and eng.running == 0


def test_waiting_responses_come_back_whole_on_interrupt():
    eng = ReplicaEngine(MODEL.decode.theta, 2, prompt_tokens=10)
    eng.admit(1, (50, 60), None)
    eng.admit(2, (20, 20, 20), {0: 4, 1: 0, 2: 7})  # a resumed group: it waits behind group 1
    assert eng.running == 2
    eng.advance(0.5 * eng.next_event_time())
    parts = {gid: prefixes for gid, _, prefixes in eng.interrupt()}
    assert parts[2] == {0: 4, 1: 0, 2: 7}  # untouched: nothing of it ran
    assert set(parts[1]) == {0, 1} and min(parts[1].values()) > 0
    assert eng.running == 0 and not eng.waiting
