"""What a finished (or stopped) real run reports about itself: ``summary.json``'s figures,
the ledger audit and ``admissions.jsonl``.

``run_summary`` is ``RunResult``'s names (what ``bidirl simulate`` writes, ``run_result``)
plus what training adds: rewards, the audit of the ledger of trained groups (every group of
every step trained exactly once or, with dynamic sampling, filtered once, staleness within
the bound; ``audit``; ``groups_filtered`` and ``keep_rate``), idle ratios,
switches, admission counts and where the devices were.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

from bidirl.core.ledger import audit_trained
from bidirl.frame.result import RunResult, admission_counts, decision_figures, pool_figures
from bidirl.obs.accounting import idle_ratios
from bidirl.runtime.checkpoints import read_jsonl
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.placement import Placement


def decision_record(d) -> dict:
    """One borrow decision as JSON: when, which direction, how many units, the predicted
    benefit and cost, the doubt (margin) and the verdict."""
    return {"t": round(d.t, 4), "direction": d.direction, "units": d.units,
            "benefit_s": round(d.benefit_s, 5), "cost_s": round(d.cost_s, 5),
            "margin_s": round(d.margin_s, 5), "admit": d.admit, "guided": d.guided}


def admission_summary(decisions: list) -> dict:
    """Counts of admitted / rejected borrows per direction, and the latest decisions."""
    return {"latest": [decision_record(d) for d in decisions[-20:]], **admission_counts(decisions)}


def write_admissions(path: Path, decisions: list) -> None:
    """Every borrow decision of the run, one JSON line each, in decision order.
    ``summary.json`` keeps only the counts and the last 20; this is what answers "why did
    it not borrow here?" after the fact."""
    with path.open("w") as f:
        for d in decisions:
            f.write(json.dumps(decision_record(d)) + "\n")


def audit(ledger_path: Path, cfg: TrainConfig, upto: int | None = None, created: int | None = None,
          pending=()) -> dict:
    """Every group of every step (before ``upto``, default ``run.steps``) trained exactly
    once, or filtered exactly once (dynamic sampling), never both; staleness within the bound.

    Read from ``trained_groups.jsonl``, which spans resumes, and checked by the one
    ledger audit (``core.ledger.audit_trained``) the controller's ledger uses too.  The
    groups expected: ids ``0 .. created - 1`` (``created``: the run's next group id; by
    default ``upto x prompts_per_step``, or past the highest id recorded when groups were
    filtered) but the ``pending`` ones, groups of later steps still in the store.
    """
    counts, filtered, staleness = Counter(), Counter(), {}
    for rec in read_jsonl(ledger_path)[0]:
        if rec.get("outcome") == "filtered":
            filtered[rec["group"]] += 1
            continue
        counts[rec["group"]] += 1
        staleness[rec["group"]] = max(staleness.get(rec["group"], 0), rec["staleness"])
    steps = cfg.run.steps if upto is None else upto
    if created is None:
        created = (max([*counts, *filtered]) + 1 if filtered else steps * cfg.rollout.prompts_per_step)
    skip = set(pending)
    expected = [g for g in range(created) if g not in skip]
    a = audit_trained(expected, counts, staleness, cfg.scheduler.staleness, filtered)
    return {"groups_expected": a.groups_total, "groups_trained": a.groups_trained,
            "groups_filtered": a.groups_filtered, "keep_rate": round(a.keep_rate, 4),
            "groups_lost": len(a.groups_lost), "trained_twice": len(a.trained_twice),
            "filtered_twice": len(a.filtered_twice),
            "max_staleness": a.max_staleness, "mean_staleness": round(a.mean_staleness, 4),
            "staleness_ok": not a.staleness_violations, "ok": a.ok}


def run_summary(cfg: TrainConfig, ledger_path: Path, rewards_by_step: dict[int, float], wall: float, ex,
                intervals, placement: Placement | None = None, upto: int | None = None, tally=None) -> dict:
    """``RunResult``'s names (what ``bidirl simulate`` writes), plus what training adds.

    ``ex`` is the run's ``DeviceExecutor`` (None: nothing ran, a finished run resumed).  A run
    stopped early is audited over the steps it applied (``upto``).  ``steps`` counts the run's
    steps across its resumes, as the audit does; ``segment_steps`` those of this process, over
    which the throughput and step times are measured."""
    # the groups this run created, but those of later steps still in the store (a stopped run's)
    created = ex.rollout.next_group_id() if ex else None
    checked = audit(ledger_path, cfg, upto, created, ex.job.store.groups if ex else ())
    rewards = [rewards_by_step[k] for k in sorted(rewards_by_step)]
    result = run_result(cfg, wall, ex, intervals, checked, tally).to_json() if ex else {
        "steps": cfg.run.steps, "wall_s": 0.0, "throughput_tokens_per_s": 0.0, "borrows": {}}
    return {
        **result, "steps": cfg.run.steps if upto is None else upto, "segment_steps": result["steps"] if ex else 0,
        "wall_s": round(wall, 2),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": statistics.mean(rewards[-3:]) if rewards else None,
        "reward_first_50": statistics.mean(rewards[:50]) if rewards else None,
        "reward_last_50": statistics.mean(rewards[-50:]) if rewards else None,
        "rewards": rewards,
        "groups_trained": checked["groups_trained"], "groups_filtered": checked["groups_filtered"],
        "keep_rate": checked["keep_rate"], "audit": checked, "audit_ok": checked["ok"],
        "idle_ratio": idle_ratios(intervals) if intervals else {},
        "switches": ex.switches if ex else [],
        "reclaim_waits": ex.reclaim_waits if ex else [],
        "lost_devices": ex.lost_devices if ex else [],
        "admission": admission_summary(ex.controller.state.admissions) if ex else {},
        "weight_sync": ex.sync.summary() if ex else {},
        **(nodes_summary(ex, placement) if ex else {}),
    }


def nodes_summary(ex, placement: Placement | None) -> dict:
    """Where the devices were (node address per device) and the measured switch costs
    per node pair (``<kind>/n<src>-n<dst>``: the weights' node to the lent device's)."""
    nodes = {"devices_per_node": ex.spec.devices_per_node}
    if placement is not None:
        nodes["device_nodes"] = [placement.node_ip(d) for d in range(len(placement.device_node))]
    return {"nodes": nodes, "switch_by_node_pair": ex.controller.state.est.switch.pair_medians()}


def run_result(cfg: TrainConfig, wall: float, ex, intervals, audit: dict, tally=None) -> RunResult:
    """A real run as a ``frame.result.RunResult``: the simulator's names and meanings.

    ``ideal_tokens_per_s`` packs the run's measured busy device-seconds onto every device
    with no bubble and no switch (busy work / devices = ideal wall time).
    """
    pools = pool_figures(ex.clock.tally if tally is None else tally)
    steps = [ex.steps[k] for k in sorted(ex.steps)]
    tokens = sum(r.total_tokens for r in steps)
    busy = sum(v["busy"] for v in pools["pool_seconds"].values())
    devices = len(ex.layout.pools)
    ideal = tokens / (busy / devices) if busy > 0 else 0.0
    throughput = tokens / wall if wall > 0 else 0.0
    ends = [0.0] + [r.finished_s for r in steps]
    lends = ex.hosting.lends
    return RunResult(
        policy=cfg.scheduler.policy, scenario="train", steps=len(steps), wall_s=wall, tokens_trained=tokens,
        throughput_tokens_per_s=round(throughput, 1), mean_step_time_s=wall / max(1, len(steps)),
        pool_busy_fraction=pools["pool_busy_fraction"], switch_time_s=pools["switch_time_s"],
        borrows={"roll_on_train": lends["roll_on_train"], "train_on_roll": lends["train_on_roll"]},
        ideal_tokens_per_s=ideal, efficiency=throughput / ideal if ideal else 0.0,
        staleness={"mean": audit["mean_staleness"], "max": float(audit["max_staleness"])},
        groups_trained=audit["groups_trained"],
        groups_lost=audit["groups_lost"] + audit["trained_twice"] + audit["filtered_twice"],
        groups_filtered=audit["groups_filtered"], keep_rate=audit["keep_rate"],
        trace_sha256=ex.clock.stream_sha256(), devices=devices, seed=cfg.run.seed,
        step_times_s=[b - a for a, b in zip(ends, ends[1:])],
        stage_model_median_error=ex.controller.state.est.median_errors(),
        admission=admission_counts(ex.controller.state.admissions),
        extra={**decision_figures(ex.controller), "pool_seconds": pools["pool_seconds"],
               "colocated_switches": lends["colocated"], "ledger_ok": audit["ok"]})
