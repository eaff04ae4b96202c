"""The paper grid in the simulator: every policy on every grid scenario, ratios vs ``async``.

BENCHMARKS.md, "Paper grid (simulator)". The latest run (exit 1: a seed-0 check failed):

    .venv/bin/python -m bench.sim_grid --seeds 3        # -> bench/results/grid.json, a few minutes
    .venv/bin/python -m bench.sim_grid --limit 4 --policies async,bidirl   # a quick look

48 scenarios (``bidirl.sim.grid.paper_grid``) x 7 policies on the same half/half split and seed.
Prints the ratios against ``async`` and the checks: ``bidirl`` >= 0.99 x ``async`` everywhere,
``bidirl`` >= ``bidirl-opportunistic`` on the median (exit 1 if one fails on seed 0). ``--seeds
N`` adds the same checks on seed-mean throughputs (one seed carries trajectory noise).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

from bench.measure import RESULTS, write_json
from bidirl.sim.grid import format_table, paper_grid, run_grid, summarize
from bidirl.sim.result import POLICIES


def checks(rows) -> dict:
    """The issue's pass/fail checks over the grid's rows."""
    out = {}
    if rows and {"async", "bidirl"} <= set(rows[0].results):
        worst = min(rows, key=lambda r: r.ratio("bidirl"))
        out["bidirl_ge_0.99_async_everywhere"] = {
            "ok": worst.ratio("bidirl") >= 0.99,
            "worst": {"scenario": worst.scenario, "ratio": worst.ratio("bidirl")}}
    if rows and {"bidirl", "bidirl-opportunistic"} <= set(rows[0].results):
        med = statistics.median(r.ratio("bidirl", "bidirl-opportunistic") for r in rows)
        out["bidirl_ge_opportunistic_median"] = {"ok": med >= 1.0, "median_ratio": med}
    return out


def by_axis(rows) -> dict:
    """Median bidirl / async per value of each grid axis (where the gains come from)."""
    # names are hardware-devices-qwen3-size-maxlen-staleness, e.g. h100-32-qwen3-8b-16k-s1
    axes = {"hardware": 0, "devices": 1, "model": 3, "max_len": 4, "staleness": 5}
    out = {}
    for axis, i in axes.items():
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r.scenario.split("-")[i], []).append(r.ratio("bidirl"))
        out[axis] = {k: statistics.median(v) for k, v in sorted(groups.items())}
    return out


class MeanRow:
    """A grid row whose throughputs are means over seeds (same interface as ``GridRow``)."""

    def __init__(self, scenario: str, tput: dict[str, float]) -> None:
        self.scenario, self.tput, self.results = scenario, tput, tput

    def ratio(self, policy: str, baseline: str = "async") -> float:
        return self.tput[policy] / self.tput[baseline]


def seed_means(runs: list[list]) -> list[MeanRow]:
    return [MeanRow(rows[0].scenario, {
        p: statistics.fmean(r.results[p].throughput_tokens_per_s for r in rows)
        for p in rows[0].results}) for rows in zip(*runs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="training steps per simulation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="repeat with this many seeds")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--limit", type=int, help="only the first N grid scenarios")
    ap.add_argument("--out", default=str(RESULTS / "grid.json"))
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    scenarios = paper_grid(steps=args.steps, seed=args.seed)[:args.limit]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    rows = run_grid(scenarios, policies, progress=_progress)
    runs = [rows] + [run_grid(paper_grid(steps=args.steps, seed=args.seed + k)[:args.limit],
                              policies, progress=_progress) for k in range(1, args.seeds)]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(format_table(rows, policies))
    summary = summarize(rows)
    result = {"checks": checks(rows), "by_axis": by_axis(rows) if "bidirl" in policies else {},
              "summary": summary}
    if args.seeds > 1:
        means = seed_means(runs)
        ratios = [m.ratio("bidirl") for m in means] if "bidirl" in policies else []
        result["seed_mean"] = {
            "seeds": list(range(args.seed, args.seed + args.seeds)),
            "checks": checks(means),
            "bidirl_over_async": {"min": min(ratios), "median": statistics.median(ratios),
                                  "max": max(ratios)} if ratios else {},
            "per_seed_bidirl_over_async_min": [min(r.ratio("bidirl") for r in run)
                                               for run in runs] if ratios else [],
            "ratio_vs_async": {m.scenario: {p: m.ratio(p) for p in policies} for m in means}}
    print(json.dumps(result, indent=2))
    print(f"{len(scenarios)} scenarios x {len(policies)} policies x {args.seeds} seed(s), "
          f"{args.steps} steps: "
          f"wall {wall:.0f} s, process CPU {cpu:.0f} s (shared machine: wall is noisy)")
    write_json(args.out, {
        "benchmark": "sim_grid", "date": datetime.date.today().isoformat(),
        "command": "python -m bench.sim_grid " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": args.steps, "seed": args.seed, "policies": policies,
        "wall_s": wall, "cpu_s": cpu, **result,
        "rows": [{"scenario": r.scenario,
                  "ratio_vs_async": {p: r.ratio(p) for p in policies} if "async" in policies
                  else {},
                  "throughput_tokens_per_s": {p: res.throughput_tokens_per_s
                                              for p, res in r.results.items()},
                  "efficiency": {p: res.efficiency for p, res in r.results.items()},
                  "borrows": {p: res.borrows for p, res in r.results.items()},
                  "admission": {p: res.admission for p, res in r.results.items()}}
                 for r in rows]}, indent=2)
    print(f"-> {args.out}")
    return 0 if all(c["ok"] for c in result["checks"].values()) else 1  # seed 0's checks


def _progress(done: int, total: int, what: str) -> None:
    if done == total or done % 20 == 0:
        print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
