"""The paper's sweep: every policy on the same partition of every grid scenario.

Axes (BiDiRL's evaluation): hardware A6000-48GB and H100-80GB at 32 devices plus a
16-device budget; Qwen3-4B and Qwen3-8B; maximum response length 4k, 8k, 16k; staleness 1
and 2.  All policies of a scenario run on the same committed split (the baseline-aligned
half/half split, as fixed-pool async systems are usually deployed) and the same seed, so
they see the same prompt groups with the same response lengths.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bidirl.sim.result import POLICIES, SimResult
from bidirl.sim.run import simulate as simulate_one
from bidirl.sim.scenario import Pools, ResponseLength, Scenario, TrainLayout, Workload

GRID_AXES = {
    "hardware": ("A6000-48GB", "H100-80GB"),
    "devices": (32, 16),
    "model": ("Qwen3-4B", "Qwen3-8B"),
    "max_len": (4096, 8192, 16384),
    "staleness": (1, 2),
}


def half_split(devices: int) -> Pools:
    """The baseline-aligned split: half the devices roll out, half train (DP over them)."""
    train = devices // 2
    return Pools(rollout_devices=devices - train, train_devices=train, rollout_tp=1,
                 train=TrainLayout(dp=train, tp=1))


def grid_scenario(hardware: str, devices: int, model: str, max_len: int, staleness: int,
                  steps: int = 12, seed: int = 0) -> Scenario:
    """One grid point.  Median response length is a fifth of the maximum (long tail)."""
    name = f"{hardware.split('-')[0].lower()}-{devices}-{model.lower()}-{max_len // 1024}k-s{staleness}"
    return Scenario(
        name=name, hardware=hardware, devices=devices, model=model, staleness=staleness,
        steps=steps, seed=seed,
        description=f"paper grid: {hardware} x{devices}, {model}, max {max_len}, s={staleness}",
        workload=Workload(prompts_per_step=64, group_size=8, prompt_tokens=256,
                          response_length=ResponseLength("lognormal", median=max_len // 5,
                                                         sigma=0.9, min=16, max=max_len)),
        pools=half_split(devices),
    )


def paper_grid(steps: int = 12, seed: int = 0) -> list[Scenario]:
    return [grid_scenario(*combo, steps=steps, seed=seed)
            for combo in itertools.product(*GRID_AXES.values())]


@dataclass
class GridRow:
    scenario: str
    results: dict[str, SimResult]

    def ratio(self, policy: str, baseline: str = "async") -> float:
        return (self.results[policy].throughput_tokens_per_s
                / self.results[baseline].throughput_tokens_per_s)


def run_grid(scenarios: Iterable[Scenario], policies: Iterable[str] = POLICIES,
             simulate: Callable[..., SimResult] = simulate_one,
             progress: Callable[[int, int, str], None] | None = None) -> list[GridRow]:
    scenarios, policies = list(scenarios), list(policies)
    rows, total, done = [], len(scenarios) * len(policies), 0
    for sc in scenarios:
        results = {}
        for pol in policies:
            results[pol] = simulate(sc, pol, record_intervals=False)
            done += 1
            if progress:
                progress(done, total, f"{sc.name} {pol}")
        rows.append(GridRow(sc.name, results))
    return rows


def summarize(rows: list[GridRow], paper_range: tuple[float, float] = (1.05, 1.94)) -> dict:
    """Ratios of bidirl against async and the opportunistic ablation, as the issue asks."""
    r_async = [row.ratio("bidirl") for row in rows if "async" in row.results]
    r_opp = [row.ratio("bidirl", "bidirl-opportunistic") for row in rows
             if "bidirl-opportunistic" in row.results]
    out = {"scenarios": len(rows), "paper_bidirl_over_baselines": list(paper_range)}
    for key, ratios in (("bidirl_over_async", r_async), ("bidirl_over_opportunistic", r_opp)):
        if ratios:
            out[key] = {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
    if r_async:
        out["bidirl_ge_0.99_async_everywhere"] = min(r_async) >= 0.99
    return out


def format_table(rows: list[GridRow], policies: Iterable[str] = POLICIES) -> str:
    """Throughput ratio against ``async`` per policy, and bidirl's efficiency."""
    policies = [p for p in policies if rows and p in rows[0].results]
    width = max([len(r.scenario) for r in rows] + [8])
    head = f"{'scenario':<{width}} " + " ".join(f"{p[:12]:>12}" for p in policies) + "   eff(bidirl)"
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = " ".join(f"{row.ratio(p):>12.3f}" for p in policies)
        eff = row.results["bidirl"].efficiency if "bidirl" in row.results else float("nan")
        lines.append(f"{row.scenario:<{width}} {cells}   {eff:>11.3f}")
    return "\n".join(lines)
