"""How long the timeline PNG takes for 100k intervals (1024 devices, and 8 dense rows).

BENCHMARKS.md, "Timeline plot":

    .venv/bin/python -m bench.timeline_plot --repeats 3 --json bench/results/timeline_plot.json

Draws the seeded synthetic schedules of ``bench/schedules.py`` (the generator the timeline
tests use too) with ``plot_timeline(..., max_devices=64)`` and reports, per
shape, the interval count and the best / median wall time over ``--repeats`` runs, with process
CPU time beside it. Target: under 5 s. No assertion: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import write_json
from bench.schedules import make_schedule
from bidirl.obs.timeline_plot import plot_timeline

SHAPES = {
    "1024-devices": dict(n_rollout=512, n_train=512, wall_s=300.0, mean_s=3.0),
    "dense-rows": dict(n_rollout=4, n_train=4, wall_s=1000.0, mean_s=0.08),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON to OUT")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            intervals = make_schedule(**shape, seed=2)
            wall, cpu = [], []
            for _ in range(args.repeats):
                w0, c0 = time.perf_counter(), time.process_time()
                plot_timeline(intervals, Path(tmp) / f"{name}.png", title=name, max_devices=64)
                wall.append(time.perf_counter() - w0)
                cpu.append(time.process_time() - c0)
            rows.append({"shape": name, **shape, "devices": shape["n_rollout"] + shape["n_train"],
                         "intervals": len(intervals), "wall_s_best": min(wall),
                         "wall_s_median": statistics.median(wall), "cpu_s_best": min(cpu)})
    print(f"{'shape':<14} {'devices':>7} {'intervals':>9} {'wall s best':>11} "
          f"{'wall s median':>13} {'cpu s best':>10}")
    for r in rows:
        print(f"{r['shape']:<14} {r['devices']:>7} {r['intervals']:>9} {r['wall_s_best']:>11.2f} "
              f"{r['wall_s_median']:>13.2f} {r['cpu_s_best']:>10.2f}")
    load_avg = os.getloadavg()
    print(f"load average at the end: {load_avg[0]:.2f} on {os.cpu_count()} cores")
    if args.json:
        write_json(args.json, {
            "benchmark": "timeline_plot", "date": datetime.date.today().isoformat(),
            "command": "python -m bench.timeline_plot " + " ".join(argv if argv is not None
                                                                   else sys.argv[1:]),
            "cpu_count": os.cpu_count(), "load_average_end": load_avg, "rows": rows,
        }, indent=2)
        print(f"-> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
