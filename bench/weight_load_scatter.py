"""How much one replica's weight load scatters by itself: the weight-sync model's floor.

The weight-sync stage model predicts one number per run (a sync loads the same weights every
time), so its median relative error can be no better than the loads' own scatter about the
best constant.  This script measures that scatter on one vLLM engine outside Ray and a
driver: the project's ``RolloutRole`` on the 4-layer / hidden-256 model the workloads use,
kept at ``--seqs`` live requests (each load restarts them, as in a run), loading the same
weights ``--loads`` times.  Loads alternate between Python's garbage collector on (as in a
run) and off, and each load records the collections that ran inside it and the minor page
faults it took, so the two usual suspects for a Python-heavy call's jitter are measured
rather than guessed.  Each load also records its thread's CPU time (a load slowed by other
threads or processes taking the core has CPU time well under its wall time; one whose work
itself ran slower, at the same CPU share, has not), and the whole measurement records the
share of CPU time the hypervisor stole (``steal``, from ``/proc/stat``: a virtual machine's
other tenants):

    .venv/bin/python bench/weight_load_scatter.py --json bench/results/weight_load_scatter.json

Prints and writes, per mode: the median load, the scatter (median of ``|load / median - 1|``),
the best constant's median relative error (the floor a one-number model meets), the range,
and the garbage collection time and page faults per load.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from real_policies import cpu_jiffies, steal_fraction  # bench/: the same reading as the series


def floor_error(xs: list[float]) -> float:
    """The smallest median relative error (``|prediction - load| / load``, the stage models'
    measure) that any constant prediction gets on ``xs``: searched over the samples and a fine
    grid between the smallest and the largest."""
    lo, hi = min(xs), max(xs)
    grid = [lo + (hi - lo) * k / 2000 for k in range(2001)]
    return min(statistics.median(abs(c - x) / x for x in xs) for c in [*xs, *grid])


class GcClock:
    """Collections and their seconds, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t = 0, 0.0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", type=int, default=60, help="weight loads, alternating gc on / off")
    ap.add_argument("--seqs", type=int, default=4, help="live requests the engine keeps (restarted by each load)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.loads < 4 or a.seqs < 0:
        raise SystemExit("--loads must be >= 4 and --seqs >= 0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from safetensors.numpy import load_file

    from bidirl.models.tiny import build_tiny_model
    from bidirl.runtime.messages import ResponseRequest
    from bidirl.runtime.rollout_role import RolloutRole

    with tempfile.TemporaryDirectory(prefix="bidirl-wl-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny-L4-H256", layers=4, hidden=256)
        role = RolloutRole(str(model_dir), max_num_seqs=max(1, a.seqs), max_model_len=512)
        weights = load_file(str(Path(model_dir) / "model.safetensors"))
        clock = GcClock()
        gid = 0
        loads: dict[str, list[dict]] = {"gc on": [], "gc off": []}
        jiffies0 = cpu_jiffies()
        try:
            for i in range(a.loads):
                while role.running < a.seqs:
                    gid += 1
                    role.submit([ResponseRequest(gid, 0, [5 + gid % 7] * 40, 200, seed=gid)])
                role.poll(0.05)
                time.sleep(0.1)  # the engine decodes in between, as between two syncs of a run
                mode = "gc on" if i % 2 == 0 else "gc off"
                if mode == "gc off":
                    gc.disable()
                n0, s0 = clock.count, clock.seconds
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                c0 = time.thread_time()
                seconds = role.update_weights(weights, i + 1)
                cpu_s = time.thread_time() - c0
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                gc.enable()
                loads[mode].append({"s": seconds, "gc_n": clock.count - n0, "gc_s": clock.seconds - s0,
                                    "faults": faults, "cpu_s": cpu_s})
                if (i + 1) % 10 == 0:
                    print(f"[weight_load_scatter] {i + 1}/{a.loads} loads", file=sys.stderr, flush=True)
        finally:
            steal = steal_fraction(jiffies0, cpu_jiffies())
            role.release()
    out = {"steal_fraction": steal, "loads": a.loads, "seqs": a.seqs, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_avg": os.getloadavg()[0], "modes": {}}
    print(f"weight load, {a.seqs} live requests: ms, scatter = median |load/median - 1|")
    for mode, rows in loads.items():
        xs = [r["s"] for r in rows]
        med = statistics.median(xs)
        cpu_med = statistics.median(r["cpu_s"] for r in rows)
        m = {"n": len(xs), "median_ms": med * 1e3, "scatter": statistics.median(abs(x / med - 1) for x in xs),
             "floor_error": floor_error(xs), "min_ms": min(xs) * 1e3, "max_ms": max(xs) * 1e3,
             "gc_ms_per_load": 1e3 * statistics.mean(r["gc_s"] for r in rows),
             "gc_per_load": statistics.mean(r["gc_n"] for r in rows),
             "faults_per_load": statistics.median(r["faults"] for r in rows),
             # the load's own thread: its CPU time's scatter, and its share of the wall time
             "cpu_scatter": statistics.median(abs(r["cpu_s"] / cpu_med - 1) for r in rows),
             "cpu_share": statistics.median(min(1.0, r["cpu_s"] / r["s"]) for r in rows if r["s"] > 0),
             "ms": [x * 1e3 for x in xs], "cpu_ms": [r["cpu_s"] * 1e3 for r in rows]}
        out["modes"][mode] = m
        print(f"  {mode:6s} median {m['median_ms']:6.1f}  scatter {m['scatter']:.3f}  floor {m['floor_error']:.3f}  "
              f"range {m['min_ms']:.1f}-{m['max_ms']:.1f}  gc {m['gc_ms_per_load']:.2f} ms/load  "
              f"faults {m['faults_per_load']:.0f}/load  cpu share {m['cpu_share']:.2f}  "
              f"cpu scatter {m['cpu_scatter']:.3f}  (n={m['n']})")
    print(f"  steal over the measurement: {'-' if steal is None else format(steal, '.3f')}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
