"""How cold is a run's first training micro-batch?  The trainers' start-up warm-up, measured.

A process's first forward and backward pass on a CPU runs several times slower than its later
ones (its memory is new and is faulted in page by page; kernels initialise).  Since
``cluster.warm_up_trainers`` every trainer computes one thrown-away micro-batch at start-up,
so the run's first is warm.  This reads kept run directories (``profile.jsonl``) and, for the
primary trainer (``train_micro``) and the auxiliaries (``aux_micro``), prints the first
micro-batch's seconds per token over the primary's median seconds per token in that run
(micro-batches 4 onward: the steady state): 1.0 is as fast as the run's typical micro-batch.

    .venv/bin/python bench/first_microbatch.py RUNS_ROOT [RUNS_ROOT ...] --json OUT.json

A run directory is any folder below a root with a ``profile.jsonl``; its name (``W-NN-POLICY``)
gives the workload and policy.  Medians are over runs of the same workload and policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median

STEADY_FROM = 3  # micro-batches before this index are left out of the run's typical rate


def micro_batches(profile: Path, stage: str) -> list[tuple[float, float]]:
    """(tokens, seconds) of each ``stage`` measurement, in order (features: count, tokens, ...)."""
    out = []
    with profile.open() as f:
        for line in f:
            row = json.loads(line)
            if row.get("stage") == stage and row.get("seconds", 0) > 0 and row["features"][1] > 0:
                out.append((float(row["features"][1]), float(row["seconds"])))
    return out


def first_over_typical(run_dir: Path) -> dict[str, float | None]:
    """The first primary and the first auxiliary micro-batch, each as seconds per token over
    the primary's steady median; None where the run has none (or too few to have a median)."""
    primary = micro_batches(run_dir / "profile.jsonl", "train_micro")
    aux = micro_batches(run_dir / "profile.jsonl", "aux_micro")
    steady = [s / t for t, s in primary[STEADY_FROM:]]
    if not steady:
        return {"primary_first": None, "aux_first": None}
    rate = median(steady)
    return {"primary_first": primary[0][1] / primary[0][0] / rate,
            "aux_first": aux[0][1] / aux[0][0] / rate if aux else None}


def label(run_dir: Path) -> tuple[str, str]:
    """(workload, policy) from a ``W-NN-POLICY`` directory name."""
    parts = run_dir.name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        raise ValueError(f"{run_dir}: expected a run directory named WORKLOAD-NN-POLICY "
                         "(as bench/real_policies.py --keep writes them)")
    return parts[0], parts[2]


def collect(roots: list[Path]) -> dict[str, dict]:
    by: dict[str, dict] = {}
    for root in roots:
        if not root.exists():
            raise SystemExit(f"first_microbatch: {root} does not exist")
        for profile in sorted(root.rglob("profile.jsonl")):
            run = profile.parent
            w, p = label(run)
            row = by.setdefault(f"{w} {p}", {"workload": w, "policy": p, "runs": []})
            row["runs"].append({"run": str(run), **first_over_typical(run)})
    for row in by.values():
        for key in ("primary_first", "aux_first"):
            xs = [r[key] for r in row["runs"] if r[key] is not None]
            row[f"{key}_median"] = median(xs) if xs else None
            row[f"{key}_max"] = max(xs) if xs else None
    return by


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path, help="folders holding kept run directories")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    by = collect(args.roots)
    if not by:
        raise SystemExit("first_microbatch: no profile.jsonl under " + ", ".join(map(str, args.roots)))

    def fmt(x):
        return "   -" if x is None else f"{x:4.2f}"

    print(f"{'workload':14s} {'policy':7s} runs  primary first (median / max)  aux first (median / max)")
    for row in by.values():
        print(f"{row['workload']:14s} {row['policy']:7s} {len(row['runs']):4d}  "
              f"{fmt(row['primary_first_median'])} / {fmt(row['primary_first_max'])}"
              f"                  {fmt(row['aux_first_median'])} / {fmt(row['aux_first_max'])}")
    if args.json:
        args.json.write_text(json.dumps(by, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
