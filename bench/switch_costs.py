"""Measure the hot-switch costs C_in, C_out and C_grad per direction on this machine.

Uses the real device workers (Ray actors) and roles, exactly as ``bidirl train`` does:

* Rollouter-on-TrainPool: a worker hosting the primary trainer brings up a vLLM rollout
  replica with the trainer's weights (C_in), serves requests, and is reclaimed with
  requests in flight (C_out: abort + park).
* Trainer-on-RollPool: a worker hosting a rollout replica brings up an auxiliary trainer
  with the primary's weights (C_in), computes a gradient chunk, ships it to the primary
  (C_grad: fetched and timed by the primary), and releases it (C_out).

The first bring-up of each role is *cold* (engine start); later ones are *hot* (a parked
role is woken and given new weights).  Run on a GPU node with ``--device cuda
--model-path DIR`` (e.g. a randomly initialised real-architecture model from
``scripts/gpu_smoke.sh``).

    .venv/bin/python bench/switch_costs.py [--rounds 5] [--json bench/results/switch_costs.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _samples(n_mb: int, per_mb: int, resp: int):
    return [[{"prompt_ids": [1, 5, 6, 7], "response_ids": [8 + (i + j) % 50 for j in range(resp)],
              "behaviour_logprobs": [-1.0] * resp, "advantage": 0.5 - (i % 2)} for i in range(per_mb)]
            for _ in range(n_mb)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="hot switch rounds per direction")
    ap.add_argument("--model-path", help="HF model dir (default: bidirl's tiny model)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", default=str(ROOT / "bench/results/switch_costs.json"))
    args = ap.parse_args()

    from bidirl.engines.trainer_config import TrainerConfig, trainer_wire
    from bidirl.models.tiny import build_tiny_model
    from bidirl.runtime.cluster import ray_session
    from bidirl.runtime.worker import worker_class

    model = args.model_path or str(build_tiny_model(ROOT / ".bidirl" / "models" / "tiny"))
    gpu = args.device == "cuda"
    roll_kw = dict(model_dir=model, max_model_len=256, kv_cache_bytes=(2 << 30) if gpu else (128 << 20))
    out: dict = {"model": model, "device": args.device, "machine": platform.node(), "rounds": args.rounds,
                 "date": time.strftime("%Y-%m-%d %H:%M")}
    with ray_session(num_cpus=2) as ray:
        cls = worker_class(num_cpus=1, num_gpus=0.5 if gpu else 0)
        trainer_dev, rollout_dev = cls.remote(1, "train"), cls.remote(0, "rollout")
        wire = trainer_wire(TrainerConfig(lr=1e-4), device="cpu", seed=0)
        ray.get([trainer_dev.host.remote("train", model_dir=model, config=wire),
                 rollout_dev.host.remote("rollout", **roll_kw)])
        print("[bench] workers up; measuring Rollouter-on-TrainPool", file=sys.stderr)
        rot = {"c_in_cold_s": None, "c_in_s": [], "c_out_s": [], "aborted_requests": []}
        from bidirl.runtime.messages import ResponseRequest

        for r in range(args.rounds + 1):
            w = trainer_dev.call.remote("train", "weights")
            c_in = ray.get(trainer_dev.host.remote("rollout", **roll_kw, weights=[w], version=r))
            reqs = [ResponseRequest(g, i, [1, 5, 6, 7], 64, seed=g * 8 + i) for g in range(4) for i in range(8)]
            ray.get(trainer_dev.call.remote("rollout", "submit", reqs))
            ray.get(trainer_dev.call.remote("rollout", "run", 0.0))
            c_out, partials = ray.get(trainer_dev.release.remote("rollout"))
            if r == 0:
                rot["c_in_cold_s"] = c_in
            else:
                rot["c_in_s"].append(c_in)
                rot["c_out_s"].append(c_out)
                rot["aborted_requests"].append(len(partials))
        print("[bench] measuring Trainer-on-RollPool", file=sys.stderr)
        tor = {"c_in_cold_s": None, "c_in_s": [], "c_out_s": [], "c_grad_s": [], "grad_mb": None}
        mbs = _samples(2, 8, 32)
        total = sum(len(s["response_ids"]) for mb in mbs for s in mb)
        for r in range(args.rounds + 1):
            w = trainer_dev.call.remote("train", "weights")
            version = ray.get(trainer_dev.call.remote("train", "get_version"))
            c_in = ray.get(rollout_dev.host.remote("aux_train", model_dir=model, config=wire,
                                                   weights=[w], version=version))
            own = trainer_dev.call.options(num_returns=2).remote("train", "compute_chunk_ref", mbs[:1], total)[0]
            aux = rollout_dev.call.options(num_returns=2).remote("aux_train", "compute_chunk_ref", mbs[1:], total)[0]
            ray.wait([own, aux], num_returns=2)
            _, c_grad = ray.get(trainer_dev.call.remote("train", "apply_refs", [[own, aux]], 1))
            c_out, _ = ray.get(rollout_dev.release.remote("aux_train"))
            if r == 0:
                tor["c_in_cold_s"] = c_in
                chunk = ray.get(aux)
                tor["grad_mb"] = sum(g.nbytes for d in chunk.grads for g in d.values()) / 2**20
            else:
                tor["c_in_s"].append(c_in)
                tor["c_out_s"].append(c_out)
                tor["c_grad_s"].extend(c_grad)
    for name, d in (("roll_on_train", rot), ("train_on_roll", tor)):
        for k in [k for k in d if k.endswith("_s") and isinstance(d[k], list)]:
            d[k.replace("_s", "_median_s")] = statistics.median(d[k]) if d[k] else None
        out[name] = d
    head = f"{'direction':<15} {'C_in cold':>10} {'C_in hot':>10} {'C_out':>10} {'C_grad':>10}"
    print(f"{head}   (median of {args.rounds})")
    for name in ("roll_on_train", "train_on_roll"):
        d = out[name]
        grad = d.get("c_grad_median_s")
        print(f"{name:<15} {d['c_in_cold_s']:>9.3f}s {d['c_in_median_s']:>9.4f}s {d['c_out_median_s']:>9.4f}s "
              f"{(f'{grad:.4f}s' if grad is not None else '-'):>10}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"[bench] wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
