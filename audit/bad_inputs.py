"""The bad-input table: adversarial but fair inputs to ``bidirl``, each run and classified.

BENCHMARKS.md, "Bad inputs":

    .venv/bin/python -m audit.bad_inputs --with-runs   # every case, the latest table
    .venv/bin/python -m audit.bad_inputs               # the cases that fail before workers start
    .venv/bin/python -m audit.bad_inputs -k reward     # only cases whose name contains "reward"

Every case (``audit/bad_input_cases.py``; add one there) is one ``python -m bidirl.cli ...``
subprocess with a timeout (some with a set-up, an action while it runs such as a signal, and a
check after: ``audit/bad_input_hooks.py``), classified as a clean error (exit 2, a one-line
message naming the field, no traceback), correct behaviour (the exit status expected, 0 unless
the case sends a signal, with the expected effect), vague (exit 2 without naming the field),
traceback, hang or wrong. Prints the table, writes bench/results/bad_inputs.json (with the
commit measured) and exits 1 if any case is not clean or correct.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from audit import bad_input_cases as bic
from bench.measure import RESULTS, code_version, write_json


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-runs", action="store_true", help="also the cases that start workers (minutes each)")
    p.add_argument("-k", help="only the cases whose name contains this")
    p.add_argument("--json", default=str(RESULTS / "bad_inputs.json"))
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
    write_json(args.json, {
        "date": time.strftime("%Y-%m-%d %H:%M"), "commit": code_version(), "with_runs": args.with_runs,
        "filter": args.k,
        "cases": len(outcomes), "counts": counts, "wall_s": round(wall, 1),
        "outcomes": [o.to_json() for o in outcomes]})
    for o in bad:
        print(f"NOT CLEAN: {o.case.name}: {o.cls}: {o.message}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
