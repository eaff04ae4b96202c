"""Does pinning the device workers' compute threads to their own cores speed a packed run?
Measured *within* one ``bidirl`` run, phase against phase.

Between runs this machine's speed drifts by up to ~40 % (async rollout-heavy ran 394-561
tokens/s in one series), so a run-against-run comparison of pinned and unpinned cannot
resolve a few percent.  Here one ``bidirl train`` run (a ``bench/real_policies.py``
workload) is left to run while this script switches the pinning from outside every
``--phase-s`` seconds, alternating:

* ``pinned``: each device worker's compute threads (those that used more than
  ``BUSY_SHARE`` of a core in the last phase: the replica's stepping thread, the trainer's
  calls) on a core of their own, worker k on the k-th core; every other thread (Ray's)
  free;
* ``free``: every thread may run on every core (the runtime's default).

Afterwards each decode measurement (``profile.jsonl``: a sum of >= 0.25 s of one replica's
steps) and each micro-batch is assigned to the phase it ran in (dropped if it straddles a
switch), and the medians of a decode step's time (at the workload's full batch) and of a
micro-batch's seconds per token are compared.  The run's clock is aligned to the wall clock
by the moment each step's line appears in ``metrics.jsonl``.

    .venv/bin/python bench/pinning_within_run.py --workload rollout-heavy --json bench/results/pinning_within_run.json

Prints and writes the medians per phase, their counts and the ratio pinned / free.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_policies import BASE, ENV, LONG_PROMPT_TOKENS, ROOT, WORKLOADS, long_prompt_rows  # noqa: E402

BUSY_SHARE = 0.2  # of a core over the last phase: a compute thread (Ray's own use ~1 %)
HZ = os.sysconf("SC_CLK_TCK")


def device_workers() -> list[int]:
    """Pids of the device workers (``ray::DeviceWorker``), oldest first."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open(f"/proc/{p}/cmdline", "rb").read().startswith(b"ray::DeviceWorker"):
                    out.append(int(p))
            except OSError:
                pass
    return sorted(out)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of every thread of ``pid``."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            f = open(f"/proc/{pid}/task/{t}/stat").read()
            f = f[f.rfind(")") + 2:].split()
            out[int(t)] = (int(f[11]) + int(f[12])) / HZ
        except (OSError, IndexError):
            pass
    return out


def set_affinity(tids, cores) -> None:
    for t in tids:
        try:
            os.sched_setaffinity(t, cores)
        except OSError:  # a thread that ended
            pass


def classify(records: list[tuple[float, float]], phases: list[tuple[float, float, str]]) -> dict[str, list[int]]:
    """Indices of ``records`` ((end, seconds) on the run's clock) by the phase ``(start, end,
    name)`` that holds the whole of it; a record straddling a switch is left out."""
    out: dict[str, list[int]] = {}
    for i, (end, seconds) in enumerate(records):
        start = end - seconds
        for a, b, name in phases:
            if a <= start and end <= b:
                out.setdefault(name, []).append(i)
                break
    return out


def note_steps_seen(metrics: Path, step_seen: dict[int, float], now: float) -> None:
    """Record the wall time at which each step's line first appears in ``metrics.jsonl``."""
    if metrics.is_file():
        for k in range(sum(1 for _ in metrics.open())):
            step_seen.setdefault(k, now)


def run_clock_phases(recs: list[dict], phases_wall: list[tuple[float, float, str]],
                     step_seen: dict[int, float]) -> tuple[list[tuple[float, float, str]], float]:
    """The phases moved from the wall clock onto the run's clock, and the alignment's spread.

    A step's metrics line is written right after it finished (``TrainStepFinished``), so
    wall = run clock + offset; the offset is the median over the steps seen."""
    finished = {r["step"]: r["t"] for r in recs if r["event"] == "TrainStepFinished"}
    offsets = [step_seen[k] - finished[k] for k in finished if k in step_seen]
    if not offsets:
        raise ValueError("no step's metrics line was seen; cannot align the run's clock to the wall clock")
    offset = statistics.median(offsets)
    return [(a - offset, b - offset, n) for a, b, n in phases_wall], max(offsets) - min(offsets)


def run(workload: str, phase_s: float, steps: int, keep: Path) -> dict:
    w = WORKLOADS[workload]
    over = [*BASE, *w.overrides, f"run.steps={steps}", "scheduler.policy=bidirl"]
    if w.long_prompts:
        over += [f"data.files={long_prompt_rows(keep / 'prompts.jsonl')}",
                 f"data.max_prompt_length={LONG_PROMPT_TOKENS + 64}"]
    run_dir = keep / "run"
    proc = subprocess.Popen([sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(run_dir), *over],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=open(keep / "stderr.log", "w"))
    cores = sorted(os.sched_getaffinity(0))
    everything = set(cores)
    metrics = run_dir / "metrics.jsonl"
    step_seen: dict[int, float] = {}  # step -> wall time its metrics line appeared
    phases_wall: list[tuple[float, float, str]] = []
    workers: list[int] = []
    last: dict[int, dict[int, float]] = {}
    name, started = None, None
    while proc.poll() is None:
        now = time.time()
        note_steps_seen(metrics, step_seen, now)
        if not workers:  # both device workers up: start switching
            ws = device_workers()
            if len(ws) >= 2:
                workers, last = ws[:len(cores)], {p: thread_cpu(p) for p in ws[:len(cores)]}
                name, started = "free", now
        elif now - started >= phase_s:
            phases_wall.append((started, now, name))
            name = "pinned" if name == "free" else "free"
            for k, pid in enumerate(workers):
                try:
                    cpu = thread_cpu(pid)
                except OSError:
                    continue
                busy = [t for t, s in cpu.items() if s - last[pid].get(t, 0.0) > BUSY_SHARE * (now - started)]
                last[pid] = cpu
                set_affinity(cpu, everything)
                if name == "pinned":
                    set_affinity(busy, {cores[k % len(cores)]})
            started = time.time()
        time.sleep(0.02)
    if started is not None:
        phases_wall.append((started, time.time(), name))
    if proc.returncode != 0:
        raise SystemExit(f"bidirl train failed ({proc.returncode}); see {keep / 'stderr.log'}")
    return analyse(run_dir, phases_wall, step_seen)


def analyse(run_dir: Path, phases_wall, step_seen: dict[int, float]) -> dict:
    recs = [json.loads(line) for line in (run_dir / "profile.jsonl").read_text().splitlines()]
    phases, spread = run_clock_phases(recs, phases_wall, step_seen)
    cap = max((r["features"][1] / r["features"][0] for r in recs
               if r["event"] == "StageMeasured" and r["stage"] == "decode"), default=0)
    decode = [r for r in recs if r["event"] == "StageMeasured" and r["stage"] == "decode"
              and r["features"][1] / r["features"][0] >= cap - 0.1]  # full batch only
    micro = [r for r in recs if r["event"] == "StageMeasured" and r["stage"] in ("train_micro", "aux_micro")]
    out = {"phases": len(phases), "alignment_spread_s": spread}
    for label, rows, value in (("decode_step_ms", decode, lambda r: 1e3 * r["seconds"] / r["features"][0]),
                               ("micro_batch_us_per_token", micro,
                                lambda r: 1e6 * r["seconds"] / max(1.0, r["features"][1]))):
        by = classify([(r["t"], r["seconds"]) for r in rows], phases)
        med = {k: statistics.median(value(rows[i]) for i in v) for k, v in by.items() if v}
        out[label] = {"median": med, "count": {k: len(v) for k, v in by.items()},
                      "pinned_over_free": med["pinned"] / med["free"] if {"pinned", "free"} <= set(med) else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="rollout-heavy", choices=list(WORKLOADS))
    ap.add_argument("--phase-s", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", default=None)
    ap.add_argument("--json", default=str(ROOT / "bench/results/pinning_within_run.json"))
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bidirl-pin-") as tmp:
        base = Path(args.keep or tmp)
        for i in range(args.runs):
            keep = base / f"{args.workload}-{i:02d}"
            keep.mkdir(parents=True, exist_ok=True)
            r = run(args.workload, args.phase_s, args.steps, keep)
            results.append(r)
            for label in ("decode_step_ms", "micro_batch_us_per_token"):
                m = r[label]
                print(f"run {i + 1}: {label:26} free {m['median'].get('free', float('nan')):8.3f} "
                      f"(n={m['count'].get('free', 0)})  pinned {m['median'].get('pinned', float('nan')):8.3f} "
                      f"(n={m['count'].get('pinned', 0)})  pinned/free {m['pinned_over_free'] or float('nan'):.3f}")
    Path(args.json).write_text(json.dumps({"workload": args.workload, "phase_s": args.phase_s,
                                           "steps": args.steps, "runs": results}, indent=1))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
