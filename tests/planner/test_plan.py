"""The search (Algorithm 1): the analytic optimum, the API, errors and purity."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bidirl.perf.stage_models import weight_sync_s
from bidirl.planner.compat import Rejection
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope, envelope_of
from bidirl.planner.plan import TIE, PlanError, evaluate, plan, scenario_with_envelope
from bidirl.planner.predict import predict
from bidirl.sim.scenario import Costs, from_dict, load

NO_BORROW = Costs(roll_on_train_c_in_s=1e6, train_on_roll_c_in_s=1e6)


def test_search_returns_the_hand_computed_optimum(make_scenario):
    """Without borrowing, with no staleness gate and a long run, the period of an envelope
    is max(rollout pool period, training step + weight sync): the best envelope balances
    the two (the trainer pushes weights after each step before it starts the next)."""
    sc = make_scenario(devices=12, model="Qwen3-4B", staleness=16, dist="constant",
                       max_len=2048, costs=NO_BORROW)
    ctx = PlanContext.from_scenario(sc, steps=100_000)
    L, tok = ctx.lengths, ctx.tokens_per_step
    micro = [ctx.micro_tokens] * int(tok // ctx.micro_tokens) + [tok % ctx.micro_tokens]
    w = weight_sync_s(ctx.hw, ctx.model, ctx.devices > ctx.hw.devices_per_node)
    periods = {}
    for r_dev in range(1, 12):
        for r in (1, 2, 4, 8):
            for t in (1, 2, 4, 8):
                env = Envelope(r_dev, 12 - r_dev, r, (12 - r_dev) // t, t)
                if r_dev % r or (12 - r_dev) % t or isinstance(evaluate(ctx, env), Rejection):
                    continue
                sized = evaluate(ctx, env).envelope
                rm, c = ctx.rollout_model(r), sized.rollout_concurrency
                d = rm.decode_step_s(c, c * L.running_context)
                replica_s = (ctx.responses_per_step * L.mean * d / c
                             + ctx.prompts_per_step * rm.prefill_s(8 * L.prompt_tokens))
                spans = r_dev // 8 != 11 // 8
                train_s = ctx.train_model(t).step_s(micro, L.train_seq_len, env.train_dp, spans)
                periods[env.key()] = max(replica_s / sized.rollout_replicas, train_s + w)
    best = min(periods.values())
    result = plan(sc, steps=100_000)
    # Envelopes with the same period differ only in the (negligible) pipeline fill.
    assert periods[result.envelope.key()] == pytest.approx(best, rel=1e-3)
    assert result.predicted_step_time_s == pytest.approx(best, rel=1e-3)
    assert len(periods) > 20


def test_plan_api_and_json(make_scenario):
    sc = make_scenario(devices=16)
    res = plan(sc, top_k=3)
    assert res.envelope == res.alternatives[0].envelope
    assert len(res.alternatives) == 3
    tps = [c.prediction.tokens_per_s for c in res.alternatives]
    # the pick first (within TIE of the best, plan._break_tie), then best first
    assert tps[1:] == sorted(tps[1:], reverse=True)
    assert tps[0] >= (1 - TIE) * max(tps)
    assert res.predicted_tokens_per_s == tps[0] > 0
    assert res.predicted_step_time_s > 0
    js = json.loads(json.dumps(res.to_json()))
    for key in ("rollout_devices", "train_devices", "rollout_tp", "train_layout"):
        assert key in js["envelope"]
    assert {"dp", "tp", "sharded"} <= set(js["envelope"]["train_layout"])
    assert js["predicted_tokens_per_s"] > 0 and len(js["alternatives"]) == 3
    for r in js["rejected"]:
        assert r["reason"].startswith(r["constraint"]) and "envelope" in r
    assert "plan for" in res.format()


def test_scenario_with_envelope_is_a_valid_scenario(make_scenario):
    sc = make_scenario(devices=24)
    res = plan(sc)
    applied = scenario_with_envelope(sc, res.envelope)
    again = from_dict(applied.to_dict())  # validation runs here
    assert again.pools.rollout_devices + again.pools.train_devices == 24
    assert envelope_of(again).key() == res.envelope.key()


@pytest.mark.parametrize("devices", [3, 7, 13, 24, 40])
def test_odd_device_counts(make_scenario, devices):
    sc = make_scenario(devices=devices, model="Qwen3-4B")
    res = plan(sc)
    env = res.envelope
    assert env.rollout_devices + env.train_devices == devices
    assert env.rollout_devices % env.rollout_tp == 0
    assert env.train_dp * env.train_tp == env.train_devices
    assert env.train_devices % env.rollout_tp == 0 and env.aux_group > 0
    from_dict(scenario_with_envelope(sc, env).to_dict())


def test_model_too_large_for_any_envelope(make_scenario):
    sc = make_scenario(devices=2, hardware="cpu-core", model="Qwen3-32B", max_len=1024)
    with pytest.raises(PlanError) as e:
        plan(sc)
    msg = str(e.value)
    assert "Qwen3-32B" in msg and "cpu-core" in msg
    assert "needs at least" in msg and "GiB per device" in msg and "available" in msg


def test_staleness_and_cheap_switches_never_hurt(make_scenario):
    for max_len in (4096, 16384):
        s1 = PlanContext.from_scenario(make_scenario(staleness=1, max_len=max_len))
        s2 = PlanContext.from_scenario(make_scenario(staleness=2, max_len=max_len))
        free = PlanContext.from_scenario(make_scenario(max_len=max_len, costs=Costs(
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0)))
        for key in ((8, 8, 1, 8, 1), (12, 4, 2, 2, 2), (4, 12, 4, 3, 4)):
            env = evaluate(s1, Envelope(*key)).envelope
            p1, p2, pf = predict(s1, env), predict(s2, env), predict(free, env)
            assert p2.step_time_s <= p1.step_time_s * (1 + 1e-6)
            assert pf.step_time_s <= p1.step_time_s * (1 + 1e-6)
            assert p1.step_time_s <= p1.no_borrow_step_s * (1 + 1e-9)


def test_top_k_must_be_positive():
    with pytest.raises(ValueError, match="top_k"):
        plan(load("default"), top_k=0)


def test_256_devices_plans():
    """Scale check (timing lives in bench/planner_regret.py --speed, not here)."""
    res = plan(load("default").replace(devices=256))
    assert res.compatible > 500 and res.envelope.devices == 256


def test_planner_is_pure():
    code = ("import sys, bidirl.planner.plan, bidirl.planner.compat; "
            "bad = [m for m in ('torch', 'ray', 'vllm', 'simpy') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_nothing_is_lent_to_rollout_when_the_primaries_hold_every_admissible_batch(make_scenario):
    """The policy lends a trainer unit only to run queued groups: when the primaries' group
    slots hold all ``s + 1`` admissible batches nothing queues, so borrowing in that
    direction cannot change the prediction; when they do not, it can only lend as many
    units as the queue fills."""
    from bidirl.planner import stages

    sc = make_scenario(devices=32, model="Qwen3-4B", staleness=1, max_len=16384)
    ctx = PlanContext.from_scenario(sc, steps=8)
    for key in ((16, 4, 4, 4), (16, 8, 2, 8)):
        env = evaluate(ctx, Envelope(key[0], 32 - key[0], key[1], key[2], key[3])).envelope
        m = stages._model(ctx, env)
        groups = (ctx.staleness + 1) * ctx.prompts_per_step
        queued = groups - env.rollout_replicas * m.group_slots
        lent = stages._feedable(m, env, ctx.staleness)
        if queued <= 0:
            assert lent == 0
            assert predict(ctx, env, ("none", "roll_on_train")).borrowed == "none"
        else:
            assert 0 < lent <= min(env.borrowable_replicas, -(-queued // m.group_slots))


def test_fill_waits_for_lent_units_only_when_batch_zero_spills_onto_them(make_scenario):
    """At the start the trainer idles and lends its units to run the queued groups; they
    serve only after ``C_in``.  Batch 0 is admitted first, so it waits for them only when
    it does not fit in the primaries' group slots."""
    import dataclasses

    from bidirl.planner import closed_form, stages

    sc = make_scenario(devices=32, model="Qwen3-4B", staleness=1, max_len=16384)
    ctx = PlanContext.from_scenario(sc, steps=8)
    seen = set()
    for key in ((8, 8, 3, 8), (16, 8, 2, 8)):
        env = evaluate(ctx, Envelope(key[0], 32 - key[0], key[1], key[2], key[3])).envelope
        m = stages._model(ctx, env)
        assert stages._feedable(m, env, ctx.staleness) > 0
        st = closed_form.solve(m, env, ctx.staleness, "roll_on_train")
        slower = dataclasses.replace(m, c_roll_in=m.c_roll_in + 10.0)
        walls = [closed_form.run_wall_s(x, env, st, "roll_on_train", 8, ctx.staleness) for x in (m, slower)]
        spills = ctx.prompts_per_step > env.rollout_replicas * m.group_slots
        assert walls[1] - walls[0] == pytest.approx(10.0 if spills else 0.0)
        assert closed_form.run_wall_s(m, env, st, "none", 8, ctx.staleness) == closed_form.run_wall_s(
            slower, env, st, "none", 8, ctx.staleness)
        seen.add(spills)
    assert seen == {True, False}
