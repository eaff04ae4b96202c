"""Hot-switch costs on the same node and across nodes: C_in, C_grad and the weight sync per node pair.

Builds a 2-node Ray cluster on this machine from network namespaces (``runtime/netns_cluster.py``:
a veth pair with private addresses, the head in one namespace, a worker node in the other;
root only), then, with the real ``DeviceWorker`` actors and roles that ``bidirl train`` uses:

* the primary trainer on node 0 holds the newest weights;
* a *near* worker (node 0) and a *far* worker (node 1) each, ``--rounds`` times:
  bring up a parked rollout replica with the trainer's weights (``roll_on_train`` C_in, the
  weights pulled from node 0's object store), take a weight update as a home replica does
  (``weight_sync``), release it; bring up an auxiliary trainer with the weights
  (``train_on_roll`` C_in), compute a gradient chunk that the primary fetches and applies
  (``C_grad``, timed by the primary), release it.

The first bring-up of each role is cold (engine start) and not counted.  The link is a veth
pair between namespaces of one machine: it measures what crossing Ray's object transfer
and the nodes' TCP stacks costs, not a datacenter network.

    sudo .venv/bin/python bench/multinode_switch_costs.py [--rounds 5] \\
        [--json bench/results/multinode_switch_costs.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _samples(n_mb: int, per_mb: int, resp: int):
    return [[{"prompt_ids": [1, 5, 6, 7], "response_ids": [8 + (i + j) % 50 for j in range(resp)],
              "behaviour_logprobs": [-1.0] * resp, "advantage": 0.5 - (i % 2)} for i in range(per_mb)]
            for _ in range(n_mb)]


def measure(address: str, model: str, rounds: int) -> dict:
    """Inside the head's namespace: the driver of the measurements."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

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
        total = sum(len(s["response_ids"]) for mb in mbs for s in mb)
        for name, w in (("same_node", near), ("cross_node", far)):
            print(f"[bench] {name}: node {nodes[0 if w is near else 1]['NodeManagerAddress']}", file=sys.stderr)
            d = {"roll_on_train_c_in_s": [], "weight_sync_s": [], "train_on_roll_c_in_s": [], "c_grad_s": []}
            for r in range(rounds + 1):
                weights = trainer.call.remote("train", "weights")
                c_in = ray.get(w.host.remote("rollout", **roll_kw, weights=[weights], version=r))
                t0 = time.perf_counter()
                ray.get(w.call.remote("rollout", "update_weights", trainer.call.remote("train", "weights"), r))
                sync = time.perf_counter() - t0
                ray.get(w.release.remote("rollout", park=True))
                weights = trainer.call.remote("train", "weights")
                version = ray.get(trainer.call.remote("train", "get_version"))
                a_in = ray.get(w.host.remote("aux_train", model_dir=model, config=wire, weights=[weights],
                                             version=version))
                own = trainer.call.options(num_returns=2).remote("train", "compute_chunk_ref", mbs[:1], total)[0]
                aux = w.call.options(num_returns=2).remote("aux_train", "compute_chunk_ref", mbs[1:], total)[0]
                ray.wait([own, aux], num_returns=2, fetch_local=False)  # the primary pulls the chunk itself
                _, c_grad = ray.get(trainer.call.remote("train", "apply_refs", [[own, aux]], 1))
                ray.get(w.release.remote("aux_train", park=True))
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="hot rounds per worker (>= 1)")
    ap.add_argument("--json", default=str(ROOT / "bench/results/multinode_switch_costs.json"))
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # address: run the measurements (in the head's namespace)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: must be >= 1")
    if args.inner:
        print("RESULT " + json.dumps(measure(args.inner, args.model, args.rounds)))
        return 0

    from bidirl.models.tiny import build_tiny_model
    from bidirl.runtime.netns_cluster import NetnsCluster, unavailable

    why = unavailable()
    if why:
        print(f"[bench] cannot build a namespace cluster here: {why}", file=sys.stderr)
        return 2
    model = str(build_tiny_model(ROOT / ".bidirl" / "models" / "tiny"))
    cluster = NetnsCluster(nodes=2, devices=2, env={"PYTHONPATH": str(ROOT / "src")})
    with cluster:
        cmd = cluster.exec_cmd(0, sys.executable, __file__, "--inner", cluster.address, "--model", model,
                               "--rounds", str(args.rounds))
        env = {**cluster.env(), "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    left = cluster.leftovers()
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 1
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    out = {"model": model, "device": "cpu", "machine": platform.node(), "rounds": args.rounds,
           "date": time.strftime("%Y-%m-%d %H:%M"), "link": "veth pair between two network namespaces",
           "left_behind": left, **res}
    print(f"{'median of ' + str(args.rounds):<12} {'roll C_in':>10} {'w. sync':>10} {'aux C_in':>10} {'C_grad':>10}")
    for name in ("same_node", "cross_node"):
        d = res[name]
        print(f"{name:<12} " + " ".join(f"{d[k]:>9.4f}s" for k in ("roll_on_train_c_in_median_s",
                                                                   "weight_sync_median_s",
                                                                   "train_on_roll_c_in_median_s",
                                                                   "c_grad_median_s")))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"[bench] wrote {args.json}; left behind: {left or 'nothing'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
