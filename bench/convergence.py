"""What each scheduling policy learns, per algorithm: reward and validation curves over >= 300 steps.

BENCHMARKS.md, "Convergence". The latest series, then the report and plots:

    for s in 0 1 2; do for p in sync one-step-off async bidirl; do
        .venv/bin/python -m bench.convergence --policy $p --seeds $s trainer.lr=5e-4; done; done
    .venv/bin/python -m bench.convergence --report      # -> convergence_report.json, convergence.png
    .venv/bin/python -m bench.convergence --policy async-reproducible --seeds S \
        --json bench/results/convergence_reproducible.json trainer.lr=5e-4

Runs ``bidirl train`` per algorithm, policy and seed, the data order the same for all, and
appends each run's curves to ``--json`` (an (algorithm, policy, seed) already there is skipped).
``--algorithm`` and ``--policy`` take comma lists; an algorithm is a named set of overrides
(``ALGORITHMS``, docs/algorithm.md); ``async-reproducible`` is ``async`` with
``scheduler.reproducible=true``. ``--report``: reward and validation per algorithm and policy,
their gap to ``sync``, the loop seconds to a validation of ``--target``, a figure per algorithm.
``--check-reproducible``: per algorithm, a short run under ``async`` and one under
``bidirl-opportunistic`` (two replicas: it borrows), both reproducible; their final weights'
sha256 must be equal (``bench/results/reproducible_algorithms.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import RESULTS, code_version, train, write_json

POLICIES = {"sync": ["scheduler.policy=sync"], "one-step-off": ["scheduler.policy=one-step-off"],
            "async": ["scheduler.policy=async"], "bidirl": ["scheduler.policy=bidirl"],
            "async-reproducible": ["scheduler.policy=async", "scheduler.reproducible=true"]}

DYNAMIC_SAMPLING = "algorithm.filter_groups.enable=true"
# The algorithm presets (docs/algorithm.md, "Algorithm presets"): overrides added to every run.
ALGORITHMS = {
    "grpo": [],
    "dr_grpo": ["algorithm.norm_adv_by_std_in_grpo=false", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "gspo": ["algorithm.policy_loss=gspo", "trainer.clip_eps_low=3e-4", "trainer.clip_eps_high=4e-4",
             "algorithm.loss_agg_mode=seq-mean-token-mean"],
    "dapo": ["trainer.clip_eps_low=0.2", "trainer.clip_eps_high=0.28", "algorithm.loss_agg_mode=token-mean",
             "algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=4",
             # no generation cap (veRL's 0): on reverse_mixed the keep rate falls to ~0.2 as the model
             # learns, and the recipe's cap of 10 batches stopped a 300-step sync run at step 238
             DYNAMIC_SAMPLING, "algorithm.filter_groups.max_num_gen_batches=0"],
}
# The tests' small shape (tests/runtime/test_reproducible.py), for --check-reproducible.
SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
         "trainer.micro_batch_size=4", "run.val_every=4", "scheduler.reproducible=true", "cluster.oversubscribe=true"]


def algorithm_overrides(name: str, reproducible: bool = False) -> list[str]:
    """The preset's overrides; in reproducible mode without dynamic sampling, which the config
    refuses there (the step a replacement group joins depends on timing)."""
    return [ov for ov in ALGORITHMS[name] if not (reproducible and ov == DYNAMIC_SAMPLING)]


# Per-step training metrics kept with each run (why a policy learns less shows here).
DIAGNOSTICS = ("actor/pg_clipfrac", "actor/kl_behaviour", "actor/grad_norm", "actor/entropy",
               "actor/pg_loss", "response_length/mean")


def run_one(algorithm: str, policy: str, seed: int, steps: int, val_every: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bidirl-conv-") as tmp:
        run = Path(tmp) / "run"
        args = [*POLICIES[policy], *algorithm_overrides(algorithm), f"run.seed={seed}", "data.seed=0",
                f"run.steps={steps}", f"run.val_every={val_every}", "run.val_before_train=true", "run.plot=false",
                "run.tensorboard=false", "run.checkpoint_every=0", *extra]
        out = train(run, args)
        if not out.ok:
            raise RuntimeError(f"{algorithm} {policy} seed {seed} failed:\n{out.stderr[-3000:]}")
        s, recs = out.summary(), out.metrics()
        val = [(d["step"], d["val/score/mean"]) for d in recs if "val/score/mean" in d]
        steps_trained = [d for d in recs if "actor/pg_clipfrac" in d]
        diag = {k: [d.get(k) for d in steps_trained] for k in DIAGNOSTICS}
    ends, t = [], 0.0
    for dt in s["step_times_s"]:
        t += dt
        ends.append(round(t, 3))
    return {"algorithm": algorithm, "policy": policy, "seed": seed, "args": args,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "process_wall_s": round(out.process_wall_s, 1), "loop_wall_s": s["wall_s"], "rewards": s["rewards"],
            "step_end_s": ends, "val": val, "borrows": s["borrows"], "audit_ok": s["audit_ok"],
            "load_avg": os.getloadavg()[0], "diagnostics": diag}


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text())["runs"] if path.is_file() else []


def save(path: Path, runs: list[dict]) -> None:
    write_json(path, {"runs": runs})


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _time_to(run: dict, target: float) -> float | None:
    """Training-loop seconds until the first validation at or above ``target``."""
    for step, score in run["val"]:
        if score >= target:
            return 0.0 if step == 0 else run["step_end_s"][step - 1]
    return None


def _algorithm(run: dict) -> str:
    return run.get("algorithm", "grpo")  # runs from before the presets trained grpo


def report(runs: list[dict], target: float) -> dict:
    by: dict[str, dict[str, list[dict]]] = {}
    for r in runs:
        by.setdefault(_algorithm(r), {}).setdefault(r["policy"], []).append(r)
    return {"target_val": target, "algorithms": {a: _policies(ps, target) for a, ps in by.items()}}


def _policies(by: dict[str, list[dict]], target: float) -> dict:
    out: dict[str, dict] = {}
    for p, rs in by.items():
        last50 = [statistics.mean(r["rewards"][-50:]) for r in rs]
        first50 = [statistics.mean(r["rewards"][:50]) for r in rs]
        val0 = [r["val"][0][1] for r in rs]
        valn = [r["val"][-1][1] for r in rs]
        loop = [r["loop_wall_s"] for r in rs]
        tt = [_time_to(r, target) for r in rs]
        out[p] = {"seeds": sorted(r["seed"] for r in rs), "steps": len(rs[0]["rewards"]),
                  "reward_first_50": _mean_sd(first50), "reward_last_50": _mean_sd(last50),
                  "val_start": _mean_sd(val0), "val_final": _mean_sd(valn), "loop_wall_s": _mean_sd(loop),
                  "time_to_target_s": [t for t in tt],
                  "borrows": [r["borrows"] for r in rs]}
    if "sync" in out:
        ref = out["sync"]
        for o in out.values():
            o["reward_last_50_gap_to_sync"] = o["reward_last_50"][0] - ref["reward_last_50"][0]
            o["val_final_gap_to_sync"] = o["val_final"][0] - ref["val_final"][0]
    if "async" in out and "async-reproducible" in out:
        out["async-reproducible"]["loop_wall_vs_async"] = (out["async-reproducible"]["loop_wall_s"][0]
                                                           / out["async"]["loop_wall_s"][0])
    return out


def table(rep: dict) -> list[str]:
    """The report as markdown table lines, one per algorithm and policy."""
    lines = ["| algorithm | policy | seeds | reward first 50 | reward last 50 | last 50 - sync | val final |",
             "|---|---|---|---|---|---|---|"]
    for a, ps in rep["algorithms"].items():
        for p, o in ps.items():
            gap = o.get("reward_last_50_gap_to_sync")
            lines.append(f"| {a} | {p} | {len(o['seeds'])} | {o['reward_first_50'][0]:.3f} | "
                         f"{o['reward_last_50'][0]:.3f} +- {o['reward_last_50'][1]:.3f} | "
                         f"{'-' if gap is None else f'{gap:+.3f}'} | {o['val_final'][0]:.3f} |")
    return lines


def _band(ax, xs_list, ys_list, label):
    import numpy as np

    n = min(len(x) for x in xs_list)
    xs = np.mean([x[:n] for x in xs_list], axis=0)
    ys = np.array([y[:n] for y in ys_list])
    m, sd = ys.mean(0), ys.std(0)
    (line,) = ax.plot(xs, m, label=label, lw=1.6)
    ax.fill_between(xs, m - sd, m + sd, alpha=0.2, color=line.get_color())


def plot(runs: list[dict], out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["policy"], []).append(r)
    k = 20

    def smooth(v):
        return [statistics.mean(v[max(0, i - k + 1):i + 1]) for i in range(len(v))]

    fig = Figure(figsize=(12, 7))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    for p, rs in sorted(by.items()):
        label = f"{p} ({len(rs)} seeds)"
        steps = [list(range(1, len(r["rewards"]) + 1)) for r in rs]
        _band(axes[0][0], steps, [smooth(r["rewards"]) for r in rs], label)
        _band(axes[0][1], [r["step_end_s"] for r in rs], [smooth(r["rewards"]) for r in rs], label)
        _band(axes[1][0], [[s for s, _ in r["val"]] for r in rs], [[v for _, v in r["val"]] for r in rs], label)
        _band(axes[1][1], [[0.0 if s == 0 else r["step_end_s"][s - 1] for s, _ in r["val"]] for r in rs],
              [[v for _, v in r["val"]] for r in rs], label)
    temp = next((a.split("=", 1)[1] for a in runs[0]["args"] if a.startswith("rollout.val_temperature=")), "0")
    val = "greedy" if float(temp) == 0 else f"temperature {temp}"
    titles = [[f"reward ({k}-step mean) vs step", "reward vs training-loop seconds"],
              [f"validation score ({val}) vs step", "validation score vs training-loop seconds"]]
    for i in range(2):
        for j in range(2):
            ax = axes[i][j]
            ax.set_title(titles[i][j], fontsize=10)
            ax.set_xlabel("step" if j == 0 else "seconds")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    lrs = {a for r in runs for a in r["args"] if a.startswith("trainer.lr=")} or {"trainer.lr=default"}
    task = next((a.split("=", 1)[1] for a in runs[0]["args"] if a.startswith("data.task=")), "reverse")
    fig.suptitle(f"bidirl train ({_algorithm(runs[0])}, {task} task, 2 CPU devices, {', '.join(sorted(lrs))}): "
                 "mean and ±1 sd over seeds")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def weights_sha256(model_dir: Path) -> str:
    """sha256 over a model directory's tensors, name by name (read as tests/runtime/test_reproducible.py does)."""
    import hashlib

    from safetensors.numpy import load_file

    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        for name, array in sorted(load_file(str(f)).items()):
            h.update(name.encode() + array.tobytes())
    return h.hexdigest()


def check_reproducible(algorithms: list[str], steps: int, extra: list[str]) -> list[dict]:
    """Per algorithm: the final weights of ``async`` (one replica) and of ``bidirl-opportunistic``
    (two, so it lends both ways), both reproducible, and the borrows each made."""
    out = []
    for alg in algorithms:
        row: dict = {"algorithm": alg, "steps": steps}
        for policy, replicas in (("async", 1), ("bidirl-opportunistic", 2)):
            with tempfile.TemporaryDirectory(prefix="bidirl-repro-") as tmp:
                run = train(Path(tmp) / "run", [*SMALL, *algorithm_overrides(alg, reproducible=True),
                                                f"scheduler.policy={policy}",
                                                f"cluster.rollout_devices={replicas}", f"run.steps={steps}",
                                                "run.plot=false", "run.tensorboard=false", *extra])
                if not run.ok:
                    raise RuntimeError(f"{alg} {policy} failed:\n{run.stderr[-3000:]}")
                row[policy] = {"sha256": weights_sha256(run.run_dir / "model"), "borrows": run.summary()["borrows"]}
        row["equal"] = row["async"]["sha256"] == row["bidirl-opportunistic"]["sha256"]
        row["borrowed_both_ways"] = min(row["bidirl-opportunistic"]["borrows"].values()) >= 1
        print(f"| {alg} | {row['equal']} | {row['async']['sha256'][:12]} | "
              f"{row['bidirl-opportunistic']['sha256'][:12]} | {row['bidirl-opportunistic']['borrows']} |")
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithm", default="grpo", help=f"comma list of: {', '.join(ALGORITHMS)}")
    ap.add_argument("--policy", help=f"comma list of: {', '.join(sorted(POLICIES))}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--val-every", type=int, default=25)
    ap.add_argument("--json", default=str(RESULTS / "convergence.json"))
    ap.add_argument("--report", action="store_true", help="print the comparison and write the plots")
    ap.add_argument("--target", type=float, default=0.5, help="validation score for the time-to-target figure")
    ap.add_argument("--check-reproducible", action="store_true",
                    help="async vs bidirl-opportunistic final weights per --algorithm (--steps: 8 is enough)")
    ap.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    a = ap.parse_args()
    path, algorithms, policies = Path(a.json), a.algorithm.split(","), (a.policy.split(",") if a.policy else [])
    if unknown := [x for x in algorithms if x not in ALGORITHMS] + [p for p in policies if p not in POLICIES]:
        ap.error(f"unknown algorithm or policy: {', '.join(unknown)}")
    if a.check_reproducible:
        print("| algorithm | weights equal | async sha256 | bidirl sha256 | bidirl borrows |\n|---|---|---|---|---|")
        rows = check_reproducible(algorithms, a.steps, a.extra)
        write_json(RESULTS / "reproducible_algorithms.json",
                   {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": code_version(), "runs": rows})
        return 0 if all(r["equal"] and r["borrowed_both_ways"] for r in rows) else 1
    for alg, policy in ((x, p) for x in algorithms for p in policies):
        for seed in (int(x) for x in a.seeds.split(",")):
            runs = load(path)
            if any((_algorithm(r), r["policy"], r["seed"], len(r["rewards"])) == (alg, policy, seed, a.steps)
                   for r in runs):
                print(f"[convergence] {alg} {policy} seed {seed}: already in {path}", file=sys.stderr)
                continue
            r = run_one(alg, policy, seed, a.steps, a.val_every, a.extra)
            print(f"[convergence] {alg} {policy} seed {seed}: loop {r['loop_wall_s']:.1f} s, reward last 50 "
                  f"{statistics.mean(r['rewards'][-50:]):.3f}, val {r['val'][0][1]:.3f} -> {r['val'][-1][1]:.3f}",
                  file=sys.stderr)
            save(path, load(path) + [r])
    if a.report:
        runs = load(path)
        rep = report(runs, a.target)
        print(json.dumps(rep, indent=1))
        print("\n".join(table(rep)))
        write_json(path.with_name(path.stem + "_report.json"), rep)
        for alg in rep["algorithms"]:
            suffix = "" if alg == "grpo" else f"_{alg}"
            plot([r for r in runs if _algorithm(r) == alg], path.with_name(f"{path.stem}{suffix}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
