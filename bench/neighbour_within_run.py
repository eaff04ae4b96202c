"""Does a CPU-only neighbour slow the home replica's decode steps inside a real run?

``bench/contention.py`` finds an ``async`` run's decode steps 1.1-1.2x slower while the
training device computes than while it idles, but the other core is never simply "busy"
there: the trainer streams memory (weights, gradients, Adam state).  This script separates
the two.  One ``async`` run of a ``bench/real_policies.py`` workload is left to run while a
neighbour process that only spins in Python (the core busy, almost no memory traffic) is
resumed and stopped from outside every ``--phase-s`` seconds (SIGCONT / SIGSTOP).  Each
full-batch decode measurement (``profile.jsonl``) is then put in the phase it ran in
(dropped if it straddles a switch) and by what the training device did meanwhile
(``trace.json``: idle for <= 10 % of it, or training for >= 90 %), and the medians of a
decode step's milliseconds are compared.  The run's clock is aligned to the wall clock by
the moment each step's line appears in ``metrics.jsonl`` (as ``pinning_within_run.py``).

    .venv/bin/python bench/neighbour_within_run.py --workload shifting --json bench/results/neighbour_within_run.json

Prints and writes the median per (neighbour phase, trainer) cell, its count, and the
ratios: spin / off with the trainer idle (the CPU-only neighbour's cost) and trainer busy /
idle with the spin off (the training neighbour's cost).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pinning_within_run import ENV, classify, device_workers, note_steps_seen, run_clock_phases
from real_policies import BASE, LONG_PROMPT_TOKENS, ROOT, WORKLOADS, long_prompt_rows

IDLE, BUSY = 0.1, 0.9  # share of a decode measurement the training device spent training


def run(workload: str, phase_s: float, keep: Path) -> tuple[Path, list[tuple[float, float, str]], dict[int, float]]:
    """One ``async`` run with the spinning neighbour toggled; its run dir, the phases (wall
    clock) and when each step's metrics line appeared."""
    w = WORKLOADS[workload]
    over = [*BASE, *w.overrides, f"run.steps={w.steps}", "scheduler.policy=async"]
    if w.long_prompts:
        over += [f"data.files={long_prompt_rows(keep / 'prompts.jsonl')}",
                 f"data.max_prompt_length={LONG_PROMPT_TOKENS + 64}"]
    run_dir = keep / "run"
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.kill(spin.pid, signal.SIGSTOP)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(run_dir), *over],
                                cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=open(keep / "stderr.log", "w"))
        metrics = run_dir / "metrics.jsonl"
        step_seen: dict[int, float] = {}
        phases: list[tuple[float, float, str]] = []
        name, started = None, 0.0
        while proc.poll() is None:
            now = time.time()
            note_steps_seen(metrics, step_seen, now)
            if name is None and len(device_workers()) >= 2:  # both device workers up: start switching
                name, started = "off", now
            elif name is not None and now - started >= phase_s:
                phases.append((started, now, name))
                name = "spin" if name == "off" else "off"
                os.kill(spin.pid, signal.SIGCONT if name == "spin" else signal.SIGSTOP)
                started = time.time()
            time.sleep(0.02)
        if name is not None:
            phases.append((started, time.time(), name))
    finally:
        spin.kill()
    if proc.returncode != 0:
        raise SystemExit(f"bidirl train failed ({proc.returncode}); see {keep / 'stderr.log'}")
    return run_dir, phases, step_seen


def analyse(run_dir: Path, phases_wall: list[tuple[float, float, str]], step_seen: dict[int, float]) -> dict:
    """Median ms per decode step (full batch) per ``"<phase> / trainer idle|busy"`` cell."""
    recs = [json.loads(line) for line in (run_dir / "profile.jsonl").read_text().splitlines()]
    phases, spread = run_clock_phases(recs, phases_wall, step_seen)
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    train = [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in trace
             if e.get("ph") == "X" and e.get("tid") == 2 and e.get("args", {}).get("activity") == "busy"]

    def training(a: float, b: float) -> float:
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in train) / (b - a) if b > a else 0.0

    decode = [r for r in recs if r["event"] == "StageMeasured" and r["stage"] == "decode"]
    cap = max((r["features"][1] / r["features"][0] for r in decode), default=0.0)
    full = [r for r in decode if r["features"][1] / r["features"][0] >= cap - 0.1]
    cells: dict[str, list[float]] = {}
    for phase, idx in classify([(r["t"], r["seconds"]) for r in full], phases).items():
        for i in idx:
            r = full[i]
            share = training(r["t"] - r["seconds"], r["t"])
            trainer = "idle" if share <= IDLE else "busy" if share >= BUSY else None
            if trainer:
                cells.setdefault(f"{phase} / trainer {trainer}", []).append(1e3 * r["seconds"] / r["features"][0])
    med = {k: statistics.median(v) for k, v in cells.items()}

    def ratio(a: str, b: str) -> float | None:
        return med[a] / med[b] if a in med and b in med else None

    return {"alignment_spread_s": spread, "phases": len(phases),
            "decode_step_ms": med, "count": {k: len(v) for k, v in cells.items()},
            "spin_over_off_trainer_idle": ratio("spin / trainer idle", "off / trainer idle"),
            "trainer_busy_over_idle_spin_off": ratio("off / trainer busy", "off / trainer idle")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="shifting", choices=list(WORKLOADS))
    ap.add_argument("--phase-s", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--json", default=str(ROOT / "bench/results/neighbour_within_run.json"))
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bidirl-neighbour-") as tmp:
        base = Path(args.keep or tmp)
        for i in range(args.runs):
            keep = base / f"{args.workload}-{i:02d}"
            keep.mkdir(parents=True, exist_ok=True)
            r = analyse(*run(args.workload, args.phase_s, keep))
            results.append(r)
            cells = "  ".join(f"{k} {v:.3f} ms (n={r['count'][k]})" for k, v in sorted(r["decode_step_ms"].items()))
            print(f"run {i + 1}: {cells}")
            for key in ("spin_over_off_trainer_idle", "trainer_busy_over_idle_spin_off"):
                print(f"run {i + 1}: {key} {r[key] if r[key] is None else round(r[key], 3)}")
    Path(args.json).write_text(json.dumps({"workload": args.workload, "phase_s": args.phase_s, "runs": results},
                                          indent=1))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
