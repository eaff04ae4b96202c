"""``simulate``: one policy on one scenario, in simulated time.

This is the simulator's public entry point; the CLI, the paper grid, the benchmarks and
the planner build on it::

    simulate(scenario, policy, steps=None, seed=None, record_intervals=True, pools=None)

``pools`` replaces the scenario's split and layouts (the planner's resource envelope).

``ideal_tokens_per_s`` (the denominator of ``efficiency``) packs the run's work onto all
devices with no bubbles and no overheads.  Work, in device-seconds, is:

* rollout: every trained response token at the replica's best possible per-token cost,
  ``a / cap + c + k * context`` (decode at the full concurrency cap, exact context of
  that token), times ``rollout_tp``; plus one prompt prefill per group; with dynamic
  sampling (``workload.keep_rate``), every generated group's, the filtered ones too;
* training: every micro-batch at the cheaper of the primary layout (``train_tp`` devices)
  and the auxiliary layout (``rollout_tp`` devices), times its device count;

without weight sync, data-parallel all-reduce, optimizer, switch costs or timing noise.
Ideal wall time = work / devices, and ``ideal_tokens_per_s = tokens_trained / that``.
No schedule can beat it, so ``efficiency <= 1`` (up to timing noise, whose mean is 1).

``attainable_tokens_per_s`` adds what no schedule can avoid either: a batch at staleness
``s`` cannot start before the weights it must be generated with exist, nor train before
its longest response has decoded.  With ``gen(k) = end(k - s - 1)`` (0 for the first
``s + 1`` batches, after the start-up), ``longest(k)`` the seconds its longest response
takes to prefill and decode alone on one replica (batch 1: ``a + c + k * context`` per
token) and ``train(k)`` the step's ideal training device-seconds over all devices plus its
optimizer step::

    end(k) = max(end(k - 1), gen(k) + longest(k)) + train(k)

Attainable wall time = max(ideal wall time, ``end(steps - 1)``);
``efficiency_attainable = throughput / attainable_tokens_per_s`` says what is left to win.

Other fields: ``switch_time_s`` is device-seconds spent switching (C_in, C_out, C_grad and
the colocated switches of ``sync``); ``borrows`` counts lend transactions of units (a
unit is one replica's ``rollout_tp`` devices), colocated phase switches excluded (they are
in ``extra["colocated_switches"]``); ``admission`` counts admitted / rejected decisions
per direction; ``trace_sha256`` is the recorder's streaming sha256 over every interval's
canonical line (the same whether intervals are kept or not).  ``extra`` holds the controller's decision time
per event (``decision_us_p50/p99``) and per action, pool seconds by activity, and the
simulator's own run time.  Decision times are per event handled by the controller,
runtime work excluded, as wall time (``decision_us_*``) and as thread CPU time
(``decision_cpu_us_*``, immune to the process being descheduled on a busy machine):
p50, p99, p99.9 and max.

Python's cyclic garbage collector is paused while a simulation runs.  The run creates no
reference cycles worth collecting, but it keeps every prompt group's ledger record (about
two million objects at 1024 devices x 200 steps), and a full collection over them takes
up to a second, landing in whichever decision it interrupts.  Reference counting still
frees everything else at once.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import simpy

from bidirl.controller.loop import Controller
from bidirl.controller.queue import GenerationCapError
from bidirl.frame.device_time import Recorder
from bidirl.frame.result import RunResult, admission_counts, decision_figures, pool_figures
from bidirl.policy import make_policy
from bidirl.sim import scenario as scenario_mod
from bidirl.sim import turns
from bidirl.sim.runtime import SimRuntime
from bidirl.sim.scenario import Pools, Scenario
from bidirl.sim.world import build


def resolve(sc: Scenario, steps: int | None = None, seed: int | None = None,
            pools: Pools | None = None) -> Scenario:
    """The scenario with overrides applied and re-validated."""
    changes = {}
    if steps is not None:
        changes["steps"] = steps
    if seed is not None:
        changes["seed"] = seed
    if pools is not None:
        changes["pools"] = pools
        changes["devices"] = pools.rollout_devices + pools.train_devices
    if not changes:
        return sc
    return scenario_mod.from_dict(sc.replace(**changes).to_dict())


def simulate(scenario: Scenario, policy: str, steps: int | None = None,
             seed: int | None = None, record_intervals: bool = True,
             pools: Pools | None = None, allow_oversubscribe: bool = False) -> RunResult:
    """Run ``policy`` on ``scenario`` and report what happened (``SimResult``).

    A split whose roles do not fit in device memory is refused (``ScenarioError`` with the
    reason) unless ``allow_oversubscribe`` (``sim.world.build``).  A step that needs more
    groups than ``workload.max_num_gen_batches`` allows stops the run with a one-line
    ``GenerationCapError`` (dynamic sampling, ``workload.keep_rate``)."""
    sc = resolve(scenario, steps, seed, pools)
    spec, truth, lengths = build(sc, allow_oversubscribe)
    controller = Controller(spec, make_policy(policy))
    env = simpy.Environment()
    owners = {d: "rollout" for d in spec.rollout_devices()}
    owners.update({d: "train" for d in spec.train_devices})
    recorder = Recorder(owners, keep=record_intervals)
    rt = SimRuntime(env, spec, truth, lengths, controller, recorder, sc.seed)
    controller.bind(rt)
    started = time.perf_counter()
    gc_was_on = gc.isenabled()
    gc.disable()  # see the module docstring: pauses would land in random decisions
    try:
        rt.start()
        env.run(until=rt.done)
    except GenerationCapError as e:
        raise e.named("workload.max_num_gen_batches") from None
    except RuntimeError as e:
        if "until" not in str(e):
            raise
        s = controller.state
        raise RuntimeError(
            f"{policy} on {sc.name} stalled at t={env.now:.3f}: step {s.next_step}, phase "
            f"{s.phase.value}, pending sync {s.pending_sync}, running {s.running}, next "
            f"group {s.queue.next_fresh}") from None
    finally:
        if gc_was_on:
            gc.enable()
    return _result(sc, policy, controller, rt, recorder, time.perf_counter() - started)


def _result(sc: Scenario, policy: str, controller: Controller, rt: SimRuntime,
            rec: Recorder, elapsed_s: float) -> RunResult:
    s, spec = controller.state, rt.spec
    wall = rt.wall_s
    audit = s.groups.audit(spec.staleness, through_batch=spec.steps - 1)
    ideal_wall = (_ideal_rollout_s(rt) + rt.trainer.trained.device_s) / spec.devices
    throughput = rt.trainer.trained.tokens / wall
    ideal = rt.trainer.trained.tokens / ideal_wall if ideal_wall > 0 else 0.0
    attainable_wall = max(ideal_wall, critical_path_s(rt))
    attainable = rt.trainer.trained.tokens / attainable_wall if attainable_wall > 0 else 0.0
    ends = [0.0] + rt.trainer.trained.step_ends
    pools = pool_figures(rec.tally)
    return RunResult(
        policy=policy, scenario=sc.name, steps=spec.steps, wall_s=wall,
        tokens_trained=rt.trainer.trained.tokens, throughput_tokens_per_s=throughput,
        mean_step_time_s=wall / spec.steps,
        pool_busy_fraction=pools["pool_busy_fraction"], switch_time_s=pools["switch_time_s"],
        borrows={"roll_on_train": rt.hosting.lends["roll_on_train"],
                 "train_on_roll": rt.hosting.lends["train_on_roll"]},
        ideal_tokens_per_s=ideal, efficiency=throughput / ideal if ideal else 0.0,
        attainable_tokens_per_s=attainable,
        efficiency_attainable=throughput / attainable if attainable else 0.0,
        staleness={"mean": audit.mean_staleness, "max": float(audit.max_staleness)},
        groups_trained=audit.groups_trained,
        groups_lost=(spec.total_groups - audit.groups_trained + len(audit.trained_twice)
                     + len(audit.filtered_twice) + len(audit.groups_lost)),
        groups_filtered=audit.groups_filtered, keep_rate=audit.keep_rate,
        trace_sha256=rec.stream_sha256(), devices=spec.devices, seed=sc.seed,
        step_times_s=[b - a for a, b in zip(ends, ends[1:])],
        stage_model_median_error=s.est.median_errors(),
        admission=admission_counts(s.admissions), intervals=rec.intervals if rec.keep else [],
        extra={
            **decision_figures(controller),
            "sim_seconds": elapsed_s,
            "colocated_switches": rt.hosting.lends["colocated"],
            "pool_seconds": pools["pool_seconds"],
            "ledger_ok": audit.ok, "replica_cap": spec.replica_cap,
            "replicas": spec.n_replicas,
            "admission_net_s": sum(d.net_s for d in s.admissions if d.admit and d.guided),
        },
    )


def _ideal_rollout_s(rt: SimRuntime) -> float:
    """Device-seconds of the trained responses at the best per-token decode cost, and of
    the groups dynamic sampling filtered (no schedule avoids generating them)."""
    spec, truth = rt.spec, rt.truth
    a, c, k = truth.rollout.decode.theta
    prompt = spec.prompt_tokens
    if truth.turns is not None:  # multi-turn: every turn at its context, every later turn's prefill
        gids = (range(rt.controller.state.queue.members.next_unbound) if rt.rollout.filtered
                else range(spec.total_groups))
        return spec.rollout_tp * turns.ideal_rollout_s(
            truth.turns, gids, (a, c, k), spec.replica_cap, prompt, truth.rollout.prefill_s,
            truth.turns.turns.env_tokens)
    per_token = a / spec.replica_cap + c + k * prompt
    if rt.rollout.filtered:  # every group generated: ids 0 .. the last bound (all completed)
        generated = rt.controller.state.queue.members.next_unbound
        batches = [np.asarray([rt.lengths.lengths(g) for g in range(generated)], dtype=np.float64)]
    else:
        generated = spec.total_groups
        batches = (rt.lengths.draw_batch(b).astype(np.float64) for b in range(spec.steps))
    total = sum(float(np.sum(lens * per_token + k * lens * (lens - 1) / 2)) for lens in batches)
    prefill = truth.rollout.prefill_s(prompt) * generated
    return (total + prefill) * spec.rollout_tp


def critical_path_s(rt: SimRuntime) -> float:
    """``end(steps - 1)`` of the staleness chain (module docstring)."""
    spec, truth = rt.spec, rt.truth
    a, c, k = truth.rollout.decode.theta
    prompt = spec.prompt_tokens
    prefill = truth.rollout.prefill_s(prompt)
    train = rt.trainer.trained.device_s / spec.steps / spec.devices + truth.step_overhead_s
    ends: list[float] = []
    for b in range(spec.steps):
        gen = ends[b - spec.staleness - 1] if b > spec.staleness else truth.startup_s
        if truth.turns is not None:  # multi-turn: the slowest trajectory, its tool waits included
            t = truth.turns.turns
            ready = gen + turns.longest_trajectory_s(truth.turns, b, (a, c, k), prompt, truth.rollout.prefill_s,
                                                     t.tool_latency_s, t.env_tokens)
        else:
            longest = float(rt.lengths.draw_batch(b).max())
            decode = longest * (a + c + k * prompt) + k * longest * (longest - 1) / 2
            ready = gen + prefill + decode
        ends.append(max(ends[-1] if ends else 0.0, ready) + train)
    return ends[-1] if ends else 0.0
