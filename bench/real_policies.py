"""``async`` against ``bidirl`` on real devices (Ray + vLLM + torch), workload by workload.

BENCHMARKS.md, "Real workloads: bidirl against async". The latest series, per workload W:

    .venv/bin/python -m bench.real_policies --workload W --pairs 5 --keep RUNS/W \
        --json bench/results/real_policies_W_1204eve.json

Interleaved pairs of ``bidirl train`` (async, bidirl, then bidirl, async, ...), same config and
seed. Per run: tokens/s, the ideal packing bound (the pair's ``async`` busy device-seconds packed
on all devices), efficiency, idle, borrows, stage-model errors, reclaim latency, the audit, the
host's steal, and the simulator's prediction from the run's ``scenario.yaml``. ``--append`` adds
pairs to an existing ``--json`` of the same workload and steps; ``--steps N`` sets the length;
``--resimulate --keep RUNS/W --json J`` predicts the kept runs of ``J`` again with this checkout's
simulator (the real figures untouched).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from bench.measure import RESULTS, ROOT, code_version, run_env, train, write_json

BASE = ["model.tiny_layers=4", "model.tiny_hidden=256", "model.warm_start_steps=0",
        "rollout.prompts_per_step=8", "rollout.group_size=8", "data.task=copy",
        "run.checkpoint_every=0", "run.plot=false", "run.tensorboard=false",
        "run.val_every=0"]  # the figures are the training loop's; validation is not part of any workload
LONG_PROMPT_TOKENS = 200


@dataclass(frozen=True)
class Workload:
    description: str
    overrides: tuple[str, ...]
    long_prompts: bool = False  # veRL-layout rows with ~LONG_PROMPT_TOKENS-token prompts
    steps: int = 12


WORKLOADS = {
    "rollout-heavy": Workload(
        "4 prompts x 8 responses of <= 128 tokens on a replica that runs 4 at a time (a KV-bound "
        "replica): the trainer idles",
        ("rollout.prompts_per_step=4", "rollout.max_new_tokens=128", "rollout.max_num_seqs=4",
         "trainer.micro_batch_size=16")),
    "train-heavy": Workload(
        f"~{LONG_PROMPT_TOKENS}-token prompts, short responses (<= 24), a KL term: the rollout idles",
        ("rollout.max_new_tokens=24", "trainer.micro_batch_size=4", "trainer.kl_coef=0.01"),
        long_prompts=True),
    "shifting": Workload(
        f"4 prompts x 8 of ~{LONG_PROMPT_TOKENS} tokens, the response cap growing 8 -> 288 over the run "
        "on a replica that runs 2 at a time: training-bound at first, rollout-bound at the end",
        ("rollout.prompts_per_step=4", "rollout.max_new_tokens=288", "rollout.max_new_tokens_start=8",
         "rollout.max_num_seqs=2", "trainer.micro_batch_size=8"), long_prompts=True, steps=12),
    "balanced": Workload(
        "responses <= 128 tokens, all 64 at once, a KL term: rollout and training take about as long",
        ("rollout.max_new_tokens=128", "trainer.micro_batch_size=16", "trainer.kl_coef=0.01")),
    "filter": Workload(
        "DAPO's dynamic sampling (algorithm.filter_groups) on the rollout-heavy shape at 8 a time: half "
        "the prompts score all right or all wrong (bench/difficulty_reward.py), so about half the groups "
        "are filtered and replaced and rollout generates ~2x the groups a step trains",
        (f"data.reward_fn={ROOT / 'bench' / 'difficulty_reward.py'}", "algorithm.filter_groups.enable=true",
         "algorithm.filter_groups.max_num_gen_batches=10", "rollout.prompts_per_step=4",
         "rollout.max_new_tokens=128", "rollout.max_num_seqs=8", "trainer.micro_batch_size=16")),
    "multimodal": Workload(
        "image prompts (the shapes task: one 64 x 64 picture, 19 image tokens, a question) on the tiny "
        "SmolVLM-shaped model from random weights, 4 prompts x 8 responses of <= 128 tokens, 4 at a time: "
        "the vision tower runs in vLLM's prefill and in every trainer forward",
        ("model.kind=vl", "data.task=shapes", "rollout.prompts_per_step=4", "rollout.max_new_tokens=128",
         "rollout.max_num_seqs=4", "trainer.micro_batch_size=16")),
    "multi-turn": Workload(
        "guess_number (docs/environments.md): up to 8 model turns of <= 32 tokens, each answered higher/lower "
        "after a 0.1 s wait (env.tool_latency_s: a tool's latency) on the tiny model from random weights, "
        "4 prompts x 8 trajectories, 8 at a time; a trajectory waiting on its tool holds no slot",
        ("data.task=guess_number", "env.tool_latency_s=0.1", "rollout.prompts_per_step=4",
         "rollout.max_new_tokens=32", "rollout.max_num_seqs=8", "trainer.micro_batch_size=16")),
}
POLICIES = ("async", "bidirl")


CODE = code_version()


def long_prompt_rows(path: Path, n: int = 256, seed: int = 0) -> Path:
    """veRL-layout rows of the built-in ``copy`` task behind a long (character) preamble."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            answer = str(rng.randrange(1000, 9999))
            filler = " ".join(str(rng.randrange(10, 99)) for _ in range(LONG_PROMPT_TOKENS // 3))
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"{filler} copy {answer}"}],
                                "data_source": "copy", "reward_model": {"ground_truth": answer},
                                "extra_info": {"index": i}}) + "\n")
    return path


def simulate(scenario: Path, policy: str, tmp: Path) -> float | None:
    """The simulator's throughput for ``policy`` on a run's calibrated scenario."""
    if not scenario.is_file():
        return None
    out = tmp / f"sim-{policy}.json"
    r = subprocess.run([sys.executable, "-m", "bidirl.cli", "simulate", "--scenario", str(scenario),
                        "--policy", policy, "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       env=run_env())
    if r.returncode != 0:
        print(f"  simulate {scenario} {policy} failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())["throughput_tokens_per_s"]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def cpu_jiffies(stat: str | None = None) -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from ``/proc/stat``'s first line (``stat``: its
    text, for tests), or None where there is none (not Linux).

    On a virtual machine, *steal* is time the hypervisor gave this VM's CPUs to someone
    else: the run's threads were ready and did not run.  It is the share of a run's figures
    that belongs to the host's other tenants, which the load average does not show."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = stat.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPU time between two ``cpu_jiffies`` readings that was stolen."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 4)


def run_once(name: str, w: Workload, policy: str, run: Path, data: Path | None, extra: list[str]) -> dict:
    over = [*BASE, *w.overrides, f"run.steps={w.steps}", f"scheduler.policy={policy}", *extra]
    if data is not None:
        over += [f"data.files={data}", f"data.max_prompt_length={LONG_PROMPT_TOKENS + 64}"]
    load0, jiffies0 = os.getloadavg()[0], cpu_jiffies()
    out = train(run, over)
    if not out.ok:
        return {"workload": name, "policy": policy, "error": out.stderr[-2000:]}
    steal = steal_fraction(jiffies0, cpu_jiffies())
    s = out.summary()
    waits = s.get("reclaim_waits", [])
    return {
        "workload": name, "policy": policy, "tokens_per_s": s["throughput_tokens_per_s"],
        "ideal_tokens_per_s": s["ideal_tokens_per_s"], "efficiency": s["efficiency"],
        "loop_wall_s": s["wall_s"], "process_wall_s": round(out.process_wall_s, 1),
        # The machine is shared: the 1-minute load average before and after the run says how
        # much else ran beside it (2 cores: above ~2.5, figures are other people's too).
        "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "steal_fraction": steal,
        "idle_ratio": s["idle_ratio"], "borrows": s["borrows"],
        "admission": {k: v for k, v in s["admission"].items() if k != "latest"},
        "stage_model_median_error": s.get("stage_model_median_error", {}),
        "audit_ok": s["audit_ok"], "max_staleness": s["audit"]["max_staleness"],
        "groups_trained": s["audit"]["groups_trained"], "step_times_s": s["step_times_s"],
        # dynamic sampling (the filter workload): groups filtered and the share kept
        "groups_filtered": s["audit"].get("groups_filtered", 0), "keep_rate": s["audit"].get("keep_rate", 1.0),
        # A reclaim's latency (issue -> device back) against what it may cost: the work in
        # progress when it arrived (one decode step or one micro-batch) + C_out.
        "reclaim_latency_s": [w_["wait_s"] + w_["c_out_s"] for w_ in waits],
        "reclaim_bound_s": [w_["last_work_s"] + w_["c_out_s"] for w_ in waits],
        "sim_predicted_tokens_per_s": simulate(run / "scenario.yaml", policy, run),
    }


def run_workload(name: str, pairs: int, extra: list[str], tmp: Path, before: list[dict] = (),
                 steps: int | None = None) -> dict:
    """``pairs`` more interleaved pairs of ``name``, summarised with the runs ``before`` them
    (``--append``: a long series split into several shorter invocations); ``steps``: the
    training steps of each run, instead of the workload's (``--steps``)."""
    w = WORKLOADS[name] if steps is None else replace(WORKLOADS[name], steps=steps)
    data = long_prompt_rows(tmp / f"{name}-prompts.jsonl") if w.long_prompts else None
    runs: list[dict] = list(before)
    first = 1 + max((r["pair"] for r in before), default=-1)
    for i in range(first, first + pairs):
        order = POLICIES if i % 2 == 0 else POLICIES[::-1]
        for pol in order:
            print(f"[{name}] pair {i + 1}/{first + pairs}: {pol} ...", file=sys.stderr, flush=True)
            r = run_once(name, w, pol, tmp / f"{name}-{i:02d}-{pol}", data, extra)
            r["pair"], r["code"] = i, CODE
            runs.append(r)
            if "error" in r:
                print(f"  FAILED: {r['error'][-600:]}", file=sys.stderr)
    return summarise(name, w, runs)


def complete_pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """(async run, bidirl run) of every pair that has both, in pair order (failed runs left out)."""
    by = {(r["pair"], r["policy"]): r for r in runs if "error" not in r}
    pairs = sorted({i for i, _ in by})
    return [(by[i, "async"], by[i, "bidirl"]) for i in pairs if (i, "async") in by and (i, "bidirl") in by]


def efficiency_split(pairs: list[tuple[dict, dict]]) -> tuple[list[float], list[float]]:
    """The within-pair efficiency (bidirl over async's bound) as two factors per pair, their
    quotient exactly: bidirl against the bound of its *own* busy device-seconds (bubbles and
    switches), and how much more device time its tokens took than async's (async's bound over
    bidirl's: on shared cores, work runs slower beside work)."""
    own = [b["tokens_per_s"] / b["ideal_tokens_per_s"] for _, b in pairs]
    work = [a["ideal_tokens_per_s"] / b["ideal_tokens_per_s"] for a, b in pairs]
    return own, work


def summarise(name: str, w: Workload, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    by = {p: [r for r in ok if r["policy"] == p] for p in POLICIES}
    ratios, bounds = [], []
    effs: dict[str, list[float]] = {p: [] for p in POLICIES}  # per pair, against the pair's bound
    pairs = complete_pairs(ok)
    for a, b in pairs:
        ratios.append(b["tokens_per_s"] / a["tokens_per_s"])
        bounds.append(a["ideal_tokens_per_s"])
        effs["async"].append(a["tokens_per_s"] / a["ideal_tokens_per_s"])
        effs["bidirl"].append(b["tokens_per_s"] / a["ideal_tokens_per_s"])
    own, work = efficiency_split(pairs)
    ideal = statistics.median(bounds) if bounds else None
    policies = {}
    for p, rs in by.items():
        tps = [r["tokens_per_s"] for r in rs]
        sims = [r["sim_predicted_tokens_per_s"] for r in rs if r["sim_predicted_tokens_per_s"]]
        errs: dict[str, list[float]] = {}
        for r in rs:
            for stage, e in r["stage_model_median_error"].items():
                if e is not None:
                    errs.setdefault(stage, []).append(e)
        lat = [x for r in rs for x in r["reclaim_latency_s"]]
        bound = [x for r in rs for x in r["reclaim_bound_s"]]
        policies[p] = {
            "tokens_per_s": statistics.median(tps) if tps else None,
            "tokens_per_s_runs": tps,
            # within each pair (the machine's speed moves between pairs), then the median
            "efficiency": statistics.median(effs[p]) if effs[p] else None,
            "efficiency_per_pair": effs[p],
            "sim_predicted_tokens_per_s": statistics.median(sims) if sims else None,
            "sim_over_real": [r["sim_predicted_tokens_per_s"] / r["tokens_per_s"] for r in rs
                              if r["sim_predicted_tokens_per_s"]],
            "idle_ratio": {k: statistics.median(r["idle_ratio"].get(k, 0) for r in rs)
                           for k in ("rollout", "train")} if rs else {},
            "borrows": [r["borrows"] for r in rs],
            "stage_model_median_error": {k: statistics.median(v) for k, v in errs.items()},
            "reclaim_latency_p50_s": pct(lat, 0.5), "reclaim_latency_p99_s": pct(lat, 0.99),
            "reclaim_bound_p50_s": pct(bound, 0.5), "reclaim_bound_p99_s": pct(bound, 0.99),
            "audit_ok": all(r["audit_ok"] for r in rs),
            "keep_rate": statistics.median(r.get("keep_rate", 1.0) for r in rs) if rs else None,
            "load_average_max": max((max(r.get("load_average", [0])) for r in rs), default=None),
            "steal_fraction_max": max((r["steal_fraction"] for r in rs
                                       if r.get("steal_fraction") is not None), default=None),
        }
    a_tps = policies["async"]["tokens_per_s"]
    return {
        "workload": name, "description": w.description, "overrides": list(w.overrides),
        "steps": w.steps, "pairs": len(ratios), "ratios": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "ratio_spread": [min(ratios), max(ratios)] if ratios else None,
        "ideal_tokens_per_s": ideal,
        "bound_over_async": (ideal / a_tps) if ideal and a_tps else None,
        "bidirl_own_efficiency_per_pair": own,
        "bidirl_own_efficiency": statistics.median(own) if own else None,
        "bidirl_work_over_async_per_pair": work,
        "bidirl_work_over_async": statistics.median(work) if work else None,
        "policies": policies, "failed_runs": [r for r in runs if "error" in r], "runs": ok,
    }


def fmt(x, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(results: list[dict]) -> None:
    print(f"{'workload':<14}{'policy':<8}{'tok/s':>8}{'bound':>8}{'eff':>6}{'sim':>8}{'sim/real':>9}"
          f"{'idle r/t':>11}{'borrows r/t':>12}{'decode err':>11}{'audit':>6}{'load':>6}")
    for res in results:
        for p in POLICIES:
            q = res["policies"][p]
            so = q["sim_over_real"]
            b = q["borrows"]
            rt = (f"{sum(x.get('roll_on_train', 0) for x in b)}/{sum(x.get('train_on_roll', 0) for x in b)}"
                  if b else "-")
            print(f"{res['workload']:<14}{p:<8}{fmt(q['tokens_per_s']):>8}{fmt(res['ideal_tokens_per_s']):>8}"
                  f"{fmt(q['efficiency'], '.2f'):>6}{fmt(q['sim_predicted_tokens_per_s']):>8}"
                  f"{fmt(statistics.median(so) if so else None, '.2f'):>9}"
                  f"{q['idle_ratio'].get('rollout', 0):>6.2f}/{q['idle_ratio'].get('train', 0):<4.2f}"
                  f"{rt:>12}{fmt(q['stage_model_median_error'].get('decode'), '.2f'):>11}"
                  f"{str(q['audit_ok']):>6}{fmt(q['load_average_max'], '.1f'):>6}"
                  f"{fmt(q.get('steal_fraction_max'), '.3f'):>7}")
        r = res["ratios"]
        print(f"{'':<14}bidirl/async median {fmt(res['median_ratio'], '.3f')} over {res['pairs']} pairs "
              f"(spread {fmt(min(r) if r else None, '.3f')}..{fmt(max(r) if r else None, '.3f')}); "
              f"bound/async {fmt(res['bound_over_async'], '.2f')}; reclaim p50/p99 "
              f"{fmt(res['policies']['bidirl']['reclaim_latency_p50_s'], '.3f')}/"
              f"{fmt(res['policies']['bidirl']['reclaim_latency_p99_s'], '.3f')} s against step+C_out "
              f"{fmt(res['policies']['bidirl']['reclaim_bound_p50_s'], '.3f')}/"
              f"{fmt(res['policies']['bidirl']['reclaim_bound_p99_s'], '.3f')} s")
        print(f"{'':<14}bidirl efficiency within pairs {fmt(res['policies']['bidirl']['efficiency'], '.3f')}: "
              f"{fmt(res['bidirl_own_efficiency'], '.3f')} of its own busy time's bound, its busy time "
              f"{fmt(res['bidirl_work_over_async'], '.3f')}x async's for the same work (medians over pairs)")


def resimulate(path: Path, keep: Path) -> int:
    """The simulator's predictions of kept runs again, the real figures untouched."""
    prev = json.loads(path.read_text())
    name = prev["workload"]
    for r in prev["runs"]:
        run = keep / f"{name}-{r['pair']:02d}-{r['policy']}"
        r["sim_predicted_tokens_per_s"], r["sim_code"] = simulate(run / "scenario.yaml", r["policy"], run), CODE
    w = replace(WORKLOADS[name], steps=prev["steps"])
    out = summarise(name, w, prev["runs"] + prev["failed_runs"])
    write_json(path, out)
    print_table([out])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="all", help=f"one of {', '.join(WORKLOADS)}, or all")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved async/bidirl pairs (>= 1)")
    ap.add_argument("--json", default=str(RESULTS / "real_policies.json"))
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps of each run (default: the workload's, 12): a longer run "
                         "weighs the cold start (the first batch, the models learning) less")
    ap.add_argument("--append", action="store_true",
                    help="add the pairs to those already in --json (one workload) and summarise them all")
    ap.add_argument("--resimulate", action="store_true",
                    help="no new runs: predict each run of --json (one workload) again from its scenario.yaml "
                         "under --keep with this checkout's simulator (after a simulator change)")
    ap.add_argument("extra", nargs="*", help="key=value overrides for every run (after --)")
    args = ap.parse_args()
    if args.resimulate:
        return resimulate(Path(args.json), Path(args.keep or ap.error("--resimulate: give --keep DIR")))
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"--workload: {n!r} is not one of {', '.join(WORKLOADS)}, all")
    if args.pairs < 1:
        ap.error("--pairs: must be >= 1")
    if args.steps is not None and args.steps < 2:
        ap.error("--steps: must be >= 2 (a run needs a step after the first batch)")
    before: list[dict] = []
    if args.append:
        if len(names) != 1:
            ap.error("--append: give one --workload")
        if Path(args.json).is_file():
            prev = json.loads(Path(args.json).read_text())
            if prev.get("workload") != names[0]:
                ap.error(f"--append: {args.json} holds workload {prev.get('workload')!r}, not {names[0]!r}")
            steps = WORKLOADS[names[0]].steps if args.steps is None else args.steps
            if prev.get("steps") != steps:
                ap.error(f"--append: {args.json} holds runs of {prev.get('steps')} steps, not {steps} (--steps)")
            before = prev["runs"] + prev["failed_runs"]
    results = []
    with tempfile.TemporaryDirectory(prefix="bidirl-bench-") as tmp_s:
        tmp = Path(args.keep) if args.keep else Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        for n in names:
            results.append(run_workload(n, args.pairs, args.extra, tmp, before, args.steps))
            out = results[0] if len(results) == 1 and args.workload != "all" else {"workloads": results}
            write_json(args.json, out)  # after each workload: nothing lost
    print_table(results)
    print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(not r["failed_runs"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
