"""Every pair of one or more ``bench.real_policies`` series side by side, against the targets.

BENCHMARKS.md, "Real workloads: bidirl against async" (its plot):

    .venv/bin/python -m bench.efficiency_plot bench/results/real_policies_*_1203night.json \
        bench/results/real_policies_*_1204.json bench/results/real_policies_*_1204pm.json \
        bench/results/real_policies_*_1204eve.json \
        --png bench/results/efficiency_pairs_1204eve.png --json bench/results/efficiency_pairs_1204eve.json

Per workload, each pair's ``bidirl`` / ``async`` ratio and efficiency, and the efficiency's two
factors (``own``: against its own busy time's bound; ``work``: its busy time over async's), one
column of dots per series, the median as a bar, the targets dashed. Prints and writes the
medians. ``LABEL=FILE`` or ``FILE`` (labelled by its name after the workload: ``..._warm.json``
-> ``warm``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.measure import write_json
from bench.real_policies import WORKLOADS as _DEFINED  # the workloads the series are of
from bench.real_policies import complete_pairs, efficiency_split

WORKLOADS = tuple(_DEFINED)
RATIO_TARGET = {"balanced": 1.05}  # every other workload: DEFAULT_RATIO_TARGET
DEFAULT_RATIO_TARGET = 1.20
EFFICIENCY_TARGET = 0.9


def pairs_of(workload: dict) -> list[tuple[float, float]]:
    """(bidirl / async, bidirl over the pair's async bound) for every complete pair, as
    ``bench.real_policies`` summarised them (``ratios``, ``efficiency_per_pair``)."""
    return list(zip(workload["ratios"], _efficiencies(workload), strict=True))


def _efficiencies(workload: dict) -> list[float]:
    return workload.get("policies", {}).get("bidirl", {}).get("efficiency_per_pair") or []


def split_of(workload: dict) -> tuple[list[float], list[float]]:
    """(bidirl over its own bound, bidirl's work over async's) for every complete pair: as
    ``bench.real_policies`` summarised them, or, for a result written before it did, from
    its runs (``tokens_per_s`` and ``ideal_tokens_per_s`` of each pair's two runs)."""
    if "bidirl_own_efficiency_per_pair" in workload:
        return workload["bidirl_own_efficiency_per_pair"], workload["bidirl_work_over_async_per_pair"]
    return efficiency_split(complete_pairs(workload.get("runs", [])))


def load(spec: str) -> tuple[str, list[dict]]:
    """``LABEL=FILE`` or ``FILE``: the series' label and its workloads."""
    label, _, name = spec.rpartition("=")
    path = Path(name)
    if not path.is_file():
        raise SystemExit(f"efficiency_plot: {path}: no such file")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"efficiency_plot: {path}: not JSON ({e})") from None
    workloads = d.get("workloads", [d]) if isinstance(d, dict) else None
    if not workloads or any(not isinstance(w, dict) or w.get("workload") not in WORKLOADS
                            or not isinstance(w.get("ratios"), list) for w in workloads):
        raise SystemExit(f"efficiency_plot: {path}: not a bench.real_policies result "
                         f"(each needs 'workload' in {', '.join(WORKLOADS)}, 'ratios' and "
                         "'policies.bidirl.efficiency_per_pair')")
    for w in workloads:
        effs = _efficiencies(w)
        if len(effs) != len(w["ratios"]):
            raise SystemExit(f"efficiency_plot: {path}: {w['workload']} has {len(w['ratios'])} ratios but "
                             f"{len(effs)} efficiencies (policies.bidirl.efficiency_per_pair): one per pair")
    if not label:
        stem = path.stem.removeprefix("real_policies")
        for w in WORKLOADS:
            stem = stem.replace(w, "")
        label = stem.strip("_-") or path.stem
    return label, workloads


def summarise(series: list[tuple[str, list[dict]]]) -> dict:
    """{workload: {label: {pairs, ratios, efficiencies, median_ratio, median_efficiency}}}."""
    out: dict[str, dict] = {}
    for label, workloads in series:
        for w in workloads:
            ps = pairs_of(w)
            if not ps:
                continue
            entry = out.setdefault(w["workload"], {}).setdefault(
                label, {"ratios": [], "efficiencies": [], "own_efficiencies": [], "work_over_async": []})
            entry["ratios"] += [r for r, _ in ps]
            entry["efficiencies"] += [e for _, e in ps]
            own, work = split_of(w)
            if len(own) == len(ps):  # else a result without its runs: no split for it
                entry["own_efficiencies"] += own
                entry["work_over_async"] += work
    for per in out.values():
        for e in per.values():
            e["pairs"] = len(e["ratios"])
            e["median_ratio"] = statistics.median(e["ratios"])
            e["median_efficiency"] = statistics.median(e["efficiencies"])
            e["median_own_efficiency"] = statistics.median(e["own_efficiencies"]) if e["own_efficiencies"] else None
            e["median_work_over_async"] = statistics.median(e["work_over_async"]) if e["work_over_async"] else None
    return out


def plot(summary: dict, labels: list[str], png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [w for w in WORKLOADS if w in summary]
    rows = (("ratios", "bidirl / async (per pair)"), ("efficiencies", "efficiency vs the pair's bound"),
            ("own_efficiencies", "... vs its own busy time's bound"),
            ("work_over_async", "its busy time / async's (same work)"))
    fig = Figure(figsize=(3.2 * len(names) + 1, 3.4 * len(rows)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), len(names), squeeze=False)
    for j, w in enumerate(names):
        targets = (RATIO_TARGET.get(w, DEFAULT_RATIO_TARGET), EFFICIENCY_TARGET, EFFICIENCY_TARGET, 1.0)
        for row, ((key, ylabel), target) in enumerate(zip(rows, targets, strict=True)):
            ax = axes[row][j]
            for i, label in enumerate(labels):
                e = summary[w].get(label)
                if e is None or not e[key]:
                    continue
                ys = e[key]
                # one colour per series, the same in every panel
                ax.scatter([i] * len(ys), ys, s=18, alpha=0.7, color=f"C{i % 10}")
                ax.hlines(statistics.median(ys), i - 0.3, i + 0.3, colors="black", lw=2)
            ax.axhline(target, ls="--", color="tab:red", lw=1)
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, fontsize=8)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(w, fontsize=10)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=9)
    fig.suptitle("bench.real_policies: every pair (dots), the median (bar), the target (dashed; 1.0: no "
                 "extra work)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series", nargs="+", help="LABEL=FILE or FILE: bench.real_policies results")
    ap.add_argument("--png", default="bench/results/efficiency_pairs.png")
    ap.add_argument("--json", default="bench/results/efficiency_pairs.json")
    args = ap.parse_args(argv)
    loaded = [load(s) for s in args.series]
    labels = list(dict.fromkeys(label for label, _ in loaded))
    summary = summarise(loaded)
    if not summary:
        raise SystemExit("efficiency_plot: no complete async/bidirl pair in the files given")
    print(f"{'workload':<15}{'series':<14}{'pairs':>6}{'ratio':>8}{'eff':>7}{'own':>7}{'work':>7}"
          "   (eff = own / work per pair; medians)")

    def f3(x) -> str:
        return "-" if x is None else f"{x:.3f}"

    for w in WORKLOADS:
        for label in labels:
            e = summary.get(w, {}).get(label)
            if e:
                print(f"{w:<15}{label:<14}{e['pairs']:>6}{e['median_ratio']:>8.3f}{e['median_efficiency']:>7.3f}"
                      f"{f3(e['median_own_efficiency']):>7}{f3(e['median_work_over_async']):>7}")
    write_json(args.json, summary)
    plot(summary, labels, Path(args.png))
    print(f"wrote {args.json} and {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
