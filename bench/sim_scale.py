"""Simulator scale and scheduling-decision latency.

1. Scale: ``scale-1024`` (1024 H100s, 512 rollout replicas, 1024 prompts x 16 responses,
   200 steps) under ``async`` and ``bidirl``: wall time and process CPU time of the whole
   simulation (target: under 60 s).  The machine is shared, so wall time is noisy; CPU
   time is what the simulation itself cost.
2. Decision latency: the controller's time per event it handles (observe the event, run
   the policy, commit its actions; the runtime's work on the actions is excluded), as
   p50 / p99 / p99.9 / max, on the three 32-or-fewer-device built-in scenarios and on
   ``scale-1024``.  Target: p99 under 1 ms.  Both wall time (``perf_counter``) and thread
   CPU time (``thread_time``, immune to the process being descheduled) are reported; on
   a busy machine the wall figures include other processes' time slices.

Prints a table and writes ``bench/results/sim_scale.json``.  No assertion on timings:
this is a measurement, not a test.

    .venv/bin/python bench/sim_scale.py                 # ~2 minutes
    .venv/bin/python bench/sim_scale.py --steps 20      # quick look at scale-1024
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from bidirl.sim.run import simulate
from bidirl.sim.scenario import load

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = ("default", "a6000-32-qwen3-4b", "h100-32-qwen3-8b")
POLICIES = ("async", "bidirl")
KEYS = ("p50", "p99", "p999", "max")


def run_one(scenario: str, policy: str, steps: int | None) -> dict:
    sc = load(scenario)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    r = simulate(sc, policy, steps=steps, record_intervals=False)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    e = r.extra
    return {
        "scenario": scenario, "policy": policy, "steps": r.steps, "devices": r.devices,
        "wall_s": wall, "cpu_s": cpu, "events": e["events"], "actions_max": e["actions_max"],
        "decision_us": {k: e[f"decision_us_{k}"] for k in KEYS},
        "decision_cpu_us": {k: e[f"decision_cpu_us_{k}"] for k in KEYS},
        "throughput_tokens_per_s": r.throughput_tokens_per_s, "efficiency": r.efficiency,
        "groups_lost": r.groups_lost,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="override scale-1024's 200 steps")
    ap.add_argument("--out", default=str(RESULTS / "sim_scale.json"))
    args = ap.parse_args(argv)
    rows = [run_one(name, pol, None) for name in SMALL for pol in POLICIES]
    rows += [run_one("scale-1024", pol, args.steps) for pol in POLICIES]
    head = (f"{'scenario':<18} {'policy':<7} {'steps':>5} {'wall s':>7} {'cpu s':>7} {'events':>7} "
            f"{'decision wall us p50/p99/p99.9/max':>36} {'decision cpu us p50/p99/p99.9/max':>36}")
    print(head)
    print("-" * len(head))
    for r in rows:
        w = "/".join(f"{r['decision_us'][k]:.0f}" for k in KEYS)
        c = "/".join(f"{r['decision_cpu_us'][k]:.0f}" for k in KEYS)
        print(f"{r['scenario']:<18} {r['policy']:<7} {r['steps']:>5} {r['wall_s']:>7.1f} "
              f"{r['cpu_s']:>7.1f} {r['events']:>7} {w:>36} {c:>36}")
    load_avg = os.getloadavg()
    print(f"load average at the end: {load_avg[0]:.2f} on {os.cpu_count()} cores "
          "(shared machine: wall times include other processes' time slices)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "benchmark": "sim_scale", "date": datetime.date.today().isoformat(),
        "command": "bench/sim_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu_count": os.cpu_count(), "load_average_end": load_avg, "rows": rows,
    }, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
