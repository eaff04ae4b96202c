"""How much slower a training micro-batch runs while the other device computes too.

The packing bound of ``bench/real_policies.py`` packs the device-seconds an ``async`` run
measured onto both devices, as if a second of work cost a second wherever it lands.  On a
machine whose "devices" are cores of one CPU, work moved onto the other core runs *beside*
work that used to run alone there, and both share the caches and the memory bus.  This
script measures that: two processes, each pinned to one core with one torch thread, run
forward + backward of the same micro-batch on the 4-layer / hidden-256 model the
workloads use.  Process A times every micro-batch; process B alternates between sleeping
and computing, in interleaved phases, so each A measurement is "alone" or "beside".

    flock /work/bench.lock .venv/bin/python bench/concurrent_compute.py --json bench/results/concurrent_compute.json

Prints and writes the median per phase and their ratio (beside / alone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _worker(core: int, model_dir: str, tokens: tuple[int, int], phase, stop, times, timing: bool) -> None:
    os.sched_setaffinity(0, {core})
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(core)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    batch, length = tokens
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    for _ in range(2):  # warm up allocator and kernels
        model(input_ids=ids, labels=ids).loss.backward()
    while not stop.is_set():
        if not timing and phase.value == 0:  # B sleeps in the "alone" phase
            time.sleep(0.005)
            continue
        p = phase.value
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        took = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        if timing and p == phase.value:  # a measurement that straddles a phase change is dropped
            times.append((p, took))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", type=int, default=12, help="alone/beside phases, interleaved")
    ap.add_argument("--phase-s", type=float, default=4.0, help="seconds per phase")
    ap.add_argument("--batch", type=int, default=16, help="sequences per micro-batch")
    ap.add_argument("--length", type=int, default=140, help="tokens per sequence")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores")
    from bidirl.models.tiny import build_tiny_model

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bidirl-cc-") as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny-L4-H256", layers=4, hidden=256))
        phase, stop = ctx.Value("i", 0), ctx.Event()
        times = ctx.Manager().list()
        procs = [ctx.Process(target=_worker, args=(c, model_dir, (a.batch, a.length), phase, stop, times, c == 1))
                 for c in (1, 0)]
        for p in procs:
            p.start()
        while not times:  # A is warm
            time.sleep(0.1)
        for k in range(2 * a.phases):
            phase.value = k % 2
            time.sleep(a.phase_s)
            print(f"[concurrent_compute] phase {k + 1}/{2 * a.phases}", file=sys.stderr)
        stop.set()
        for p in procs:
            p.join()
        got = list(times)
    alone = [t for p, t in got if p == 0]
    beside = [t for p, t in got if p == 1]
    out = {"batch": a.batch, "length": a.length, "phases": a.phases, "phase_s": a.phase_s,
           "alone_median_s": statistics.median(alone), "beside_median_s": statistics.median(beside),
           "n_alone": len(alone), "n_beside": len(beside),
           "slowdown_beside": statistics.median(beside) / statistics.median(alone),
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_avg": os.getloadavg()[0]}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
