"""Weight sync per transport, against this machine's memory bandwidth; LoRA's delta against a full sync.

BENCHMARKS.md, "Weight sync":

    PYTHONPATH=src .venv/bin/python -m bench.weight_sync --rounds 5   # -> bench/results/weight_sync.json

Two Ray actors (``runtime/weight_sync.SyncEndpoint``: a sender holding the trainer's tensors
and a receiver, no vLLM), one process each, as the primary trainer and one replica.  Three
Qwen3-shaped models of named fp32 tensors (embedding tied, q/k norms; a small vocabulary, no
hub), each with rank-16 LoRA adapters on q, k, v, o, gate, up and down (A: r x in, B: out x r).
Each round, in a shuffled order and for every size:

- ``object_store``: the sender copies its tensors into one numpy dict (``WeightLink.pack``),
  Ray's store carries it, the receiver ``ray.get``\\ s it (zero copy on one node);
- ``collective``: one gloo broadcast per 64 MiB bucket over a ``WeightLink`` group;
- ``shm``: the sender copies its tensors into a ``/dev/shm`` segment (``runtime/weight_shm.py``),
  and once that returned the receiver maps it (once per layout) and holds zero-copy views of it,
  the runtime's order (the driver issues the read when the write's result is back);
- ``collective_delta_lora`` / ``object_store_delta_lora`` / ``shm_delta_lora``: an optimizer step
  on the adapters alone, then a delta sync (only the changed tensors cross);
- ``memcpy``: a numpy copy of the model's bytes in the driver, the physical one-node limit.

Every figure is the median over rounds of bytes / seconds, timed by the driver from the
issue of the calls to the receiver holding the weights; ratios are taken within a round.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time

import numpy as np

from bench.measure import RESULTS, code_version, write_json

SIZES = {  # name: (hidden, layers, intermediate, heads, kv_heads, head_dim, vocab)
    "qwen3-45m": (512, 8, 1536, 8, 4, 64, 32000),
    "qwen3-120m": (1024, 7, 3072, 16, 8, 64, 32000),
    "qwen3-310m": (1024, 22, 3072, 16, 8, 64, 32000),
}
LORA_RANK = 16
BASES = ("object_store", "collective", "shm")
SHORT = {"object_store": "store", "collective": "coll", "shm": "shm"}
TRANSPORTS = (*BASES, *(f"{b}_delta_lora" for b in BASES))


def qwen3_shapes(hidden, layers, inter, heads, kv, hd, vocab) -> tuple[dict, list[str]]:
    """(every tensor's shape by its HF name, the LoRA adapters' names)."""
    s = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    lora = []
    for i in range(layers):
        p = f"model.layers.{i}."
        mods = {"self_attn.q_proj": (heads * hd, hidden), "self_attn.k_proj": (kv * hd, hidden),
                "self_attn.v_proj": (kv * hd, hidden), "self_attn.o_proj": (hidden, heads * hd),
                "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
        for m, (out, inp) in mods.items():
            s[f"{p}{m}.weight"] = (out, inp)
            s[f"{p}{m}.lora_A.weight"] = (LORA_RANK, inp)
            s[f"{p}{m}.lora_B.weight"] = (out, LORA_RANK)
            lora += [f"{p}{m}.lora_A.weight", f"{p}{m}.lora_B.weight"]
        for n in ("input_layernorm", "post_attention_layernorm"):
            s[f"{p}{n}.weight"] = (hidden,)
        s[f"{p}self_attn.q_norm.weight"] = (hd,)
        s[f"{p}self_attn.k_norm.weight"] = (hd,)
    return s, lora


def memcpy_rate(nbytes: int) -> float:
    """Bytes copied per second by one numpy copy of ``nbytes`` (read once, written once)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return src.nbytes / (time.perf_counter() - t0)


def one_sync(ray, sender, receiver, transport: str, version: int, lora: list[str]) -> tuple[float, int]:
    """(seconds from issue to the receiver holding the weights, bytes that crossed)."""
    delta = transport.endswith("_delta_lora")
    if delta:
        ray.get(sender.touch.remote(lora))
    t0 = time.perf_counter()
    if transport.startswith("object_store"):
        _, n = ray.get(receiver.load.remote([sender.pack.remote(version, delta)]))
    elif transport.startswith("shm"):
        ticket, _ = ray.get(sender.write.remote(version, delta))
        _, n = ray.get(receiver.read.remote(ticket))
    else:
        rec = sender.send.remote(version, delta)
        _, n = ray.get(receiver.recv.remote())
        ray.get(rec)
    return time.perf_counter() - t0, n


def bench_size(ray, endpoint, name: str, rounds: int, port: int) -> dict:
    shapes, lora = qwen3_shapes(*SIZES[name])
    sender, receiver = endpoint.remote(), endpoint.remote()
    nbytes = ray.get(sender.make.remote(shapes))
    ray.get([sender.join.remote(0, "127.0.0.1", port, 0, 2), receiver.join.remote(0, "127.0.0.1", port, 1, 2)])
    version = 0
    for t in TRANSPORTS:  # warm: first buckets, the delta trackers' first (whole) digests
        version += 1
        one_sync(ray, sender, receiver, t, version, lora)
    rows: dict[str, list] = {t: [] for t in (*TRANSPORTS, "memcpy")}
    for _ in range(rounds):
        order = list(rows)
        random.shuffle(order)
        for t in order:
            if t == "memcpy":
                rows[t].append((nbytes / memcpy_rate(nbytes), nbytes))
                continue
            version += 1
            rows[t].append(one_sync(ray, sender, receiver, t, version, lora))
    ray.get([receiver.close_shm.remote(), sender.close_shm.remote()])  # the segment is unlinked
    ray.kill(sender)
    ray.kill(receiver)
    params = sum(int(np.prod(s)) for k, s in shapes.items() if "lora_" not in k)
    out = {"params": params, "bytes": nbytes, "lora_bytes": sum(4 * int(np.prod(shapes[k])) for k in lora)}
    for t, xs in rows.items():
        secs = [s for s, _ in xs]
        out[t] = {"median_s": statistics.median(secs), "bytes_moved": xs[0][1],
                  "bytes_per_s": statistics.median(n / s for s, n in xs), "seconds": secs}
    mem = [n / s for s, n in rows["memcpy"]]
    for base in BASES:
        out[f"{base}_over_memcpy"] = statistics.median(
            (n / s) / m for (s, n), m in zip(rows[base], mem, strict=True))
    for base in BASES:
        out[f"lora_speedup_{base}"] = statistics.median(
            f / d for (f, _), (d, _) in zip(rows[base], rows[f"{base}_delta_lora"], strict=True))
    return out


def per_byte_fit(results: dict) -> dict:
    """``seconds = a + b * GB`` per transport, least squares over sizes and deltas: the
    weight-sync model's constants on this machine."""
    fits = {}
    for base in BASES:
        xs, ys = [], []
        for r in results.values():
            for t in (base, f"{base}_delta_lora"):
                xs += [r[t]["bytes_moved"] / 1e9] * len(r[t]["seconds"])
                ys += r[t]["seconds"]
        b, a = np.polyfit(xs, ys, 1)
        fits[base] = {"latency_s": float(a), "s_per_gb": float(b), "gb_per_s": float(1 / b) if b > 0 else None}
    return fits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--out", default=str(RESULTS / "weight_sync.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from bidirl.runtime.cluster import ray_session
    from bidirl.runtime.placement import free_port
    from bidirl.runtime.weight_shm import ShmEndpoint

    t_start = time.perf_counter()
    results = {}
    with ray_session(num_cpus=3) as ray:
        endpoint = ray.remote(num_cpus=1)(ShmEndpoint)
        for name in args.sizes.split(","):
            results[name] = bench_size(ray, endpoint, name, args.rounds, free_port())
            print(f"[weight_sync] {name} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    fits = per_byte_fit(results)
    print(f"\n{'model':<11}{'params':>8}{'memcpy GB/s':>12}" + "".join(f"{t:>18}" for t in BASES)
          + f"{'coll/memcpy':>12}{'shm/memcpy':>11}{'LoRA MB':>9}"
          + "".join(f"LoRA x ({SHORT[b]})".rjust(16) for b in BASES))
    for name, r in results.items():
        print(f"{name:<11}{r['params'] / 1e6:>7.0f}M{r['memcpy']['bytes_per_s'] / 1e9:>12.2f}"
              + "".join(f"{r[t]['bytes_per_s'] / 1e9:.2f} GB/s {r[t]['median_s']:.3f}s".rjust(18) for t in BASES)
              + f"{r['collective_over_memcpy']:>12.0%}{r['shm_over_memcpy']:>11.0%}{r['lora_bytes'] / 1e6:>9.1f}"
              + "".join(f"{r[f'lora_speedup_{b}']:>15.1f}x" for b in BASES))
    for t, f in fits.items():
        print(f"per-byte fit {t}: {f['latency_s'] * 1e3:.1f} ms + {f['s_per_gb']:.3f} s/GB")
    data = {"commit": code_version(), "machine": platform.node(), "cpus": os.cpu_count(), "rounds": args.rounds,
            "lora_rank": LORA_RANK, "results": results, "per_byte_fit": fits,
            "wall_s": time.perf_counter() - t_start}
    print(f"-> {write_json(args.out, data)} ({data['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
