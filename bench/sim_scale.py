"""Simulator scale and scheduling-decision latency, measured on the command a user runs.

BENCHMARKS.md, "Simulator scale and decision latency":

    .venv/bin/python -m bench.sim_scale                 # ~6 minutes (3 repeats)
    .venv/bin/python -m bench.sim_scale --repeats 1 --steps 20 --no-trace   # a quick look

Every figure comes from spawning ``bidirl simulate ... --json OUT``, start-up included.
Scale: ``scale-1024`` (1024 H100s, 200 steps) for ``async``, ``bidirl`` and ``bidirl --trace``,
``--repeats`` times each, interleaved: wall, the child's CPU time and peak memory (``os.wait4``),
the event loop's own time; target under 30 s without ``--trace``. Decision latency: the
controller's time per event, p50 / p99 / p99.9 / max, wall and thread CPU, on three small
scenarios and ``scale-1024``; target p99 under 1 ms. No assertion on timings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import RESULTS, write_json

SMALL = ("default", "a6000-32-qwen3-4b", "h100-32-qwen3-8b")
POLICIES = ("async", "bidirl")
KEYS = ("p50", "p99", "p999", "max")


def bidirl_command() -> list[str]:
    """The ``bidirl`` console script of this interpreter's environment, else ``-m``."""
    script = Path(sys.executable).with_name("bidirl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bidirl.cli"]


def run_cli(scenario: str, policy: str, steps: int | None, trace: bool, workdir: Path) -> dict:
    """Spawn ``bidirl simulate`` once; wall and child CPU seconds, plus its --json figures."""
    out, trace_path = workdir / "r.json", workdir / "trace.json"
    argv = ["simulate", "--scenario", scenario, "--policy", policy, "--json", str(out)]
    if steps is not None:
        argv += ["--steps", str(steps)]
    if trace:
        argv += ["--trace", str(trace_path)]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryFile(mode="w+") as err:
        wall0 = time.perf_counter()
        proc = subprocess.Popen(bidirl_command() + argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - wall0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"bidirl {' '.join(argv)} failed ({proc.returncode}):\n"
                             f"{err.read()}")
    r = json.loads(out.read_text())
    trace_mb = trace_path.stat().st_size / 2**20 if trace else 0.0
    out.unlink()
    if trace:
        trace_path.unlink()
    e = r["extra"]
    return {
        "scenario": scenario, "policy": policy, "trace": trace, "steps": r["steps"],
        "devices": r["devices"], "command": "bidirl " + " ".join(argv),
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime, "max_rss_mb": ru.ru_maxrss / 1024,
        "sim_seconds": e["sim_seconds"], "trace_mb": trace_mb, "load_average_start": load0,
        "events": e["events"], "actions_max": e["actions_max"],
        "decision_us": {k: e[f"decision_us_{k}"] for k in KEYS},
        "decision_cpu_us": {k: e[f"decision_cpu_us_{k}"] for k in KEYS},
        "throughput_tokens_per_s": r["throughput_tokens_per_s"],
        "efficiency": r["efficiency"], "groups_lost": r["groups_lost"],
        "trace_sha256": r["trace_sha256"],
    }


def _variant(r: dict) -> str:
    return f"{r['policy']}{' --trace' if r['trace'] else ''}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="override scale-1024's 200 steps")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each scale-1024 variant")
    ap.add_argument("--no-trace", action="store_true", help="skip the bidirl --trace variant")
    ap.add_argument("--json", "--out", dest="out", default=str(RESULTS / "sim_scale.json"),
                    help="where to write the figures (default bench/results/sim_scale.json)")
    args = ap.parse_args(argv)
    variants = [(p, False) for p in POLICIES] + ([] if args.no_trace else [("bidirl", True)])
    workdir = Path(tempfile.mkdtemp(prefix="sim_scale."))
    try:
        small = [run_cli(name, pol, None, False, workdir) for name in SMALL for pol in POLICIES]
        scale = []
        for rep in range(args.repeats):  # interleaved: rep 0 of each variant, then rep 1...
            for pol, trace in variants:
                r = run_cli("scale-1024", pol, args.steps, trace, workdir)
                r["repeat"] = rep
                scale.append(r)
                print(f"  [{rep + 1}/{args.repeats}] {r['command']}: wall {r['wall_s']:.1f} s"
                      f"  cpu {r['cpu_s']:.1f} s  sim {r['sim_seconds']:.1f} s  "
                      f"load {r['load_average_start']:.2f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print("\nbidirl simulate --scenario scale-1024 (min / median / max over "
          f"{args.repeats} interleaved runs)")
    head = (f"{'variant':<16} {'wall s':>20} {'cpu s':>20} {'sim s':>20} {'peak MB':>7} "
            f"{'tokens/s':>9}")
    print(head)
    print("-" * len(head))
    summary = {}
    for pol, trace in variants:
        runs = [r for r in scale if r["policy"] == pol and r["trace"] == trace]
        name = _variant(runs[0])
        stats = {k: {"min": min(v), "median": statistics.median(v), "max": max(v)}
                 for k in ("wall_s", "cpu_s", "sim_seconds")
                 for v in [[r[k] for r in runs]]}
        summary[name] = stats
        cols = " ".join(f"{s['min']:>6.1f}/{s['median']:>6.1f}/{s['max']:>6.1f}"
                        for s in stats.values())
        print(f"{name:<16} {cols} {max(r['max_rss_mb'] for r in runs):>7.0f} "
              f"{runs[0]['throughput_tokens_per_s']:>9,.0f}")

    rows = small + [next(r for r in scale if r["policy"] == pol and not r["trace"])
                    for pol in POLICIES]
    head = (f"\n{'scenario':<18} {'policy':<7} {'steps':>5} {'wall s':>7} {'cpu s':>7} "
            f"{'events':>7} {'decision wall us p50/p99/p99.9/max':>36} "
            f"{'decision cpu us p50/p99/p99.9/max':>36}")
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
    write_json(args.out, {
        "benchmark": "sim_scale", "date": datetime.date.today().isoformat(),
        "command": "python -m bench.sim_scale " + " ".join(argv if argv is not None else sys.argv[1:]),
        "bidirl": bidirl_command(), "cpu_count": os.cpu_count(),
        "load_average_end": load_avg, "scale_summary": summary, "scale_runs": scale,
        "rows": rows,
    }, indent=2)
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
