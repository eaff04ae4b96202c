"""Summarise probe records: per run and role, where a micro-batch's wall time went.

    python bench/microbatch_probe/analyse.py OUT_DIR [OUT_DIR ...] [--json FILE]

OUT_DIR is what ``run_pair.sh`` wrote (``probe/mb-*.jsonl`` and the run directories).  Per
run (the records between its ``config.yaml`` and ``summary.json``) and role, over
micro-batches of >= 500 tokens, min/median/max of: wall and thread CPU per real token, CPU
per *padded* token (samples x longest sequence), padded / real tokens, run-queue wait and
blocked time (wall - CPU - wait) per token, minor faults, system CPU, migrations,
involuntary switches, GC seconds, and the CPU of the process's other threads.  Wall = CPU
means no waiting (no GIL, lock, OpenMP or run-queue wait); CPU per padded token flat while
CPU per real token scatters means the scatter is the padding.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path


def _q(v: list[float]) -> list[float] | None:
    v = sorted(v)
    return [round(v[0], 3), round(statistics.median(v), 3), round(v[-1], 3)] if v else None


def _runs(out: Path) -> list[tuple[str, list[dict]]]:
    """Each run directory's records: those between its ``config.yaml`` and its ``summary.json``."""
    recs = sorted((json.loads(line) for f in glob.glob(str(out / "probe/*.jsonl")) for line in open(f)),
                  key=lambda r: r["t"])
    runs = []
    for d in sorted(Path(p) for p in glob.glob(str(out / "*-00-*/"))):
        if not (d / "summary.json").exists():
            continue
        t0, t1 = (d / "config.yaml").stat().st_mtime, (d / "summary.json").stat().st_mtime
        runs.append((t0, d.name, [r for r in recs if t0 <= r["t"] <= t1]))
    return [(name, rs) for _, name, rs in sorted(runs)]


def summarise(rs: list[dict]) -> dict:
    per = lambda k, den="tokens": [1000 * r[k] / r[den] for r in rs]  # noqa: E731
    return {"n": len(rs), "wall_ms_per_token": _q(per("wall")), "cpu_ms_per_token": _q(per("run")),
            "cpu_ms_per_padded_token": _q(per("run", "padded")) if all(r.get("padded") for r in rs) else None,
            "padded_over_real": _q([r["padded"] / r["tokens"] for r in rs]) if all(r.get("padded") for r in rs)
            else None,
            "runqueue_wait_ms_per_token": _q(per("wait")),
            "blocked_ms_per_token": _q([1000 * (r["wall"] - r["run"] - r["wait"]) / r["tokens"] for r in rs]),
            "system_cpu_ms_per_token": _q(per("stime")), "minor_faults": _q([r["minflt"] for r in rs]),
            "migrations": _q([r["migr"] for r in rs]), "involuntary_switches": _q([r["invol"] for r in rs]),
            "gc_s": _q([r["gc_s"] for r in rs]), "other_threads_cpu_s": _q([r["others_s"] for r in rs]),
            "torch_threads": sorted({r["torch_threads"] for r in rs}),
            "affinity": sorted({tuple(r["affinity"]) for r in rs})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outs", nargs="+")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    table = {}
    for out in a.outs:
        for name, rs in _runs(Path(out)):
            for role in sorted({r["role"] for r in rs}):
                s = summarise([r for r in rs if r["role"] == role and r["tokens"] >= 500])
                if not s["n"]:
                    continue
                table[f"{Path(out).name}/{name}/{role}"] = s
                f = lambda k, s=s: "-" if s[k] is None else "/".join(f"{x:.2f}" for x in s[k])  # noqa: E731
                print(f"{Path(out).name:8s} {name:24s} {role:20s} n={s['n']:3d} wall {f('wall_ms_per_token')} "
                      f"cpu {f('cpu_ms_per_token')} cpu/padded {f('cpu_ms_per_padded_token')} "
                      f"padded/real {f('padded_over_real')} runq {f('runqueue_wait_ms_per_token')} "
                      f"blocked {f('blocked_ms_per_token')} gc {f('gc_s')} others {f('other_threads_cpu_s')}")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
