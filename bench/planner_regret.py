"""Planner regret, prediction error and speed, measured against the simulator.

BENCHMARKS.md, "Planner regret and speed". The latest run (the grid and the first random set;
``--seed 1`` / ``--seed 2`` draw the two held-out random sets):

    .venv/bin/python -m bench.planner_regret --seeds 3 --no-gains --seed 0 \
        --out bench/results/planner_regret_fill_seed0.json --cache CACHE.json
    .venv/bin/python -m bench.planner_regret --quick      # a few minutes
    .venv/bin/python -m bench.planner_regret --speed      # planner time, ``default`` at 256 devices

Per scenario (the paper grid and ``--random`` seeded random clusters): plan it; simulate
``bidirl`` on every compatible envelope (``--max-envelopes K``: the K best plus the best of every
split); regret = (best simulated - the pick's) / best, for the planner's pick and ``bidirl
plan``'s confirmed pick (``--confirm K``); prediction error. Without ``--no-gains`` grid scenarios
also separate the two gains (async and bidirl on the half split, async on its best, bidirl on the
planner's). Simulations are cached in ``--cache``, keyed by a hash of the simulator's code, so a
run resumes and a planner-only change re-scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

from bench.measure import RESULTS, write_json
from bidirl.planner.envelope import Envelope, envelope_of
from bidirl.planner.plan import PlanError, plan, scenario_with_envelope
from bidirl.sim.confirm import DEFAULT_K, confirm
from bidirl.sim.grid import half_split, paper_grid
from bidirl.sim.scenario import ResponseLength, Scenario, Workload

RANDOM_HARDWARE = ("A6000-48GB", "H100-80GB", "H200-141GB", "A100-80GB")
RANDOM_MODELS = ("Qwen3-4B", "Qwen3-8B", "Qwen2.5-7B", "Qwen3-14B", "Qwen3-32B")
RANDOM_DEVICES = (6, 10, 12, 14, 20, 24, 28, 36, 40, 48)
SEED_STRIDE = 7919  # seeds of one scenario's repetitions: sc.seed, sc.seed + 7919, ...
SIM_PACKAGES = ("policy", "sim", "controller", "perf", "core", "frame")  # what a simulated run executes
# and, of the planner, only the modules the simulator imports (planner.compat.split_fit sizes
# its memory): the planner's prediction (predict, pipeline, stages, plan) is not simulated,
# so a change to it re-scores cached runs instead of re-simulating them
NOT_SIMULATED = ("sim/confirm.py",)  # in those packages, but a client of the simulator, not run by it


def _imported_by_simulator() -> tuple[Path, list[Path]]:
    """The ``bidirl`` package this interpreter imports and the source files that importing
    the simulator loads (a fresh interpreter: this one has imported the planner)."""
    import subprocess

    code = ("import sys, bidirl, bidirl.sim.run, bidirl.sim.scenario; print(bidirl.__file__); "
            "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items()) "
            "if n.startswith('bidirl.') and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, *files = out.stdout.split()
    return Path(first).resolve().parent, [Path(f).resolve() for f in files]


def sim_code_version() -> str:
    """A short hash of the simulator's and policies' source: cached runs of other code are stale."""
    src, imported = _imported_by_simulator()
    files = {f.resolve() for pkg in SIM_PACKAGES for f in (src / pkg).rglob("*.py")
             if str(f.relative_to(src)) not in NOT_SIMULATED} | set(imported)
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def random_scenarios(n: int, seed: int, steps: int) -> list[Scenario]:
    """``n`` varied scenarios; devices mostly not powers of two, staleness 1..4."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        i = len(out)
        max_len = rng.choice((2048, 4096, 6144, 8192, 12288, 16384, 24576))
        dist = rng.choice(("lognormal", "lognormal", "uniform", "constant"))
        rl = ResponseLength(dist, median=max(16, int(max_len * rng.uniform(0.1, 0.4))),
                            sigma=rng.uniform(0.4, 1.2), min=16, max=max_len)
        w = Workload(prompts_per_step=rng.choice((32, 48, 64, 96, 128)),
                     group_size=rng.choice((4, 8, 16)),
                     prompt_tokens=rng.choice((128, 256, 512, 1024)), response_length=rl)
        devices = rng.choice(RANDOM_DEVICES)
        sc = Scenario(name=f"rand{i:02d}", hardware=rng.choice(RANDOM_HARDWARE),
                      devices=devices, model=rng.choice(RANDOM_MODELS),
                      staleness=rng.randint(1, 4), steps=steps, seed=seed + i, workload=w,
                      pools=half_split(devices))
        sc = sc.replace(description=(f"{sc.hardware} x{devices}, {sc.model}, {dist} max "
                                     f"{max_len}, s={sc.staleness}"))
        try:
            plan(sc, top_k=1)
        except PlanError:
            continue  # a model too large for the budget: not a regret case
        out.append(sc)
    return out


class SimCache:
    """Simulated throughputs, persisted so an interrupted run resumes."""

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.version = sim_code_version()  # fixed at start: the code this process imported
        self.data: dict[str, dict] = {}
        if path.exists() and not fresh:
            prefix = self.version + "|"
            self.data = {k: v for k, v in json.loads(path.read_text()).items()
                         if k.startswith(prefix)}  # other code versions are stale
        self.sims = 0
        self.sim_s = 0.0

    def run(self, sc: Scenario, env: Envelope, policy: str, steps: int, seeds: int = 1) -> dict:
        """Simulated figures of one envelope, averaged over ``seeds`` response-length seeds."""
        runs = [self._run_one(sc, env, policy, steps, sc.seed + SEED_STRIDE * j) for j in range(seeds)]
        if seeds == 1:
            return runs[0]
        return {"tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in runs),
                "step_s": statistics.fmean(r["step_s"] for r in runs),
                "tokens_per_s_seeds": [r["tokens_per_s"] for r in runs]}

    def tokens_per_s(self, sc: Scenario, env: Envelope, steps: int, seed: int) -> float:
        """One ``bidirl`` run's tokens/s with length seed ``seed`` (``confirm``'s runner)."""
        return self._run_one(sc, env, "bidirl", steps, seed)["tokens_per_s"]

    def _run_one(self, sc: Scenario, env: Envelope, policy: str, steps: int, seed: int) -> dict:
        key = f"{self.version}|{sc.name}|{seed}|{env.key()}|{policy}|{steps}"
        if key not in self.data:
            from bidirl.sim.run import simulate

            t0 = time.perf_counter()
            res = simulate(scenario_with_envelope(sc, env), policy, steps=steps, seed=seed,
                           record_intervals=False)
            self.sim_s += time.perf_counter() - t0
            self.sims += 1
            self.data[key] = {"tokens_per_s": res.throughput_tokens_per_s,
                              "step_s": res.mean_step_time_s, "borrows": res.borrows}
            if self.sims % 20 == 0:
                self.save()
        return self.data[key]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data))


def oracle_set(result, max_envelopes: int | None) -> list:
    """Candidates the oracle simulates: all, or the top K plus the best of every split."""
    cands = result.candidates
    if not max_envelopes or len(cands) <= max_envelopes:
        return cands
    chosen = {c.envelope.key(): c for c in cands[:max_envelopes]}
    for c in cands:  # best predicted layout of every rollout/train split
        chosen.setdefault(("split", c.envelope.rollout_devices), c)
    return list(dict.fromkeys(chosen.values()))


def seed_oracle_regret(sims: dict) -> float | None:
    """The noise floor: regret of the envelope best on the first seed alone, scored on the
    other seeds' mean (what a perfect predictor of one sampled run would lose)."""
    seeds = {k: r.get("tokens_per_s_seeds") for k, (_, r) in sims.items()}
    if any(v is None or len(v) < 2 for v in seeds.values()):
        return None
    held = {k: statistics.fmean(v[1:]) for k, v in seeds.items()}
    first = max(seeds, key=lambda k: seeds[k][0])
    best = max(held.values())
    return (best - held[first]) / best


def evaluate_scenario(sc: Scenario, cache: SimCache, steps: int, max_envelopes: int | None,
                      gains: bool, log, kind: str = "grid", seeds: int = 1,
                      confirm_k: int = DEFAULT_K) -> dict:
    result = plan(sc, top_k=5, steps=steps)
    pick = result.envelope
    confirmed = confirm(sc, result, k=confirm_k, steps=steps, runner=cache.tokens_per_s)
    oracle = oracle_set(result, max_envelopes)
    if confirmed.envelope.key() not in {c.envelope.key() for c in oracle}:
        oracle = oracle + [next(c for c in result.candidates
                                if c.envelope.key() == confirmed.envelope.key())]
    sims = {}
    for i, c in enumerate(oracle):
        sims[c.envelope.key()] = (c, cache.run(sc, c.envelope, "bidirl", steps, seeds))
        log(f"  {sc.name}: {i + 1}/{len(oracle)} envelopes simulated")
    conf_got = sims[confirmed.envelope.key()][1]["tokens_per_s"]
    best_key = max(sims, key=lambda k: sims[k][1]["tokens_per_s"])
    best = sims[best_key][1]["tokens_per_s"]
    got = sims[pick.key()][1]["tokens_per_s"]
    pred = result.predicted_tokens_per_s
    errors = [abs(c.prediction.tokens_per_s - r["tokens_per_s"]) / r["tokens_per_s"]
              for c, r in sims.values()]
    ranked = [c.envelope.key() for c in result.candidates]
    row = {
        "scenario": sc.name, "set": kind, "description": sc.description, "devices": sc.devices,
        # where the best simulated envelope sits in the planner's ranking (0 = the pick)
        "best_predicted_rank": ranked.index(best_key),
        "pick": pick.to_json(), "pick_label": pick.label(),
        "best_label": sims[best_key][0].envelope.label(),
        "predicted_tokens_per_s": pred, "simulated_pick_tokens_per_s": got,
        "simulated_best_tokens_per_s": best, "regret": (best - got) / best,
        "prediction_error": abs(pred - got) / got, "envelopes_simulated": len(sims),
        "compatible": result.compatible, "median_prediction_error_all": statistics.median(errors),
        # every simulated envelope: [predicted, simulated] tokens/s (for the plot)
        "envelopes": [[round(c.prediction.tokens_per_s, 1), round(r["tokens_per_s"], 1)]
                      for c, r in sims.values()],
        "regime": result.prediction.regime, "borrowed": result.prediction.borrowed,
        # the pick of ``bidirl plan`` (the best simulated of the planner's short list)
        "confirmed_pick_label": confirmed.envelope.label(),
        "confirmed_regret": (best - conf_got) / best,
        "confirmed_prediction_error": abs(confirmed.predicted_tokens_per_s - conf_got) / conf_got,
        "confirmed": confirmed.confirmed,
        "seed_oracle_regret": seed_oracle_regret(sims),
    }
    half = envelope_of(sc.replace(pools=half_split(sc.devices)))
    if gains and not half_fits(sc, half):
        row["gains_skipped"] = "the half/half split does not fit in memory (sim.world.build refuses it)"
        gains = False
    if gains:
        row["gains"] = {
            "async_half": cache.run(sc, half, "async", steps, seeds)["tokens_per_s"],
            "bidirl_half": cache.run(sc, half, "bidirl", steps, seeds)["tokens_per_s"],
            "async_best": max(cache.run(sc, c.envelope, "async", steps, seeds)["tokens_per_s"]
                              for c in oracle),
            "bidirl_planner": got,
        }
    return row


def half_fits(sc: Scenario, half: Envelope) -> bool:
    """The memory model the simulator refuses a split by (``planner.compat.split_fit``)."""
    from bidirl.planner.compat import split_fit
    from bidirl.planner.context import PlanContext

    return split_fit(PlanContext.from_scenario(sc), half).refusal is None


GAIN_RATIOS = {  # name -> (numerator, denominator) of the "separate the two gains" table
    "runtime borrowing (bidirl / async, half split)": ("bidirl_half", "async_half"),
    "planner (bidirl on its split / on half split)": ("bidirl_planner", "bidirl_half"),
    "bidirl on its split / async on its best split": ("bidirl_planner", "async_best"),
    "bidirl on its split / async on half split": ("bidirl_planner", "async_half"),
}


def summarize(rows: list[dict]) -> dict:
    def stats(key: str, subset: list[dict]) -> dict:
        vals = [r[key] for r in subset if r.get(key) is not None]
        return {"median": statistics.median(vals), "max": max(vals), "n": len(vals)} if vals else {}

    out = {}
    for name, subset in (("grid", [r for r in rows if r["set"] == "grid"]),
                         ("random", [r for r in rows if r["set"] == "random"]), ("all", rows)):
        gains = [r["gains"] for r in subset if "gains" in r]
        out[name + "_gains"] = {k: {"median": statistics.median(g[n] / g[d] for g in gains),
                                    "min": min(g[n] / g[d] for g in gains),
                                    "max": max(g[n] / g[d] for g in gains)}
                                for k, (n, d) in GAIN_RATIOS.items()} if gains else {}
        out[name] = {"regret": stats("regret", subset),
                     "confirmed_regret": stats("confirmed_regret", subset),
                     "prediction_error": stats("prediction_error", subset),
                     "prediction_error_all_envelopes": stats("median_prediction_error_all",
                                                             subset),
                     "seed_oracle_regret": stats("seed_oracle_regret", subset)}
    return out


def print_table(rows: list[dict], summary: dict) -> None:
    print(f"{'scenario':34} {'pick':44} {'pred':>9} {'sim':>9} {'best':>9} "
          f"{'regret':>7} {'err':>6} {'n':>4}")
    for r in rows:
        print(f"{r['scenario']:34} {r['pick_label']:44} {r['predicted_tokens_per_s']:9.0f} "
              f"{r['simulated_pick_tokens_per_s']:9.0f} {r['simulated_best_tokens_per_s']:9.0f} "
              f"{r['regret']:7.1%} {r['prediction_error']:6.1%} {r['envelopes_simulated']:4d}")
    grid = [r for r in rows if "gains" in r]
    ranks = [r["best_predicted_rank"] for r in rows]
    print(f"best simulated envelope's rank in the planner's order: max {max(ranks)}, "
          f"median {statistics.median(ranks)}")
    if grid:
        print(f"\n{'separate the two gains':34} {'async half':>11} {'bidirl half':>12} "
              f"{'async best':>11} {'bidirl plan':>12} {'runtime':>8} {'planner':>8}")
        for r in grid:
            g = r["gains"]
            print(f"{r['scenario']:34} {g['async_half']:11.0f} {g['bidirl_half']:12.0f} "
                  f"{g['async_best']:11.0f} {g['bidirl_planner']:12.0f} "
                  f"{g['bidirl_half'] / g['async_half']:7.2f}x "
                  f"{g['bidirl_planner'] / g['bidirl_half']:7.2f}x")
        for name, (num, den) in GAIN_RATIOS.items():
            vals = [r["gains"][num] / r["gains"][den] for r in grid]
            print(f"{name:44} median {statistics.median(vals):.2f}x, min {min(vals):.2f}x, "
                  f"max {max(vals):.2f}x")
    for name, s in summary.items():
        if s.get("regret"):
            print(f"{name:7} regret median {s['regret']['median']:.2%} max {s['regret']['max']:.2%}"
                  f" | pick prediction error median {s['prediction_error']['median']:.2%} max "
                  f"{s['prediction_error']['max']:.2%} | all envelopes median "
                  f"{s['prediction_error_all_envelopes']['median']:.2%} (n={s['regret']['n']})")
            if s.get("confirmed_regret"):
                c = s["confirmed_regret"]
                print(f"{'':7} confirmed (the best simulated of the planner's short list): regret "
                      f"median {c['median']:.2%} max {c['max']:.2%}")
            if s["seed_oracle_regret"]:
                print(f"{'':7} noise floor (best on one seed, scored on the others): median "
                      f"{s['seed_oracle_regret']['median']:.2%} max {s['seed_oracle_regret']['max']:.2%}")


def plot(rows: list[dict], path: Path, label: str) -> None:
    """Regret per scenario (sorted, with the 2 % and 8 % targets) and predicted against
    simulated throughput for every simulated envelope, each scaled by its scenario's best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for kind, color in (("grid", "tab:blue"), ("random", "tab:orange")):
        sub = sorted((r for r in rows if r["set"] == kind), key=lambda r: r["regret"])
        ax1.plot(range(len(sub)), [100 * r["regret"] for r in sub], "o-", ms=3, color=color,
                 label=f"{kind} ({len(sub)}), the planner's pick")
        conf = sorted(r["confirmed_regret"] for r in rows
                      if r["set"] == kind and r.get("confirmed_regret") is not None)
        if conf:
            ax1.plot(range(len(conf)), [100 * v for v in conf], "s--", ms=3, color=color,
                     alpha=0.6, label=f"{kind}, confirmed by simulation")
        xs, ys = [], []
        for r in rows:
            if r["set"] != kind:
                continue
            best = r["simulated_best_tokens_per_s"]
            for pred, sim in r.get("envelopes", []):
                xs.append(sim / best)
                ys.append(pred / best)
        ax2.scatter(xs, ys, s=4, alpha=0.35, color=color, label=kind)
    for y, style in ((2, ":"), (8, "--")):
        ax1.axhline(y, color="grey", ls=style, lw=1)
    ax1.set(xlabel="scenarios, sorted", ylabel="regret of the pick (%)",
            title=f"planner regret ({label})")
    ax1.legend()
    ax2.plot([0, 1.3], [0, 1.3], color="grey", lw=1)
    ax2.set(xlim=(0, 1.3), ylim=(0, 1.3), xlabel="simulated / best simulated",
            ylabel="predicted / best simulated", title="every compatible envelope")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def speed(devices: int = 256, repeats: int = 3) -> dict:
    from bidirl.sim.scenario import load

    out = {}
    for name in ("default",):
        sc = load(name).replace(devices=devices)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = plan(sc)
            times.append(time.perf_counter() - t0)
        out[f"{name}@{devices}"] = {"seconds_min": min(times), "seconds_median":
                                    statistics.median(times), "evaluated": res.evaluated,
                                    "compatible": res.compatible}
        print(f"plan {name} at {devices} devices: {min(times):.3f} s (min of {repeats}), "
              f"{res.evaluated} envelopes, {res.compatible} compatible")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 grid + 6 random scenarios, 12 best envelopes each")
    ap.add_argument("--steps", type=int, default=8, help="simulated steps per run")
    ap.add_argument("--random", type=int, default=30, help="random scenarios")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-envelopes", type=int, default=None,
                    help="simulate only the K best predicted + the best of every split")
    ap.add_argument("--seeds", type=int, default=1,
                    help="simulate every envelope with K length seeds and score their mean")
    ap.add_argument("--no-gains", action="store_true", help="skip the async comparisons")
    ap.add_argument("--confirm", type=int, default=DEFAULT_K,
                    help="score also bidirl plan's pick: the best simulated of at most K envelopes "
                    f"predicted within 5%% of the best (default {DEFAULT_K}); 0: the planner alone")
    ap.add_argument("--speed", action="store_true", help="only time the planner")
    ap.add_argument("--fresh", action="store_true", help="ignore cached simulations")
    ap.add_argument("--out", type=Path, default=RESULTS / "planner_regret.json")
    ap.add_argument("--cache", type=Path, default=RESULTS / "planner_regret.cache.json",
                    help="simulated runs, reused across runs of the same simulator code")
    args = ap.parse_args(argv)
    if args.speed:
        speed()
        return 0
    grid = paper_grid(steps=args.steps)
    rand = random_scenarios(args.random, 1000 + args.seed, args.steps)
    if args.quick:
        grid, rand = grid[::5], rand[:6]
        args.max_envelopes = args.max_envelopes or 12
    cache = SimCache(args.cache, args.fresh)
    rows, t0 = [], time.perf_counter()
    scenarios = ([(sc, not args.no_gains, "grid") for sc in grid]
                 + [(sc, False, "random") for sc in rand])

    def log(msg: str) -> None:
        print(f"\r[{len(rows) + 1}/{len(scenarios)} {time.perf_counter() - t0:6.0f} s] {msg}"
              + " " * 10, end="", file=sys.stderr, flush=True)

    for sc, gains, kind in scenarios:
        rows.append(evaluate_scenario(sc, cache, args.steps, args.max_envelopes, gains, log, kind,
                                       args.seeds, args.confirm))
        cache.save()
    print(file=sys.stderr)
    summary = summarize(rows)
    print_table(rows, summary)
    report = {"command": " ".join(["python -m bench.planner_regret", *(argv or sys.argv[1:])]),
              "sim_code_version": cache.version,
              "steps": args.steps, "seeds": args.seeds, "max_envelopes": args.max_envelopes,
              "confirm": args.confirm,
              "wall_s": time.perf_counter() - t0, "simulations": cache.sims,
              "simulation_s": cache.sim_s, "summary": summary, "speed": speed(),
              "rows": rows}
    write_json(args.out, report)
    plot(rows, args.out.with_suffix(".png"), f"{args.steps} steps, {args.seeds} seed(s)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
