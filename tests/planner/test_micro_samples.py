"""``sim.micro_batch_samples``: the trainer's sequence cap reaches the planner and the simulator.

A micro-batch closes at the token target or at the sample cap (``policy/batching.py``);
the planner prices micro-batches at the tokens they really hold and sizes activation
memory for the largest one, and the simulated steps are cut the same way.
"""

from __future__ import annotations

import dataclasses

from bidirl.planner.cold_start import start_spec
from bidirl.planner.context import PlanContext
from bidirl.planner.envelope import Envelope


def _with_cap(sc, samples):
    return sc.replace(sim=dataclasses.replace(sc.sim, micro_batch_samples=samples))


def test_the_cap_shrinks_the_priced_and_the_memory_micro_batch(make_scenario):
    sc = make_scenario(max_len=1024, prompt_tokens=256)
    free, capped = PlanContext.from_scenario(sc), PlanContext.from_scenario(_with_cap(sc, 4))
    assert free.micro_mean_tokens == free.micro_memory_tokens == sc.sim.micro_batch_tokens
    assert capped.micro_mean_tokens == 4 * capped.lengths.sample_tokens < sc.sim.micro_batch_tokens
    assert capped.micro_memory_tokens == 4 * capped.max_context
    huge = PlanContext.from_scenario(_with_cap(sc, 10_000))  # a cap that never binds changes nothing
    assert huge.micro_mean_tokens == huge.micro_memory_tokens == sc.sim.micro_batch_tokens


def test_the_controller_spec_carries_the_cap(make_scenario):
    ctx = PlanContext.from_scenario(_with_cap(make_scenario(), 4))
    env = Envelope(rollout_devices=8, train_devices=8, rollout_tp=1, train_dp=8, train_tp=1)
    assert start_spec(ctx, env).micro_batch_samples == 4


def test_simulated_steps_respect_the_cap(make_scenario, monkeypatch):
    import bidirl.sim.trainer as sim_trainer
    from bidirl.sim.run import simulate

    seen = []
    original = sim_trainer.plan_step

    def spy(a, *args, **kw):
        seen.append([mb.samples for mb in a.micro_batches])
        return original(a, *args, **kw)

    monkeypatch.setattr(sim_trainer, "plan_step", spy)
    sc = make_scenario(devices=8, max_len=512, prompt_tokens=64, prompts_per_step=8, group_size=4, steps=3)
    simulate(_with_cap(sc, 3), "bidirl")
    assert seen and all(max(s) <= 3 for s in seen)
    assert all(sum(s) == 32 for s in seen)  # every sample of the batch, none twice
