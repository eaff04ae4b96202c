"""Where a short ``bidirl train`` run's time goes, for one or more git revisions, interleaved.

BENCHMARKS.md, "Start-up". The latest comparison (the start-up changes of 2026-12-03):

    .venv/bin/python -m bench.startup --revs 06a3a12 b7e9207 --rounds 3 --json bench/results/startup_1203.json
    .venv/bin/python -m bench.startup --revs 06a3a12 b7e9207 --rounds 3 --policy async \
        --json bench/results/startup_async_1203.json cluster.prewarm=false

The same short run from each revision in turn (round 1: A, B, ...; round 2: A, B, ...), so the
machine's noise falls on all alike; each revision is a detached ``git worktree`` run with this
interpreter and ``PYTHONPATH`` at its ``src``. Prints the median seconds to each milestone
(prompts measured, workers up, first and last step, exit) and, per round, each total over the
first revision's; writes them and every run's stamps to ``--json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.measure import ROOT, run_env, write_json

SHORT_RUN = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
             "trainer.micro_batch_size=8", "run.steps=3", "run.plot=false", "run.tensorboard=false"]
"""The tests' small shape (``tests/runtime/runtime_cli_helpers.SMALL``), three steps."""

MILESTONES = (
    ("prompts", "[bidirl] prompts:"),
    ("workers_up", "device workers up"),
    ("first_step", "step 1/"),
    ("last_step", None),  # the last line starting "step "
)


def milestones(lines: list[tuple[float, str]], exit_s: float) -> dict[str, float | None]:
    """Seconds to each milestone, from ``(seconds, line)`` pairs in the order printed."""
    out: dict[str, float | None] = {}
    for name, marker in MILESTONES:
        if marker is None:
            steps = [t for t, ln in lines if ln.startswith("step ")]
            out[name] = steps[-1] if steps else None
        else:
            out[name] = next((t for t, ln in lines if marker in ln), None)
    out["exit"] = exit_s
    return out


def run_once(src: Path, run_dir: Path, overrides: list[str], timeout: float = 600) -> dict:
    """One short run from ``src``: its stamped lines, milestones and exit status."""
    env = run_env(PYTHONPATH=str(src))
    cmd = [sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(run_dir), *SHORT_RUN, *overrides]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=src.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    lock = threading.Lock()

    def pump(stream) -> None:
        for ln in stream:
            with lock:
                lines.append((round(time.perf_counter() - t0, 3), ln.rstrip("\n")))

    pumps = [threading.Thread(target=pump, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    for p in pumps:
        p.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    exit_s = round(time.perf_counter() - t0, 3)
    for p in pumps:
        p.join(timeout=10)
    lines.sort(key=lambda x: x[0])
    return {"returncode": proc.returncode, "milestones": milestones(lines, exit_s),
            "tail": [ln for _, ln in lines[-5:]]}


def checkout(rev: str, where: Path) -> tuple[str, Path]:
    """(commit, its ``src``): ``rev`` checked out, detached, under ``where``."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    path = where / sha[:12]
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), sha], cwd=ROOT, check=True)
    return sha, path / "src"


def summarise(revs: list[str], runs: list[dict]) -> dict:
    """Per revision, the median seconds to each milestone; per round, each total over the first's."""
    by_rev: dict[str, dict] = {}
    for rev in revs:
        mine = [r for r in runs if r["rev"] == rev and r["returncode"] == 0]
        by_rev[rev] = {name: (statistics.median(v) if (v := [r["milestones"][name] for r in mine
                                                              if r["milestones"][name] is not None]) else None)
                       for name, _ in (*MILESTONES, ("exit", None))}
        by_rev[rev]["runs_ok"] = len(mine)
    rounds = sorted({r["round"] for r in runs})
    ratios = {rev: [] for rev in revs[1:]}
    for k in rounds:
        total = {r["rev"]: r["milestones"]["exit"] for r in runs if r["round"] == k and r["returncode"] == 0}
        for rev in revs[1:]:
            if revs[0] in total and rev in total:
                ratios[rev].append(round(total[rev] / total[revs[0]], 3))
    return {"median_s": by_rev, "exit_over_first_per_round": ratios,
            "median_exit_over_first": {rev: statistics.median(v) if v else None for rev, v in ratios.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--revs", nargs="+", default=["HEAD"], help="git revisions to compare (default: HEAD)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs every revision once (default 3)")
    ap.add_argument("--policy", default="bidirl", help="scheduler.policy of the short run (default bidirl)")
    ap.add_argument("--json", required=True, help="where to write the figures")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for the short run")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: must be at least 1, got {args.rounds}")
    work = Path(tempfile.mkdtemp(prefix="bidirl-startup-"))
    trees = work / "trees"
    trees.mkdir()
    runs: list[dict] = []
    try:
        srcs = {}
        for rev in args.revs:
            try:
                srcs[rev] = checkout(rev, trees)
            except subprocess.CalledProcessError:
                ap.error(f"--revs: {rev!r} is not a commit of this repository")
        overrides = [f"scheduler.policy={args.policy}", *args.overrides]
        for k in range(args.rounds):
            for rev in args.revs:
                sha, src = srcs[rev]
                result = run_once(src, work / f"run-{k}-{sha[:12]}", overrides)
                shutil.rmtree(work / f"run-{k}-{sha[:12]}", ignore_errors=True)
                runs.append({"round": k, "rev": rev, "commit": sha, **result})
                m = result["milestones"]
                status = "" if result["returncode"] == 0 else f"  FAILED ({result['returncode']}): {result['tail']}"
                print(f"round {k + 1}/{args.rounds} {rev:>12}: " + "  ".join(
                    f"{n} {v:.1f}" for n, v in m.items() if v is not None) + status, flush=True)
    finally:
        for rev in args.revs:
            if rev in srcs:
                subprocess.run(["git", "worktree", "remove", "--force", str(srcs[rev][1].parent)], cwd=ROOT,
                               capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(args.revs, runs)
    print("\nmedian seconds to each milestone:")
    for rev, row in summary["median_s"].items():
        print(f"  {rev:>12}: " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in row.items()))
    for rev, ratios in summary["exit_over_first_per_round"].items():
        print(f"  {rev} / {args.revs[0]} (whole run, per round): {ratios}; median "
              f"{summary['median_exit_over_first'][rev]}")
    out = {"revs": {rev: srcs[rev][0] for rev in args.revs}, "rounds": args.rounds, "policy": args.policy,
           "overrides": args.overrides, "short_run": SHORT_RUN, **summary, "runs": runs}
    write_json(args.json, out)
    print(f"written to {args.json}")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
