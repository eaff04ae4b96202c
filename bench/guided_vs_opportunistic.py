"""``bidirl`` against its own ablation ``bidirl-opportunistic``, scenario by scenario.

The guided policy prices every borrow with its stage models before admitting it; the
opportunistic one lends whatever is idle.  The guided one should never lose to it by more
than noise: target ``bidirl >= 0.99 x bidirl-opportunistic`` on the mean of 3 seeds, on the
48-point paper grid (its half/half split) and on the 30 seeded random scenarios of
``planner_regret.py`` (their half/half split where it fits in memory, else the planner's
envelope).  For every scenario under the target, the report keeps a trace of both
policies per seed: admissions per direction (admitted / rejected), lends, switching
device-seconds, busy fractions, the admitted borrows' predicted net seconds, step times.

Writes ``bench/results/guided_vs_opportunistic.json``; prints a table of the misses and the
summary.  Throughputs are simulated: they do not depend on the machine.

    .venv/bin/python bench/guided_vs_opportunistic.py                 # grid + 30 random, 3 seeds
    .venv/bin/python bench/guided_vs_opportunistic.py --limit 6       # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bidirl.planner.plan import plan, scenario_with_envelope  # noqa: E402
from bidirl.sim.grid import paper_grid  # noqa: E402
from bidirl.sim.run import simulate  # noqa: E402
from bidirl.sim.scenario import ScenarioError  # noqa: E402
from planner_regret import SEED_STRIDE, random_scenarios  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
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
    report = {"command": " ".join(["bench/guided_vs_opportunistic.py", *(argv or sys.argv[1:])]),
              "steps": args.steps, "seeds": args.seeds, "target": TARGET, "wall_s": time.perf_counter() - t0,
              "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
