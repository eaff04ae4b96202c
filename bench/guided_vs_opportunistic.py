"""``bidirl`` against its own ablation ``bidirl-opportunistic``, scenario by scenario.

BENCHMARKS.md, "Guided against opportunistic borrowing":

    .venv/bin/python -m bench.guided_vs_opportunistic             # grid + 30 random, 3 seeds
    .venv/bin/python -m bench.guided_vs_opportunistic --limit 6   # a quick look

Target: ``bidirl >= 0.99 x bidirl-opportunistic`` on the mean of 3 seeds, on the paper grid
(half/half split) and the 30 random scenarios of ``bench.planner_regret`` (half/half where it
fits, else the planner's envelope). A scenario under the target keeps a per-seed trace of both
policies (admissions, lends, switching, busy fractions, step times).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.measure import RESULTS, write_json
from bench.planner_regret import SEED_STRIDE, random_scenarios
from bidirl.planner.plan import plan, scenario_with_envelope
from bidirl.sim.grid import paper_grid
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError

POLICIES = ("bidirl", "bidirl-opportunistic")
TARGET = 0.99


def _trace(r) -> dict:
    return {"tokens_per_s": r.throughput_tokens_per_s, "admission": r.admission, "borrows": r.borrows,
            "switch_time_s": round(r.switch_time_s, 2), "pool_busy_fraction": r.pool_busy_fraction,
            "admission_net_s": round(r.extra.get("admission_net_s", 0.0), 2),
            "step_times_s": [round(x, 2) for x in r.step_times_s]}


def runnable(sc, kind: str):
    """The scenario on a split that fits: its own, or (random set) the planner's."""
    try:
        simulate(sc, "async", steps=1, record_intervals=False)
        return sc, "own split"
    except ScenarioError:
        if kind == "grid":
            raise
        env = plan(sc, top_k=1).envelope
        return scenario_with_envelope(sc, env), f"planner's {env.label()}"


def compare(sc, kind: str, seeds: int, steps: int) -> dict:
    sc, split = runnable(sc, kind)
    runs = {p: [simulate(sc, p, steps=steps, seed=sc.seed + SEED_STRIDE * j, record_intervals=False)
                for j in range(seeds)] for p in POLICIES}
    mean = {p: statistics.fmean(r.throughput_tokens_per_s for r in runs[p]) for p in POLICIES}
    ratio = mean["bidirl"] / mean["bidirl-opportunistic"]
    row = {"scenario": sc.name, "set": kind, "description": sc.description, "split": split,
           "tokens_per_s": mean, "ratio": ratio,
           "per_seed_ratio": [a.throughput_tokens_per_s / b.throughput_tokens_per_s
                              for a, b in zip(runs["bidirl"], runs["bidirl-opportunistic"])]}
    if ratio < TARGET:
        row["trace"] = {p: [_trace(r) for r in runs[p]] for p in POLICIES}
    return row


def summarize(rows: list[dict]) -> dict:
    out = {}
    for name in ("grid", "random", "all"):
        sub = [r for r in rows if name == "all" or r["set"] == name]
        if not sub:
            continue
        ratios = [r["ratio"] for r in sub]
        out[name] = {"n": len(sub), "min": min(ratios), "median": statistics.median(ratios),
                     "max": max(ratios), "below_target": sum(x < TARGET for x in ratios),
                     "misses": sorted((r["scenario"], round(r["ratio"], 4)) for r in sub if r["ratio"] < TARGET)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="simulated steps per run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--random", type=int, default=30, help="random scenarios (planner_regret's, seed 1000)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N of each set")
    ap.add_argument("--out", type=Path, default=RESULTS / "guided_vs_opportunistic.json")
    args = ap.parse_args(argv)
    grid, rand = paper_grid(steps=args.steps), random_scenarios(args.random, 1000, args.steps)
    if args.limit:
        grid, rand = grid[:args.limit], rand[:args.limit]
    rows, t0 = [], time.perf_counter()
    for kind, scs in (("grid", grid), ("random", rand)):
        for sc in scs:
            rows.append(compare(sc, kind, args.seeds, args.steps))
            r = rows[-1]
            print(f"{kind:6} {r['scenario']:30} {r['ratio']:.4f}  "
                  + " ".join(f"{x:.3f}" for x in r["per_seed_ratio"]) + f"  ({r['split']})", flush=True)
    summary = summarize(rows)
    for name, s in summary.items():
        print(f"{name:6} bidirl / bidirl-opportunistic (mean of {args.seeds} seeds): min {s['min']:.4f} "
              f"median {s['median']:.4f} max {s['max']:.4f}; below {TARGET}: {s['below_target']} of {s['n']}")
    report = {"command": " ".join(["python -m bench.guided_vs_opportunistic", *(argv or sys.argv[1:])]),
              "steps": args.steps, "seeds": args.seeds, "target": TARGET, "wall_s": time.perf_counter() - t0,
              "summary": summary, "rows": rows}
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
