"""How far a real run's stage models are from what their measurements allow.

BENCHMARKS.md, "Stage-model errors". The latest replay, of the runs of the latest
``bench.real_policies`` series (kept with ``--keep RUNS``):

    .venv/bin/python -m bench.stage_model_errors RUNS/*/*-0[0-4]-* --json bench/results/stage_model_errors_1204eve.json

Replays each run's measurements (``RUN_DIR/profile.jsonl``, in the order the scheduler saw
them) through a fresh ``controller.estimates.Estimates`` built from the run's own config,
and prints per stage:

- ``online``: the median out-of-sample error, as the run reported it (the replay
  reproduces ``summary.json``'s ``stage_model_median_error``; a mismatch is flagged);
- ``steady``: the same over the second half of the run's measurements (after the cold start);
- ``weight_sync/driver``: the same stage as it was measured before the devices timed the
  weight load (the driver's wall), through a fresh model of the stage: the older
  measurement's errors on the same run;
- ``floor``: the median error of the *best fixed fit* of the same features over the whole
  run, fitted after the fact on every measurement (least squares on relative error): no
  model of this form, however it learns, does much better on these measurements; what is
  left above it is learning (cold start, drift), what is in it is the machine's noise or a
  missing feature.

    .venv/bin/python -m bench.stage_model_errors RUN_DIR [RUN_DIR ...] --json OUT.json

(``python -m bench.real_policies --keep DIR`` keeps the run directories of a benchmark.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from bidirl.controller.estimates import Estimates
from bidirl.runtime.config import load_config
from bidirl.runtime.run_spec import build_spec

PREWARM = "weight_sync/prewarm"


def measurements(run: Path) -> list[tuple[str, tuple[float, ...], float]]:
    """(stage, features, seconds) in the order the run's scheduler observed them."""
    out = []
    for line in (run / "profile.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "StageMeasured" and e["stage"] == "weight_sync":  # start-up's, unscored
            out.append((PREWARM, tuple(e["features"]), e["seconds"]))
        elif e["event"] == "StageMeasured":
            out.append((e["stage"], tuple(e["features"]), e["seconds"]))
        elif e["event"] == "WeightsSynced":  # as ClusterState._on_synced: the devices' load when timed
            out.append(("weight_sync", (1.0,), e["seconds"] if e.get("load_s") is None else e["load_s"]))
    return out


def alternatives(run: Path) -> dict[str, list[tuple[tuple[float, ...], float]]]:
    """The older measurements of the same stages, where the profile keeps them: a weight
    sync as the driver timed it (issue to last replica done) when the devices timed their
    load.  Only their floor is printed: what a fixed fit could do on them, beside what the
    models learn now: ``online`` is a fresh model of the stage (the run's priors) fed those
    measurements instead."""
    out: dict[str, list] = {}
    for line in (run / "profile.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "WeightsSynced" and e.get("load_s") is not None:
            out.setdefault("weight_sync/driver", []).append(((1.0,), e["seconds"]))
    return out


def floor(rows: list[tuple[tuple[float, ...], float]]) -> float | None:
    """Median relative error of the best fixed non-negative fit of these rows (in-sample)."""
    rows = [(x, y) for x, y in rows if y > 0]
    if len(rows) < 2:
        return None
    x = np.array([r[0] for r in rows], float)
    y = np.array([r[1] for r in rows], float)
    a = x / y[:, None]
    free = [j for j in range(x.shape[1]) if np.abs(a[:, j]).sum() > 0]
    theta = np.zeros(x.shape[1])
    while free:  # active set, as perf/calibration.py's fit: drop the most negative, solve again
        u = np.linalg.lstsq(a[:, free], np.ones(len(y)), rcond=None)[0]
        if u.min() >= 0:
            theta[free] = u
            break
        free.pop(int(np.argmin(u)))
    return float(np.median(np.abs(x @ theta - y) / y))


def analyse(run: Path) -> dict:
    cfg = load_config(str(run / "config.yaml"))
    est = Estimates(build_spec(cfg, cfg.run.steps, 12.0))
    rows: dict[str, list] = {}
    errs: dict[str, list[float]] = {}
    for stage, x, s in measurements(run):
        if stage == PREWARM:  # as runtime/launch.py: learned, not scored (no prediction used it)
            est.models["weight_sync"].observe(x, s, scored=False)
            continue
        if stage not in est.models:
            continue
        errs.setdefault(stage, []).append(est.models[stage].observe(x, s))
        rows.setdefault(stage, []).append((x, s))
    reported = {}
    summary = run / "summary.json"
    if summary.is_file():
        reported = json.loads(summary.read_text()).get("stage_model_median_error", {})
    out = {}
    for stage, e in errs.items():
        online = est.models[stage].median_rel_error()
        rep = reported.get(stage)
        out[stage] = {"n": len(e), "online": online, "steady": statistics.median(e[len(e) // 2:]),
                      "floor": floor(rows[stage]),
                      "reported": rep, "replay_matches": rep is None or abs(rep - online) < 1e-9}
    fresh = Estimates(build_spec(cfg, cfg.run.steps, 12.0))  # the priors, for the older measurements
    for stage, rows_ in alternatives(run).items():
        model = fresh.models[stage.split("/")[0]]
        e = [model.observe(x, y) for x, y in rows_ if y > 0]
        out[stage] = {"n": len(rows_), "online": model.median_rel_error(),
                      "steady": statistics.median(e[len(e) // 2:]) if e else None, "floor": floor(rows_),
                      "reported": None, "replay_matches": True}
    return {"run": str(run), "policy": cfg.scheduler.policy, "stages": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories (profile.jsonl, config.yaml)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    results = []
    for r in args.runs:
        run = Path(r)
        if not (run / "profile.jsonl").is_file() or not (run / "config.yaml").is_file():
            ap.error(f"{run}: not a run directory (needs profile.jsonl and config.yaml)")
        results.append(analyse(run))
    print(f"{'run':<28}{'stage':<19}{'n':>5}{'online':>8}{'steady':>8}{'floor':>8}")
    for res in results:
        for stage, f in res["stages"].items():
            flag = "" if f["replay_matches"] else "  (replay != summary)"
            fl, on, st = (("-" if f[k] is None else f"{f[k]:.3f}") for k in ("floor", "online", "steady"))
            print(f"{Path(res['run']).name[:27]:<28}{stage:<19}{f['n']:>5}{on:>8}{st:>8}{fl:>8}{flag}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
