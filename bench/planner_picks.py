"""The planner's picks and predictions on a fixed set of scenarios, to compare two versions.

BENCHMARKS.md, "Planner regret and speed". A change meant to make the planner faster without
changing what it decides is checked by running this on both versions and comparing:

    PYTHONPATH=OLD/src .venv/bin/python -m bench.planner_picks --out /tmp/before.json
    PYTHONPATH=src .venv/bin/python -m bench.planner_picks --out /tmp/after.json --compare /tmp/before.json

Scenarios: ``default`` at 256 devices and as shipped, the five ``user-*`` scenarios, the
48-point paper grid and the 30 random scenarios of ``bench.planner_regret`` (8 steps).
``--compare`` prints how many picks, top-5 lists and predictions (20 best, exactly) agree
and exits 1 if a pick differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.planner_regret import random_scenarios
from bidirl.planner.plan import plan
from bidirl.sim.grid import paper_grid
from bidirl.sim.scenario import load

USER = ("user-a6000-12-14b", "user-a6000-24-short", "user-h100-40-drift", "user-h100-64-32b",
        "user-h200-48-14b-32k")


def scenarios(quick: bool) -> list[tuple[object, int | None]]:
    """(scenario, planning horizon): the regret sets at the bench's 8 steps."""
    out = [(load("default").replace(devices=256), None), (load("default"), None)]
    out += [(load(n), None) for n in USER]
    if not quick:
        out += [(sc, 8) for sc in paper_grid(steps=8) + random_scenarios(30, 1000, 8)]
    return out


def picks(quick: bool) -> dict:
    out = {}
    for sc, steps in scenarios(quick):
        r = plan(sc, top_k=5, steps=steps)
        out[f"{sc.name}@{sc.devices}"] = {
            "pick": r.envelope.label(), "top": [c.envelope.label() for c in r.alternatives],
            "pred": [c.prediction.tokens_per_s for c in r.candidates[:20]]}
    return out


def compare(a: dict, b: dict) -> int:
    """Over the scenarios both files have."""
    both = [k for k in a if k in b]
    same = [k for k in both if a[k]["pick"] == b[k]["pick"]]
    top = sum(a[k]["top"] == b[k]["top"] for k in same)
    exact = sum(a[k]["pred"] == b[k]["pred"] for k in same)
    print(f"{len(both)} scenarios: same pick {len(same)}, same top-5 {top}, identical predictions {exact}")
    for k in both:
        if k not in same:
            print(f"  pick differs: {k}: {a[k]['pick']} -> {b[k]['pick']}")
    return 0 if len(same) == len(both) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="a file this script wrote for another version")
    ap.add_argument("--quick", action="store_true", help="default and the user scenarios only")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    got = picks(args.quick)
    args.out.write_text(json.dumps(got, indent=0))
    print(f"planned {len(got)} scenarios in {time.perf_counter() - t0:.1f} s; wrote {args.out}")
    return compare(json.loads(args.compare.read_text()), got) if args.compare else 0


if __name__ == "__main__":
    raise SystemExit(main())
