"""The bad-input table: adversarial but fair inputs to ``bidirl``, each run and classified.

Every case (``tests/bad_input_cases.py``) is one ``python -m bidirl.cli ...`` subprocess
with a timeout, classified as a clean error (exit 2, a one-line message naming the field,
no traceback), correct behaviour (exit 0 with the expected effect), vague (exit 2 without
naming the field), traceback, hang or wrong.  Prints the table, writes
bench/results/bad_inputs.json and exits 1 if any case is not clean or correct.

    .venv/bin/python bench/bad_inputs.py              # the cases that fail before workers start
    .venv/bin/python bench/bad_inputs.py --with-runs  # plus the few that start workers and train
    .venv/bin/python bench/bad_inputs.py -k reward    # only cases whose name contains "reward"
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # this checkout's bidirl, whatever is installed

import bad_input_cases as bic  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-runs", action="store_true", help="also the cases that start workers (minutes each)")
    p.add_argument("-k", help="only the cases whose name contains this")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "bad_inputs.json"))
    p.add_argument("--keep", help="run in this directory and keep it (default: a temporary one)")
    args = p.parse_args()
    selected = bic.cases(with_runs=args.with_runs)
    if args.k:
        selected = [c for c in selected if args.k in c.name]

    def progress(o: bic.Outcome) -> None:
        print(f"[{o.cls:>9}] {o.case.name} ({o.seconds:.1f} s)", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    if args.keep:
        outcomes = bic.run_cases(selected, Path(args.keep), progress)
    else:
        with tempfile.TemporaryDirectory(prefix="bidirl-bad-inputs-") as tmp:
            outcomes = bic.run_cases(selected, Path(tmp), progress)
    wall = time.perf_counter() - t0
    print(bic.format_table(outcomes))
    counts = bic.counts(outcomes)
    bad = [o for o in outcomes if o.cls not in bic.OK_CLASSES]
    print(f"\n{len(outcomes)} cases in {wall:.0f} s: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "with_runs": args.with_runs, "filter": args.k,
        "cases": len(outcomes), "counts": counts, "wall_s": round(wall, 1),
        "outcomes": [o.to_json() for o in outcomes]}, indent=1) + "\n")
    for o in bad:
        print(f"NOT CLEAN: {o.case.name}: {o.cls}: {o.message}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
