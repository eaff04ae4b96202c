"""The hot-switch costs C_in, C_out and C_grad per direction, on one node or across two.

BENCHMARKS.md, "Switch costs":

    .venv/bin/python -m bench.switch_costs --rounds 5             # -> bench/results/switch_costs.json
    sudo .venv/bin/python -m bench.switch_costs --nodes 2 --rounds 5   # -> bench/results/switch_costs_2nodes.json
    .venv/bin/python -m bench.switch_costs --device cuda --model-path DIR   # a GPU node (scripts/gpu_smoke.sh)

With the real device workers (Ray actors) and roles, exactly as ``bidirl train`` uses them.
``--nodes 1``: Rollouter-on-TrainPool, a worker hosting the primary trainer brings up a vLLM
replica with the trainer's weights (C_in), serves requests and is reclaimed with requests in
flight (C_out: abort + park); Trainer-on-RollPool, a worker hosting a replica brings up an
auxiliary trainer with the primary's weights (C_in), computes a gradient chunk the primary
fetches (C_grad, timed by the primary) and releases it (C_out). The first bring-up of each
role is cold (engine start), later ones hot (a parked role woken with new weights).
``--nodes 2`` (root only): a 2-node Ray cluster on this machine from network namespaces
(``runtime/netns_cluster.py``, a veth pair); the primary trainer on node 0, a *near* worker
(node 0) and a *far* one (node 1) each bring up a replica (C_in), take a weight update as a
home replica does (``weight_sync``), then an auxiliary trainer (C_in) whose chunk the primary
fetches (C_grad). The link is a veth pair: Ray's object transfer and two TCP stacks, not a
datacenter network.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from bench.measure import RESULTS, ROOT, write_json


def _samples(n_mb: int, per_mb: int, resp: int):
    return [[{"prompt_ids": [1, 5, 6, 7], "response_ids": [8 + (i + j) % 50 for j in range(resp)],
              "behaviour_logprobs": [-1.0] * resp, "advantage": 0.5 - (i % 2)} for i in range(per_mb)]
            for _ in range(n_mb)]


def aux_round(ray, trainer, worker, model: str, wire, mbs: list, total):
    """One Trainer-on-RollPool switch on ``worker``: bring up an auxiliary trainer with the
    primary's weights, compute a chunk beside the primary's, let the primary fetch and apply
    it, release (parked). Returns (C_in, [C_grad], C_out, the chunk's ref)."""
    w = trainer.call.remote("train", "weights")
    version = ray.get(trainer.call.remote("train", "get_version"))
    c_in = ray.get(worker.host.remote("aux_train", model_dir=model, config=wire, weights=[w], version=version))
    own = trainer.call.options(num_returns=2).remote("train", "compute_chunk_ref", mbs[:1], total)[0]
    aux = worker.call.options(num_returns=2).remote("aux_train", "compute_chunk_ref", mbs[1:], total)[0]
    ray.wait([own, aux], num_returns=2, fetch_local=False)  # the primary pulls the chunk itself
    _, c_grad = ray.get(trainer.call.remote("train", "apply_refs", [[own, aux]], 1))
    c_out, _ = ray.get(worker.release.remote("aux_train"))
    return c_in, c_grad, c_out, aux


def tiny_model() -> str:
    from bidirl.models.tiny import build_tiny_model

    return str(build_tiny_model(ROOT / ".bidirl" / "models" / "tiny"))


def one_node(model: str, device: str, rounds: int) -> dict:
    """Both directions on this machine's two devices: cold, then ``rounds`` hot switches each."""
    from bidirl.algo.aggregation import StepTotals
    from bidirl.engines.trainer_config import TrainerConfig, trainer_wire
    from bidirl.runtime.cluster import ray_session
    from bidirl.runtime.messages import ResponseRequest
    from bidirl.runtime.worker import worker_class

    gpu = device == "cuda"
    roll_kw = dict(model_dir=model, max_model_len=256, kv_cache_bytes=(2 << 30) if gpu else (128 << 20))
    with ray_session(num_cpus=2) as ray:
        cls = worker_class(num_cpus=1, num_gpus=0.5 if gpu else 0)
        trainer_dev, rollout_dev = cls.remote(1, "train"), cls.remote(0, "rollout")
        wire = trainer_wire(TrainerConfig(lr=1e-4), device="cpu", seed=0)
        ray.get([trainer_dev.host.remote("train", model_dir=model, config=wire),
                 rollout_dev.host.remote("rollout", **roll_kw)])
        print("[bench] workers up; measuring Rollouter-on-TrainPool", file=sys.stderr)
        rot = {"c_in_cold_s": None, "c_in_s": [], "c_out_s": [], "aborted_requests": []}
        for r in range(rounds + 1):
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
        total = StepTotals.of(len(s["response_ids"]) for mb in mbs for s in mb)
        for r in range(rounds + 1):
            c_in, c_grad, c_out, aux = aux_round(ray, trainer_dev, rollout_dev, model, wire, mbs, total)
            if r == 0:
                tor["c_in_cold_s"] = c_in
                chunk = ray.get(aux)
                tor["grad_mb"] = sum(g.nbytes for d in chunk.grads for g in d.values()) / 2**20
            else:
                tor["c_in_s"].append(c_in)
                tor["c_out_s"].append(c_out)
                tor["c_grad_s"].extend(c_grad)
    out = {}
    for name, d in (("roll_on_train", rot), ("train_on_roll", tor)):
        for k in [k for k in d if k.endswith("_s") and isinstance(d[k], list)]:
            d[k.replace("_s", "_median_s")] = statistics.median(d[k]) if d[k] else None
        out[name] = d
    return out


def across_nodes(address: str, model: str, rounds: int) -> dict:
    """Inside the head's namespace (``--inner``): a near and a far worker take turns."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from bidirl.algo.aggregation import StepTotals
    from bidirl.engines.trainer_config import TrainerConfig, trainer_wire
    from bidirl.runtime.cluster import ray_session
    from bidirl.runtime.placement import DEVICE_RESOURCE
    from bidirl.runtime.worker import worker_class

    roll_kw = dict(model_dir=model, max_model_len=256, kv_cache_bytes=128 << 20)
    wire = trainer_wire(TrainerConfig(lr=1e-4), device="cpu", seed=0)
    out: dict = {}
    with ray_session(address):
        nodes = sorted((n for n in ray.nodes() if n["Alive"]),
                       key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"]))
        cls = worker_class(num_cpus=1)

        def on(k: int, device: int, pool: str):
            return cls.options(resources={DEVICE_RESOURCE: 1}, scheduling_strategy=NodeAffinitySchedulingStrategy(
                nodes[k]["NodeID"], soft=False)).remote(device, pool)

        trainer, near, far = on(0, 0, "train"), on(0, 1, "train"), on(1, 2, "train")
        ray.get(trainer.host.remote("train", model_dir=model, config=wire))
        mbs = _samples(2, 8, 32)
        total = StepTotals.of(len(s["response_ids"]) for mb in mbs for s in mb)
        for name, w in (("same_node", near), ("cross_node", far)):
            print(f"[bench] {name}: node {nodes[0 if w is near else 1]['NodeManagerAddress']}", file=sys.stderr)
            d = {"roll_on_train_c_in_s": [], "weight_sync_s": [], "train_on_roll_c_in_s": [], "c_grad_s": []}
            for r in range(rounds + 1):
                weights = trainer.call.remote("train", "weights")
                c_in = ray.get(w.host.remote("rollout", **roll_kw, weights=[weights], version=r))
                t0 = time.perf_counter()
                ray.get(w.call.remote("rollout", "update_weights", trainer.call.remote("train", "weights"), r))
                sync = time.perf_counter() - t0
                ray.get(w.release.remote("rollout"))
                a_in, c_grad, _, _ = aux_round(ray, trainer, w, model, wire, mbs, total)
                if r == 0:
                    d["cold"] = {"roll_on_train_c_in_s": c_in, "train_on_roll_c_in_s": a_in}
                    continue
                d["roll_on_train_c_in_s"].append(c_in)
                d["weight_sync_s"].append(sync)
                d["train_on_roll_c_in_s"].append(a_in)
                d["c_grad_s"].extend(c_grad)
            for k in [k for k in d if k.endswith("_s")]:
                d[k[:-2] + "_median_s"] = statistics.median(d[k])
            out[name] = d
    return out


def two_nodes(model: str, rounds: int) -> dict | None:
    """A namespace cluster of two nodes, the measurements run inside the head's namespace."""
    from bidirl.runtime.netns_cluster import NetnsCluster, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"[bench] cannot build a namespace cluster here: {why}")
    path = f"{ROOT / 'src'}:{ROOT}"  # bidirl and this package, inside the namespaces
    with NetnsCluster(nodes=2, devices=2, env={"PYTHONPATH": path}) as cluster:
        cmd = cluster.exec_cmd(0, sys.executable, "-m", "bench.switch_costs", "--inner", cluster.address,
                               "--model", model, "--rounds", str(rounds))
        proc = subprocess.run(cmd, env={**cluster.env(), "PYTHONPATH": path}, cwd=ROOT, capture_output=True,
                              text=True, timeout=900)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return None
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    return {"link": "veth pair between two network namespaces", "left_behind": cluster.leftovers(), **res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                    help="2: the same and across nodes, on a namespace cluster (root only)")
    ap.add_argument("--rounds", type=int, default=5, help="hot switch rounds per direction (>= 1)")
    ap.add_argument("--model-path", help="HF model dir (default: bidirl's tiny model)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", help="default: bench/results/switch_costs.json (--nodes 2: switch_costs_2nodes.json)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # address: run the measurements (in the head's namespace)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: must be >= 1")
    if args.inner:
        print("RESULT " + json.dumps(across_nodes(args.inner, args.model, args.rounds)))
        return 0
    if args.nodes == 2 and (args.device != "cpu" or args.model_path):
        ap.error("--nodes 2: CPU devices and the tiny model only")
    model = args.model_path or tiny_model()
    out: dict = {"model": model, "device": args.device, "machine": platform.node(), "rounds": args.rounds,
                 "date": time.strftime("%Y-%m-%d %H:%M")}
    if args.nodes == 1:
        out.update(one_node(model, args.device, args.rounds))
        print(f"{'direction':<15} {'C_in cold':>10} {'C_in hot':>10} {'C_out':>10} {'C_grad':>10}"
              f"   (median of {args.rounds})")
        for name in ("roll_on_train", "train_on_roll"):
            d = out[name]
            grad = d.get("c_grad_median_s")
            print(f"{name:<15} {d['c_in_cold_s']:>9.3f}s {d['c_in_median_s']:>9.4f}s {d['c_out_median_s']:>9.4f}s "
                  f"{(f'{grad:.4f}s' if grad is not None else '-'):>10}")
    else:
        res = two_nodes(model, args.rounds)
        if res is None:
            return 1
        out.update(res)
        print(f"{'median of ' + str(args.rounds):<12} {'roll C_in':>10} {'w. sync':>10} {'aux C_in':>10} "
              f"{'C_grad':>10}")
        for name in ("same_node", "cross_node"):
            print(f"{name:<12} " + " ".join(f"{out[name][k]:>9.4f}s" for k in (
                "roll_on_train_c_in_median_s", "weight_sync_median_s", "train_on_roll_c_in_median_s",
                "c_grad_median_s")))
    path = write_json(args.json or RESULTS / ("switch_costs.json" if args.nodes == 1 else "switch_costs_2nodes.json"),
                      out)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
