"""A real run's measured profile, written as a scenario the simulator replays.

At the end of ``bidirl train`` the run directory gets

* ``profile.jsonl``: every stage measurement, weight sync, group completion and training
  step the executor saw, with its time (``DeviceExecutor.profile``), and
* ``scenario.yaml``: a scenario in the simulator's schema (``perf/scenario.py``) that
  describes *this* run, so that ``bidirl simulate --scenario RUN_DIR/scenario.yaml
  --policy P`` predicts its throughput under any policy ``P``.

What the scenario holds, and where each figure comes from:

* the cluster: the run's devices and pools, the hardware and model profiles its
  controller used (``run_spec.build_spec``: their priors are where the simulated
  scheduler starts, as the real one did, ``sim.prior_scale: 1``; a model of its own, from
  ``model.path``, written out field by field), the replica's
  concurrency cap (``rollout.max_num_seqs``) and the micro-batch size;
* ``calibration``: the stage models fitted to the whole run's measurements (robust fit,
  ``perf.calibration``, started from the run's own online fit), each then scaled so that
  its predictions add up to the measured total (the simulator needs the *mean* time; a
  robust fit follows the typical one, and a shared machine's slow spells are part of the
  mean).  Decode is fitted on the run's decode sums and on each replica's steps after its
  last sum (``DECODE_REMAINDER``), so a short run's decoding is all counted.  The
  description notes the replicas' busy time over their measured decode and prefill time
  (engine time outside ``step()``: bookkeeping, control calls; a few percent on this
  machine, left out of the models).  ``startup_s`` is when the first engine step
  began (driver and engine start-up; the devices idle until then in the simulation too).
  ``train_step_overhead_s`` is the median of a step's
  time beyond its micro-batches (merge, optimizer, driver); ``reprefill_on_sync`` is set
  because the runtime re-prefills running responses after each weight update, and
  ``prefill_per_response`` because it runs vLLM without prefix caching (every response
  prefills its prompt; a prefill is measured per burst, so it is simulated per burst);
* ``costs``: the measured switch costs (median; C_in / C_out of real lends, else of the
  start-up prewarm), gradient shipping (``C_grad``) and weight sync; a cost the run
  never measured (``async`` lends nothing) stays ``null``: the profile's prior;
* ``workload``: prompts per step, group size, the trained prompts' mean length, and the
  response lengths *as measured*, response by response in group-id order
  (``dist: empirical``): batch ``b`` of the simulation gets the lengths batch ``b`` of the
  run had, so lengths that shift over the run are replayed as they shifted.  A run with
  dynamic sampling (``algorithm.filter_groups``) adds ``keep_rate``: the share of groups
  kept, fitted as a line over the versions the groups completed at (``keep_rate_fit``), and
  ``max_num_gen_batches``; its lengths are every generated group's, cycled.  Images add
  ``images_per_prompt``, ``image_pixels``, ``image_bytes`` (their time is in the fits).
  A multi-turn run adds ``turns`` (measured turns per trajectory, its time off the replicas
  per environment turn, environment tokens per reply) and writes its response lengths per
  model turn (``runtime/calibrated_workload.py``; the trajectories go to ``profile.jsonl``).

``scenario_dict(RunFacts)`` is pure (tested on a fake run); ``write`` gathers the facts
from a finished executor and writes both files.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import GroupsCompleted, StageMeasured, TrainStepFinished, WeightsSynced
from bidirl.perf.calibration import LinearTimeModel
from bidirl.perf.scenario import from_dict
from bidirl.runtime.calibrated_workload import keep_rate_fit, response_lengths, trajectory_records, workload_turns
from bidirl.runtime.config import load_config
from bidirl.runtime.rollout_driver import DECODE_REMAINDER
from bidirl.runtime.run_spec import build_spec

STAGES = ("decode", "prefill", "train_micro", "aux_micro")
SWITCHES = ("roll_on_train.c_in", "roll_on_train.c_out", "train_on_roll.c_in", "train_on_roll.c_out")


@dataclass
class RunFacts:
    """What a finished run knows about itself (plain data: ``scenario_dict`` is pure)."""

    name: str
    policy: str
    hardware: str
    model: str | dict  # a catalogue name, or a model's fields (``model_entry``)
    rollout_devices: int
    train_devices: int
    staleness: int
    seed: int
    steps: int
    prompts_per_step: int
    group_size: int
    prompt_tokens: float
    max_new_tokens: int
    micro_batch_tokens: int
    replica_cap: int
    profile: list[dict]  # profile.jsonl's records
    switches: list[tuple[str, float]] = field(default_factory=list)  # (kind, seconds)
    priors: dict[str, list[float]] = field(default_factory=dict)  # the online fits at the end
    rollout_busy_s: float | None = None  # device-seconds the replicas were busy generating
    throughput_tokens_per_s: float | None = None  # what the run measured (for the description)
    micro_batch_samples: int | None = None  # the trainer's sequences per micro-batch
    max_num_gen_batches: int = 0  # dynamic sampling's cap (algorithm.filter_groups)
    images_per_prompt: float = 0.0  # images in the trained prompts; each one's mean pixels and bytes
    image_pixels: int = 0
    image_bytes: int = 0
    rollout_tp: int = 1  # devices a replica spans (rollout.tensor_parallel_size)


def model_entry(spec: ClusterSpec) -> str | dict:
    """The scenario's ``model:``: the catalogue name the spec names, or the fields of the
    spec's own model profile (``perf.profile_spec.ModelSpec``'s, so the scenario loads
    without the model directory)."""
    m = spec.model_profile
    if m is None:
        return spec.model
    fields = {"name": m.name, "params": m.params, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
              "kv_heads": m.kv_heads, "head_dim": m.head_dim, "vocab": m.vocab, "bytes_per_param": m.bytes_per_param}
    return {**fields, **({"active_params": m.active_params} if m.active_params else {})}


def profile_records(profile) -> list[dict]:
    """``DeviceExecutor.profile``'s ``(time, event)`` pairs as JSON-ready records."""
    out = []
    for t, ev in profile:
        rec = {"t": round(t, 6), "event": type(ev).__name__}
        if isinstance(ev, GroupsCompleted):
            rec.update(replica=ev.replica, group_ids=list(ev.group_ids),
                       response_lengths=[list(x) for x in ev.response_lengths])
            if ev.filtered:
                rec["filtered"] = list(ev.filtered)
        elif isinstance(ev, (StageMeasured, WeightsSynced, TrainStepFinished)):
            rec.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(ev).items()})
        out.append(rec)
    return out


def _samples(records: list[dict], stage: str) -> list[tuple[tuple[float, ...], float]]:
    return [(tuple(r["features"]), r["seconds"]) for r in records
            if r["event"] == "StageMeasured" and r["stage"] == stage and r["seconds"] > 0]


def fit_stage(name: str, prior: list[float], samples: list[tuple[tuple[float, ...], float]]
              ) -> tuple[list[float], float, float]:
    """The run's mean-time model of one stage: (theta, median out-of-sample error, mean scale).

    A robust fit over every sample (one window, iteratively reweighted), then every
    coefficient times ``sum(measured) / sum(fitted)``, so the fit's total over the run's own
    work is the measured total.
    """
    model = LinearTimeModel(name, tuple(max(0.0, p) for p in prior), window=max(1, len(samples)))
    for x, y in samples:
        model.observe(x, y)
    for _ in range(3):
        model.reweight()
    fitted = sum(model.fit_s(x) for x, _ in samples)
    scale = sum(y for _, y in samples) / fitted if fitted > 0 else 1.0
    return [c * scale for c in model.theta], model.median_rel_error() or 0.0, scale


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _step_overhead(records: list[dict], dp: int) -> float | None:
    """Median of a training step's time beyond its compute: over steps without auxiliary
    chunks, the step's time beyond its primary ranks' compute (their measured time over
    ``dp``: the ranks run in parallel); a run whose every step had auxiliaries (``bidirl``
    on a train-heavy workload) measures it after the last chunk came back instead: the
    step's end less the last micro-batch's return and the C_grad pulls of the merge."""
    plain, merged = [], []
    for r in (r for r in records if r["event"] == "TrainStepFinished"):
        t0, t1 = r["t"] - r["seconds"], r["t"]
        inside = [m for m in records if m["event"] == "StageMeasured" and t0 <= m["t"] <= t1]
        computed = [m for m in inside if m["stage"] in ("train_micro", "aux_micro")]
        if any(m["stage"] in ("aux_micro", "train_on_roll.c_grad") for m in inside):
            if computed:
                pulls = sum(m["seconds"] for m in inside if m["stage"] == "train_on_roll.c_grad")
                merged.append(max(0.0, t1 - max(m["t"] for m in computed) - pulls))
            continue
        primary = [m["seconds"] for m in computed]
        if primary:
            plain.append(max(0.0, r["seconds"] - sum(primary) / dp))
    return _median(plain or merged)


def _startup(records: list[dict]) -> float:
    """When the first engine step began: an engine's first work is a prefill burst."""
    first = next((r for r in records if r["event"] == "StageMeasured" and r["stage"] == "prefill"), None)
    return max(0.0, first["t"] - first["seconds"]) if first else 0.0


def scenario_dict(f: RunFacts) -> dict:
    """The run as a scenario mapping (checked by the schema: ``perf.scenario.from_dict``)."""
    recs = f.profile
    cal: dict = {"replica_cap": f.replica_cap, "reprefill_on_sync": True, "prefill_per_response": True}
    fit_notes = {}
    rollout_measured = 0.0
    for stage in STAGES:
        samples = _samples(recs, stage)
        if stage == "decode":  # and the steps each replica ran after its last sum
            samples += _samples(recs, DECODE_REMAINDER)
        if not samples:
            cal[stage] = None
            continue
        prior = f.priors.get(stage) or [1e-3] * len(samples[0][0])
        theta, err, scale = fit_stage(stage, prior, samples)
        cal[stage] = theta
        fit_notes[stage] = (len(samples), err, scale)
        if stage in ("decode", "prefill"):
            rollout_measured += sum(y for _, y in samples)
    # device-seconds over replica-seconds: a replica of rollout_tp devices is busy on each of them
    busy = f.rollout_busy_s / f.rollout_tp / rollout_measured if f.rollout_busy_s and rollout_measured > 0 else None
    cal["train_step_overhead_s"] = _step_overhead(recs, f.train_devices)
    cal["startup_s"] = _startup(recs)
    # Pre-warmed: lends timed before the loop, or (a policy that lends nothing) the weight load
    cal["prewarmed"] = any(kind.startswith("prewarm.") for kind, _ in f.switches) or any(
        r["event"] == "StageMeasured" and r["stage"] == "weight_sync" for r in recs)
    syncs = [r["seconds"] for r in recs if r["event"] == "WeightsSynced" and r["seconds"] > 0]
    measured = {k: [s for kind, s in f.switches if kind == k] for k in SWITCHES}
    warm = {k: [s for kind, s in f.switches if kind == f"prewarm.{k}"] for k in SWITCHES}
    costs = {f"{k.replace('.', '_')}_s": _median(measured[k] or warm[k]) for k in SWITCHES}
    costs["train_on_roll_c_grad_s"] = _median(y for _, y in _samples(recs, "train_on_roll.c_grad"))
    costs["weight_sync_s"] = _median(syncs)
    per_gb = [r["seconds"] * 1e9 / r["bytes_moved"] for r in recs  # the transport's, to scale to other sizes
              if r["event"] == "WeightsSynced" and r["seconds"] > 0 and (r.get("bytes_moved") or 0) > 0]
    costs["weight_sync_s_per_gb"] = _median(per_gb)
    keep = keep_rate_fit(recs, f.steps)
    lengths = response_lengths(recs, None if keep else f.steps * f.prompts_per_step, f.group_size)
    if not lengths:
        raise ValueError("the run completed no group: nothing to calibrate a scenario from")
    turns = workload_turns(recs, f.max_new_tokens)  # multi-turn: turns, tool time, per-turn lengths
    notes = ", ".join(f"{s} {n} samples, median error {e:.3f}, mean scale {k:.2f}"
                      for s, (n, e, k) in fit_notes.items())
    measured_tps = (f" measured {f.throughput_tokens_per_s:,.0f} tokens/s;"
                    if f.throughput_tokens_per_s else "")
    return {
        "name": f.name,
        "description": (f"calibrated from a real run ({f.policy}, {f.steps} steps);{measured_tps} fits: {notes}"
                        + (f"; rollout busy / measured {busy:.3f}" if busy else "")
                        + (f"; {turns['note']}" if turns else "")
                        + ("; images: the vision tower's time is inside the measured prefill and train fits"
                           if f.images_per_prompt else "")),
        "hardware": f.hardware, "model": f.model,
        "devices": f.rollout_devices + f.train_devices,
        "staleness": f.staleness, "steps": f.steps, "seed": f.seed,
        "workload": {
            "prompts_per_step": f.prompts_per_step, "group_size": f.group_size,
            "prompt_tokens": max(1, round(f.prompt_tokens)),
            "response_length": turns["response_length"] if turns else {
                "dist": "empirical", "min": 1, "max": max(f.max_new_tokens, max(lengths)), "values": lengths,
                **({"order": "cycle"} if keep else {})},
            **({"turns": turns["turns"]} if turns else {}),
            **({"keep_rate": keep, "max_num_gen_batches": f.max_num_gen_batches} if keep else {}),
            **({"images_per_prompt": max(1, round(f.images_per_prompt)), "image_pixels": f.image_pixels,
                "image_bytes": f.image_bytes} if f.images_per_prompt else {}),
        },
        "pools": {"rollout_devices": f.rollout_devices, "train_devices": f.train_devices, "rollout_tp": f.rollout_tp,
                  "train": {"dp": f.train_devices, "tp": 1}},
        "costs": costs,
        "sim": {"timing_noise_cv": 0.0, "prior_scale": 1.0, "micro_batch_tokens": f.micro_batch_tokens,
                **({"micro_batch_samples": f.micro_batch_samples} if f.micro_batch_samples else {})},
        "calibration": cal,
    }


def dump_yaml(data: dict) -> str:
    """The scenario as YAML: sections in block style, coefficient lists on one line."""

    class Dumper(yaml.SafeDumper):
        pass

    def seq(dumper, value):
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)

    Dumper.add_representer(list, seq)
    Dumper.add_representer(tuple, seq)
    header = ("# A real run, as a scenario the simulator replays (bidirl/runtime/calibrated_scenario.py):\n"
              "#   bidirl simulate --scenario THIS_FILE --policy async\n")
    return header + yaml.dump(data, Dumper=Dumper, sort_keys=False, width=120)


def facts(cfg, rt, intervals=None, wall: float | None = None) -> RunFacts:
    """Gather ``RunFacts`` from a finished ``DeviceExecutor`` and its run config."""
    spec, est = rt.spec, rt.controller.state.est
    steps = [rt.steps[k] for k in sorted(rt.steps) if rt.steps[k].finished_s > 0]  # not a step cut short
    samples = sum(len(r.staleness) for r in steps) * spec.group_size
    prompt = (sum(r.total_tokens - r.response_tokens for r in steps) / samples if samples
              else float(spec.prompt_tokens))
    trajs = getattr(rt.rollout, "trajectory_stats", ())
    if trajs and samples:  # multi-turn: the trained tokens beyond the model's hold the environment's too
        prompt -= sum(x[3] for x in trajs) / len(trajs)
    wall = rt.now() if wall is None else wall
    tokens = sum(r.total_tokens for r in steps)
    busy = None
    if intervals:
        busy = sum(iv.duration_s for iv in intervals if iv.role == "rollout" and iv.activity == "busy"
                   and iv.label == "rollout")
    images, groups = sum(r.images for r in steps), sum(len(r.staleness) for r in steps)
    return RunFacts(
        name="calibrated", policy=cfg.scheduler.policy, hardware=spec.hardware, model=model_entry(spec),
        rollout_devices=len(spec.rollout_devices()), rollout_tp=spec.rollout_tp, train_devices=len(spec.train_devices),
        staleness=spec.staleness,
        seed=cfg.run.seed, steps=len(steps), prompts_per_step=spec.groups_per_step, group_size=spec.group_size,
        prompt_tokens=prompt, max_new_tokens=spec.max_response_tokens, micro_batch_tokens=spec.micro_batch_tokens,
        micro_batch_samples=spec.micro_batch_samples, replica_cap=spec.replica_cap,
        profile=profile_records(rt.profile) + trajectory_records(getattr(rt.rollout, "trajectory_stats", ())),
        switches=list(rt.switches),
        priors={s: list(m.theta) for s, m in est.models.items() if s in STAGES},
        rollout_busy_s=busy, throughput_tokens_per_s=tokens / wall if wall > 0 else None,
        max_num_gen_batches=spec.max_gen_batches,
        images_per_prompt=images / groups if groups else 0.0,
        image_pixels=sum(r.image_pixels for r in steps) // max(1, images),
        image_bytes=sum(r.image_bytes for r in steps) // max(1, images))


def write(run_dir: Path, cfg, rt, intervals=None, wall: float | None = None) -> Path | None:
    """Write ``profile.jsonl`` and ``scenario.yaml`` to ``run_dir``; the scenario's path
    (None, with a note on stderr, when the run measured too little to describe).  ``wall``:
    when the training loop ended (default: now)."""
    run_dir = Path(run_dir)
    f = facts(cfg, rt, intervals, wall)
    with (run_dir / "profile.jsonl").open("w") as out:
        for rec in f.profile:
            out.write(json.dumps(rec) + "\n")
    if not f.steps:
        print("[bidirl] no step was trained: no scenario.yaml", file=sys.stderr)
        return None
    data = scenario_dict(f)
    from_dict(data, "calibrated")  # the schema's own check: what is written always loads
    path = run_dir / "scenario.yaml"
    path.write_text(dump_yaml(data))
    return path


def facts_from_run_dir(run_dir: Path) -> RunFacts:
    """``RunFacts`` read back from a finished run's files (``config.yaml``, ``profile.jsonl``,
    ``summary.json``, ``trace.json``): re-derive a scenario without running again."""
    run_dir = Path(run_dir)
    cfg = load_config(str(run_dir / "config.yaml"))
    records = [json.loads(line) for line in (run_dir / "profile.jsonl").read_text().splitlines() if line]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = int(summary.get("segment_steps", summary["steps"]))  # the steps profile.jsonl measured
    spec = build_spec(cfg, steps, 1.0)
    lengths = response_lengths(records, steps * spec.groups_per_step, spec.group_size)
    samples = steps * spec.groups_per_step * spec.group_size
    prompt = (summary["tokens_trained"] - sum(lengths)) / samples if samples and lengths else 1.0
    spec = build_spec(cfg, steps, prompt)
    busy = None
    trace = run_dir / "trace.json"
    if trace.is_file():
        events = json.loads(trace.read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        busy = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("name") == "rollout"
                   and e.get("args", {}).get("role") == "rollout"
                   and e.get("args", {}).get("activity") == "busy") / 1e6
    return RunFacts(
        name="calibrated", policy=cfg.scheduler.policy, hardware=spec.hardware, model=model_entry(spec),
        rollout_devices=len(spec.rollout_devices()), rollout_tp=spec.rollout_tp, train_devices=len(spec.train_devices),
        staleness=spec.staleness,
        seed=cfg.run.seed, steps=steps, prompts_per_step=spec.groups_per_step, group_size=spec.group_size,
        prompt_tokens=prompt, max_new_tokens=spec.max_response_tokens, micro_batch_tokens=spec.micro_batch_tokens,
        micro_batch_samples=spec.micro_batch_samples, replica_cap=spec.replica_cap, profile=records,
        switches=[(k, s) for k, s in summary.get("switches", [])], rollout_busy_s=busy,
        throughput_tokens_per_s=summary.get("throughput_tokens_per_s"), max_num_gen_batches=spec.max_gen_batches)


def main(argv: list[str] | None = None) -> int:
    """``python -m bidirl.runtime.calibrated_scenario RUN_DIR [OUT.yaml]``: the scenario again."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m bidirl.runtime.calibrated_scenario RUN_DIR [OUT.yaml]", file=sys.stderr)
        return 2
    data = scenario_dict(facts_from_run_dir(Path(args[0])))
    from_dict(data, "calibrated")
    out = Path(args[1]) if len(args) > 1 else Path(args[0]) / "scenario.yaml"
    out.write_text(dump_yaml(data))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
