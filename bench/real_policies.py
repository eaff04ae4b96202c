"""All seven policies for real: ``bidirl train`` on the tiny model, same config and seed.

Prints and writes (bench/results/real_policies.json) each policy's trained tokens/s
(ratio to ``async`` measured in the same session), wall time of the training loop, idle
ratios, borrow counts, median measured switch costs, admission decisions and the ledger
audit.  Start-up (Ray, vLLM engines, pre-warming) is excluded from tokens/s.

    .venv/bin/python bench/real_policies.py [--steps 30] [--policies async,bidirl] [-- key=value ...]
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

from bidirl.policy import policy_names

ROOT = Path(__file__).resolve().parents[1]
POLICIES = tuple(policy_names())
WORKLOAD = ["rollout.prompts_per_step=16", "rollout.group_size=8", "rollout.max_new_tokens=64",
            "data.task=copy", "trainer.micro_batch_size=8"]


def run_policy(policy: str, steps: int, extra: list[str], workdir: Path, index: int = 0) -> dict:
    run = workdir / f"{index:02d}-{policy}"
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="disabled")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(run), *WORKLOAD,
                          f"run.steps={steps}", f"scheduler.policy={policy}", *extra],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"policy": policy, "error": out.stderr[-1500:]}
    s = json.loads((run / "summary.json").read_text())
    sw: dict[str, list[float]] = {}
    for kind, secs in s["switches"]:
        sw.setdefault(kind, []).append(secs)
    return {"policy": policy, "tokens_per_s": s["throughput_tokens_per_s"], "loop_wall_s": s["wall_s"],
            "process_wall_s": round(time.perf_counter() - t0, 1), "idle_ratio": s["idle_ratio"],
            "borrows": s["borrows"], "audit_ok": s["audit_ok"], "max_staleness": s["audit"]["max_staleness"],
            "reward_last": s["reward_last"],
            "switch_median_s": {k: statistics.median(v) for k, v in sw.items()},
            "admission": {k: v for k, v in s["admission"].items() if k != "latest"},
            "reclaim_wait_max_s": max((w["wait_s"] for w in s["reclaim_waits"]), default=None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", default=str(ROOT / "bench/results/real_policies.json"))
    ap.add_argument("extra", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args()
    policies = args.policies.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="bidirl-bench-") as tmp:
        for i, pol in enumerate(policies, 1):
            print(f"[{i}/{len(policies)}] {pol} ...", file=sys.stderr, flush=True)
            results.append(run_policy(pol, args.steps, args.extra, Path(tmp), i))
    asyncs = [r["tokens_per_s"] for r in results if r["policy"] == "async" and "error" not in r]
    base = statistics.mean(asyncs) if asyncs else None  # repeated policies: ratio to the mean async
    print(f"{'policy':<22}{'tok/s':>9}{'vs async':>9}{'loop s':>8}{'idle roll':>10}{'idle train':>11}"
          f"{'borrows r/t':>12}{'audit':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['policy']:<22} FAILED: {r['error'][-200:]}")
            continue
        ratio = r["tokens_per_s"] / base if base else float("nan")
        b = r["borrows"]
        print(f"{r['policy']:<22}{r['tokens_per_s']:>9.0f}{ratio:>9.2f}{r['loop_wall_s']:>8.1f}"
              f"{r['idle_ratio'].get('rollout', 0):>10.2f}{r['idle_ratio'].get('train', 0):>11.2f}"
              f"{b.get('roll_on_train', 0):>6}/{b.get('train_on_roll', 0):<5}{str(r['audit_ok']):>7}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "steps": args.steps,
                                           "workload": WORKLOAD + args.extra, "results": results}, indent=1))
    return 0 if all("error" not in r and r["audit_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
