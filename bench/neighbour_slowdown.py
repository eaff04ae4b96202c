"""How much slower a device's work runs, by what the *other* core is doing.

``bench/concurrent_compute.py`` measured one pairing (a micro-batch beside a micro-batch).
A ``bidirl`` run packs other pairings too: on rollout-heavy the trainer's core decodes as a
borrowed replica, so the home replica decodes beside another decoding engine for most of
the run.  This script measures each pairing on its own.  Process A, pinned to core 0 with
one thread, runs the measured work and times every unit of it; process B, pinned to core
1, runs one of the neighbours in interleaved phases (``--no-pin``: both left to the kernel,
as the device workers were before ``cluster.pin_cores``):

* ``idle``: B sleeps (the work alone);
* ``spin``: a pure-Python loop (the core busy, almost no memory traffic);
* ``decode``: a second vLLM engine decoding the same requests (a borrowed replica);
* ``train``: forward + backward of a 16 x 140-token micro-batch (the trainer).

The measured work is ``decode`` (a vLLM engine kept at ``--seqs`` running requests on the
4-layer / hidden-256 model the workloads use, one engine step timed at a time, prompt and
response lengths cycling so that every phase sees the same mix) or ``train`` (the same
micro-batch as B's).  Both roles are the project's own (``RolloutRole``) or the HF model
the trainer trains.

    .venv/bin/python bench/neighbour_slowdown.py --work decode --json bench/results/neighbour_slowdown_decode.json

Prints and writes the median time per neighbour and its ratio to ``idle``.
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

NEIGHBOURS = ("idle", "spin", "decode", "train")
SETTLE_S = 0.3  # after a phase change: the neighbour's switch is not measured


def _setup(core: int | None) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def _engine(model_dir: str, seqs: int):
    from bidirl.runtime.rollout_role import RolloutRole

    return RolloutRole(model_dir, max_num_seqs=seqs, max_model_len=512)


def _decoder(role, seqs: int):
    """``role`` kept at ``seqs`` running requests; yields each engine step's seconds.

    The engine generates on its own thread: between two ``next`` calls it goes on with the
    requests it has (a neighbour leaving the decode phase aborts them)."""
    from bidirl.runtime.messages import ResponseRequest

    gid = 0

    def top_up() -> None:
        nonlocal gid
        while role.running < seqs:
            gid += 1
            prompt = [5 + gid % 7] * (16 + 8 * (gid % 5))
            role.submit([ResponseRequest(gid, 0, prompt, 64 + 32 * (gid % 4), temperature=1.0, seed=gid)])

    while True:
        top_up()
        out = role.poll(0.05)
        for batch, _ctx, took in out["measurements"]:
            if batch == seqs:  # steps at the full batch only: the same work in every phase
                yield took


def _trainer(model_dir: str):
    """Forward + backward of one micro-batch, again and again; yields each one's seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    ids = torch.randint(0, model.config.vocab_size, (16, 140), generator=torch.Generator().manual_seed(0))
    while True:
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        yield time.perf_counter() - t0


def _spinner():
    while True:
        x = 0
        for i in range(200_000):
            x += i * i
        yield 0.0


def _measured(model_dir: str, work: str, seqs: int, phase, changed, stop, times, ready, pin: bool) -> None:
    _setup(0 if pin else None)
    gen = _decoder(_engine(model_dir, seqs), seqs) if work == "decode" else _trainer(model_dir)
    for _ in range(20):  # warm up
        next(gen)
    ready.set()
    while not stop.is_set():
        p, since = phase.value, changed.value
        took = next(gen)
        if p == phase.value and time.monotonic() - since > SETTLE_S and changed.value == since:
            times.append((NEIGHBOURS[p], took))


def _neighbour(model_dir: str, seqs: int, phase, stop, ready, pin: bool) -> None:
    _setup(1 if pin else None)
    engine = _engine(model_dir, seqs)
    gens = {"spin": _spinner(), "decode": _decoder(engine, seqs), "train": _trainer(model_dir)}
    for g in gens.values():
        next(g)
    engine.abort_all()
    ready.set()
    last = "idle"
    while not stop.is_set():
        name = NEIGHBOURS[phase.value]
        if last == "decode" and name != "decode":  # its requests would decode on into this phase
            engine.abort_all()
        last = name
        if name == "idle":
            time.sleep(0.005)
        else:
            next(gens[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", choices=("decode", "train"), default="decode")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of every neighbour, order rotating")
    ap.add_argument("--phase-s", type=float, default=5.0, help="seconds per neighbour phase")
    ap.add_argument("--seqs", type=int, default=4, help="running requests per engine (decode)")
    ap.add_argument("--no-pin", action="store_true", help="leave both processes free to run on either core")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from bidirl.models.tiny import build_tiny_model

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bidirl-nb-") as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny-L4-H256", layers=4, hidden=256))
        phase, changed, stop = ctx.Value("i", 0), ctx.Value("d", time.monotonic()), ctx.Event()
        ready_a, ready_b = ctx.Event(), ctx.Event()
        times = ctx.Manager().list()
        pin = not a.no_pin
        procs = [ctx.Process(target=_neighbour, args=(model_dir, a.seqs, phase, stop, ready_b, pin), daemon=True),
                 ctx.Process(target=_measured, daemon=True,
                             args=(model_dir, a.work, a.seqs, phase, changed, stop, times, ready_a, pin))]
        for p in procs:
            p.start()
        for ev in (ready_a, ready_b):
            if not ev.wait(300):
                raise SystemExit("a process did not start within 300 s")
        for r in range(a.rounds):
            order = NEIGHBOURS[r % len(NEIGHBOURS):] + NEIGHBOURS[:r % len(NEIGHBOURS)]
            for name in order:
                phase.value = NEIGHBOURS.index(name)
                changed.value = time.monotonic()
                time.sleep(a.phase_s)
            print(f"[neighbour_slowdown] round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
        stop.set()
        got = list(times)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    med = {n: statistics.median([t for m, t in got if m == n]) for n in NEIGHBOURS
           if any(m == n for m, _ in got)}
    out = {"work": a.work, "pinned": not a.no_pin, "seqs": a.seqs if a.work == "decode" else None, "rounds": a.rounds,
           "phase_s": a.phase_s, "median_s": med,
           "count": {n: sum(m == n for m, _ in got) for n in NEIGHBOURS},
           "slowdown": {n: med[n] / med["idle"] for n in med},
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_avg": os.getloadavg()[0]}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"{a.work}: median ms per unit by neighbour, and over idle")
    for n in med:
        print(f"  {n:7s} {med[n] * 1e3:8.2f} ms  x{out['slowdown'][n]:.3f}  (n={out['count'][n]})")
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
