"""How much slower each device's work runs while the other device is busy, and what that does to the bound.

``bench/real_policies.py`` scores a policy against the ideal packing bound: the run's trained
tokens over (busy device-seconds / devices), with the busy seconds measured on the pair's
``async`` run, i.e. that work packed on every device with no bubble.  On a machine where the
"devices" share CPU cores (or memory bandwidth), a device's work runs slower while the other
device is also busy: decode steps and training micro-batches take longer beside each other than
alone.  The ``async`` run does much of its work with the other device idle, so its busy seconds
undercount what the same work costs once packed, and the bound is unreachable by that much.

For every run directory (``summary.json`` + ``profile.jsonl`` + ``trace.json``) this measures:

* decode ms per step by mean batch (``round(tokens / steps)``), for the chunks that ran with the
  *other* device busy (a non-idle span on its trace row covers >= 90 % of the chunk) against those
  that ran with it idle (<= 10 %); the slowdown per batch size is median(busy-other) /
  median(alone), and one weighted figure over batch sizes with at least ``--min-chunks`` chunks on
  each side (weight = the steps of those chunks, both sides);
* the same for ``train_micro`` seconds per token (other device busy against idle), when both sides
  have enough micro-batches;
* for ``async`` runs, a contention-corrected bound: each device's busy seconds that ran alone are
  scaled by that device's slowdown (decode for the rollout device, train_micro for the trainer),
  i.e. what they would have cost packed beside the other device's work; bound = tokens /
  (corrected busy seconds / devices).  A device whose slowdown cannot be measured is not scaled
  (it is flagged in the table).

A chunk is attributed to the device whose trace row runs the stage's role at the time (rollout
for decode, train / aux_train for train_micro); a chunk that two devices could have run (both
rolling out, as in ``bidirl`` runs that borrow the trainer) is left out.  For every pair (the
``-async`` and ``-bidirl`` directories with the same prefix) it prints the ``bidirl`` run's
measured throughput over the ``async`` run's bound, uncorrected and corrected.

    .venv/bin/python bench/contention.py /tmp/s6/runs --json OUT.json
    .venv/bin/python bench/contention.py RUN_A-async RUN_A-bidirl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

BUSY_OTHER = 0.9  # overlap with the other device's busy spans at or above which a chunk ran beside it
ALONE = 0.1  # overlap at or below which a chunk ran alone
MIN_CHUNKS = 5  # per side, for a batch size (or the train figure) to count
TIDS = {1: 0, 2: 1}  # trace row (tid) -> device
STAGE_ROLES = {"decode": ("rollout",), "train_micro": ("train", "aux_train")}
DEVICE_STAGE = {0: "decode", 1: "train_micro"}  # whose slowdown scales a device's alone seconds
POLICY_SUFFIX = re.compile(r"^(?P<prefix>.+)-(?P<policy>async|bidirl)$")


class RunDataError(ValueError):
    """A run directory lacks a file this needs, or has one that cannot be read."""


@dataclass(frozen=True)
class Span:
    start: float  # seconds, run-loop clock
    end: float
    role: str  # rollout / train / aux_train / "" (unknown)
    idle: bool


@dataclass(frozen=True)
class Sample:
    device: int
    key: int | None  # mean batch for decode, None for train_micro
    value: float  # ms per decode step, or seconds per trained token
    weight: float  # steps (decode) or tokens (train_micro)
    other_busy: float  # fraction of the chunk the other device was busy


def _read_json(path: Path) -> object:
    """``path`` parsed, or a :class:`RunDataError` naming it."""
    if not path.is_file():
        raise RunDataError(f"{path.parent}: no {path.name}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunDataError(f"{path}: not JSON ({e})") from None


def load_profile(run: Path) -> list[dict]:
    """The ``StageMeasured`` records of ``run/profile.jsonl``."""
    path = run / "profile.jsonl"
    if not path.is_file():
        raise RunDataError(f"{run}: no profile.jsonl")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunDataError(f"{path}:{n}: not JSON ({e})") from None
        if rec.get("event") == "StageMeasured":
            out.append(rec)
    return out


def _role(name: str, args: dict) -> str:
    """The role a trace span runs (``args.role``, else guessed from its name)."""
    if args.get("role"):
        return str(args["role"])
    base = name.removeprefix("borrowed: ")
    for role in ("rollout", "aux_train", "train"):
        if base.startswith(role):
            return role
    return ""


def load_spans(run: Path) -> dict[int, list[Span]]:
    """Complete (``ph == "X"``) spans of ``run/trace.json`` per device, sorted by start."""
    raw = _read_json(run / "trace.json")
    events = raw.get("traceEvents", []) if isinstance(raw, dict) else raw
    spans: dict[int, list[Span]] = {d: [] for d in TIDS.values()}
    for e in events:
        if e.get("ph") != "X" or e.get("tid") not in TIDS:
            continue
        name, args = str(e.get("name", "")), e.get("args") or {}
        idle = args.get("activity") == "idle" if "activity" in args else (name == "idle" or name.endswith(": idle"))
        start = float(e["ts"]) / 1e6
        spans[TIDS[e["tid"]]].append(Span(start, start + float(e.get("dur", 0.0)) / 1e6, _role(name, args), idle))
    for d in spans:
        spans[d].sort(key=lambda s: s.start)
    return spans


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(a: float, b: float, merged: list[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` covered by the disjoint ``merged`` intervals."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged)


def busy_intervals(spans: dict[int, list[Span]]) -> dict[int, list[tuple[float, float]]]:
    """Each device's non-idle time, merged."""
    return {d: merge([(s.start, s.end) for s in ss if not s.idle]) for d, ss in spans.items()}


def role_intervals(spans: dict[int, list[Span]], roles: tuple[str, ...]) -> dict[int, list[tuple[float, float]]]:
    """Each device's non-idle time in one of ``roles``, merged."""
    return {d: merge([(s.start, s.end) for s in ss if not s.idle and s.role in roles]) for d, ss in spans.items()}


def device_of(a: float, b: float, by_role: dict[int, list[tuple[float, float]]]) -> int | None:
    """The one device that ran the stage's role over >= 90 % of ``[a, b]``; None if none or both could."""
    length = max(b - a, 1e-12)
    cover = {d: overlap(a, b, iv) / length for d, iv in by_role.items()}
    running = [d for d, c in cover.items() if c >= BUSY_OTHER]
    possible = [d for d, c in cover.items() if c > ALONE]
    return running[0] if len(running) == 1 and len(possible) == 1 else None


def samples(profile: list[dict], spans: dict[int, list[Span]], stage: str) -> tuple[list[Sample], int]:
    """``stage``'s measurements as samples on the device that ran them, and how many could not be placed."""
    by_role = role_intervals(spans, STAGE_ROLES[stage])
    busy = busy_intervals(spans)
    out, unplaced = [], 0
    for rec in profile:
        if rec.get("stage") != stage:
            continue
        f, sec, end = rec.get("features") or [], float(rec["seconds"]), float(rec["t"])
        if len(f) < 2 or f[0] <= 0 or f[1] <= 0 or sec <= 0:
            continue
        a = end - sec
        d = device_of(a, end, by_role)
        if d is None:
            unplaced += 1
            continue
        other = overlap(a, end, busy[1 - d]) / sec
        if stage == "decode":
            out.append(Sample(d, round(f[1] / f[0]), 1000.0 * sec / f[0], float(f[0]), other))
        else:
            out.append(Sample(d, None, sec / f[1], float(f[1]), other))
    return out, unplaced


def side(frac: float) -> str | None:
    """``"busy"`` (other device busy >= 90 %), ``"alone"`` (<= 10 %) or None (in between)."""
    if frac >= BUSY_OTHER:
        return "busy"
    if frac <= ALONE:
        return "alone"
    return None


def slowdown(ss: list[Sample], min_chunks: int = MIN_CHUNKS) -> dict:
    """Median busy-other over median alone per key, and the weighted figure over keys with enough chunks."""
    groups: dict[int | None, dict[str, list[Sample]]] = {}
    for s in ss:
        k = side(s.other_busy)
        if k is not None:
            groups.setdefault(s.key, {"busy": [], "alone": []})[k].append(s)
    per_key, num, den = [], 0.0, 0.0
    for key in sorted(groups, key=lambda k: -1 if k is None else k):
        g = groups[key]
        nb, na = len(g["busy"]), len(g["alone"])
        mb = statistics.median(s.value for s in g["busy"]) if nb else None
        ma = statistics.median(s.value for s in g["alone"]) if na else None
        ok = nb >= min_chunks and na >= min_chunks
        ratio = mb / ma if mb is not None and ma else None
        if ok and ratio is not None:
            w = sum(s.weight for s in g["busy"] + g["alone"])
            num, den = num + ratio * w, den + w
        per_key.append({"key": key, "n_busy": nb, "n_alone": na, "median_busy": mb, "median_alone": ma,
                        "ratio": ratio, "counted": ok})
    return {"per_key": per_key, "slowdown": num / den if den else None}


def busy_alone(spans: dict[int, list[Span]]) -> dict[int, dict[str, float]]:
    """Each device's busy seconds, and the part of them with the other device idle."""
    busy = busy_intervals(spans)
    out = {}
    for d, iv in busy.items():
        total = sum(b - a for a, b in iv)
        beside = sum(overlap(a, b, busy[1 - d]) for a, b in iv)
        out[d] = {"busy_s": total, "alone_s": total - beside}
    return out


def corrected_bound(tokens: float, devices: int, seconds: dict[int, dict[str, float]],
                    slow: dict[int, float | None]) -> dict:
    """The packing bound from the trace's busy seconds, and with each device's alone seconds scaled."""
    busy = sum(v["busy_s"] for v in seconds.values())
    extra = sum(((slow.get(d) or 1.0) - 1.0) * v["alone_s"] for d, v in seconds.items())
    return {"busy_s": busy, "corrected_busy_s": busy + extra,
            "bound": tokens / (busy / devices) if busy else None,
            "corrected_bound": tokens / ((busy + extra) / devices) if busy + extra > 0 else None}


def pair_key(run: Path) -> tuple[str | None, str | None, str]:
    """(pair prefix, policy, workload) from the nearest path component named ``PREFIX-async`` / ``-bidirl``.

    The workload is that component's prefix less a trailing pair index (``rollout-heavy-00`` ->
    ``rollout-heavy``); a run outside any pair is its own workload, named by its directory.
    """
    parts = run.resolve().parts
    for i in range(len(parts) - 1, -1, -1):
        m = POLICY_SUFFIX.match(parts[i])
        if m:
            prefix = str(Path(*parts[:i], m["prefix"], *parts[i + 1:]))
            return prefix, m["policy"], re.sub(r"-\d+$", "", m["prefix"])
    return None, None, run.name


def analyse_run(run: Path, min_chunks: int = MIN_CHUNKS) -> dict:
    """Slowdowns, busy/alone seconds and (for ``async``) the corrected bound of one run directory."""
    profile = load_profile(run)
    summary = _read_json(run / "summary.json")
    spans = load_spans(run)
    prefix, policy, workload = pair_key(run)
    policy = summary.get("policy", policy)
    out: dict = {"run": str(run), "policy": policy, "pair": prefix, "workload": workload,
                 "tokens_per_s": summary.get("throughput_tokens_per_s"),
                 "ideal_tokens_per_s": summary.get("ideal_tokens_per_s"), "efficiency": summary.get("efficiency")}
    slow: dict[str, dict[int, dict]] = {}
    for stage in STAGE_ROLES:
        ss, unplaced = samples(profile, spans, stage)
        slow[stage] = {d: slowdown([s for s in ss if s.device == d], min_chunks) for d in TIDS.values()}
        slow[stage]["unplaced"] = unplaced  # type: ignore[assignment]
    out["slowdown"] = {stage: {str(k): v for k, v in per.items()} for stage, per in slow.items()}
    out["decode_slowdown"] = slow["decode"][0]["slowdown"]
    out["train_slowdown"] = slow["train_micro"][1]["slowdown"]
    seconds = busy_alone(spans)
    out["seconds"] = {str(d): v for d, v in seconds.items()}
    if policy == "async":
        factors = {d: slow[DEVICE_STAGE[d]][d]["slowdown"] for d in TIDS.values()}
        tokens = summary.get("tokens_trained") or 0.0
        out["bound"] = corrected_bound(tokens, int(summary.get("devices", len(TIDS))), seconds, factors)
        out["bound"]["factors"] = {str(d): f for d, f in factors.items()}
    return out


def analyse_pairs(runs: list[dict]) -> list[dict]:
    """Each complete pair: the ``bidirl`` run against the ``async`` run's bound, uncorrected and corrected."""
    by_pair: dict[str, dict[str, dict]] = {}
    for r in runs:
        if r["pair"] is not None:
            by_pair.setdefault(r["pair"], {})[r["policy"]] = r
    out = []
    for prefix in sorted(by_pair):
        p = by_pair[prefix]
        if "async" not in p or "bidirl" not in p:
            continue
        a, b = p["async"], p["bidirl"]
        ideal, cb = a["ideal_tokens_per_s"], a["bound"]["corrected_bound"]
        tps_b, tps_a = b["tokens_per_s"], a["tokens_per_s"]
        out.append({"pair": prefix, "workload": a["workload"],
                    "decode_slowdown": a["decode_slowdown"], "train_slowdown": a["train_slowdown"],
                    "bound": ideal, "trace_bound": a["bound"]["bound"], "corrected_bound": cb,
                    "async_efficiency": tps_a / ideal if ideal else None,
                    "bidirl_efficiency": tps_b / ideal if ideal else None,
                    "async_efficiency_corrected": tps_a / cb if cb else None,
                    "bidirl_efficiency_corrected": tps_b / cb if cb else None})
    return out


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories: each path that has a ``summary.json``, else those found below it."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise RunDataError(f"{p}: no such file or directory")
        if (p / "summary.json").is_file():
            out.append(p)
        else:
            found = sorted(s.parent for s in p.rglob("summary.json"))
            if not found:
                raise RunDataError(f"{p}: no summary.json in it or below it")
            out.extend(found)
    return list(dict.fromkeys(out))


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summarise(pairs: list[dict], runs: list[dict]) -> dict[str, dict]:
    """Per workload, medians over its pairs (or its async runs, where there are no pairs)."""
    out: dict[str, dict] = {}
    asyncs: dict[str, list[dict]] = {}
    for r in runs:
        if r["policy"] == "async":
            asyncs.setdefault(r["workload"], []).append(r)
    for w, rs in asyncs.items():
        ps = [p for p in pairs if p["workload"] == w]
        out[w] = {"pairs": len(ps),
                  "decode_slowdown": _median([r["decode_slowdown"] for r in rs]),
                  "train_slowdown": _median([r["train_slowdown"] for r in rs]),
                  "bidirl_efficiency": _median([p["bidirl_efficiency"] for p in ps]),
                  "bidirl_efficiency_corrected": _median([p["bidirl_efficiency_corrected"] for p in ps])}
    return out


def print_report(runs: list[dict], pairs: list[dict], per_workload: dict[str, dict]) -> None:
    """The per-batch decode table of every run, then the pairs, then the medians per workload."""
    print("decode ms/step by mean batch, device 0 (rollout): busy-other median / alone median (n busy/alone)")
    for r in runs:
        rows = r["slowdown"]["decode"]["0"]["per_key"]
        both = [k for k in rows if k["n_busy"] and k["n_alone"]]
        cells = [f"b{k['key']}: {_f(k['median_busy'], '.2f')}/{_f(k['median_alone'], '.2f')}"
                 f" ({k['n_busy']}/{k['n_alone']}){'' if k['counted'] else '*'}" for k in both]
        one = [k for k in rows if not (k["n_busy"] and k["n_alone"])]
        if one:
            cells.append(f"{len(one)} batch sizes on one side only (b{one[0]['key']}..b{one[-1]['key']}, "
                         f"{sum(k['n_busy'] for k in one)}/{sum(k['n_alone'] for k in one)} chunks)")
        t = r["slowdown"]["train_micro"]["1"]["per_key"]
        tn = f"{t[0]['n_busy']}/{t[0]['n_alone']}" if t else "0/0"
        print(f"  {r['run']} [{r['policy']}]  weighted {_f(r['decode_slowdown'])}  "
              f"train {_f(r['train_slowdown'])} ({tn})  unplaced decode/train "
              f"{r['slowdown']['decode']['unplaced']}/{r['slowdown']['train_micro']['unplaced']}")
        print("    " + "; ".join(cells))
    print("  (* = fewer than the minimum chunks on a side: not in the weighted figure)\n")
    print(f"{'pair':<48}{'dec x':>7}{'trn x':>7}{'bound':>8}{'corr':>8}{'eff':>7}{'eff c':>7}{'async':>7}{'asy c':>7}")
    for p in pairs:
        print(f"{p['pair'][-47:]:<48}{_f(p['decode_slowdown']):>7}{_f(p['train_slowdown']):>7}"
              f"{_f(p['bound'], '.1f'):>8}{_f(p['corrected_bound'], '.1f'):>8}{_f(p['bidirl_efficiency']):>7}"
              f"{_f(p['bidirl_efficiency_corrected']):>7}{_f(p['async_efficiency']):>7}"
              f"{_f(p['async_efficiency_corrected']):>7}")
    print("  dec x / trn x: the async run's decode / train_micro slowdown beside the other device ('-': "
          "too few chunks, not scaled); eff = bidirl tok/s over the async bound, eff c = over the corrected bound\n")
    print(f"{'workload (median)':<24}{'pairs':>6}{'dec x':>7}{'trn x':>7}{'eff':>7}{'eff c':>7}")
    for w, s in sorted(per_workload.items()):
        print(f"{w:<24}{s['pairs']:>6}{_f(s['decode_slowdown']):>7}{_f(s['train_slowdown']):>7}"
              f"{_f(s['bidirl_efficiency']):>7}{_f(s['bidirl_efficiency_corrected']):>7}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="run directories, or directories to search for them")
    ap.add_argument("--json", type=Path, help="write the figures per run, per pair and per workload here")
    ap.add_argument("--min-chunks", type=int, default=MIN_CHUNKS,
                    help=f"chunks needed on each side for a batch size to count (default {MIN_CHUNKS})")
    args = ap.parse_args(argv)
    try:
        runs = [analyse_run(r, args.min_chunks) for r in find_runs(args.paths)]
    except RunDataError as e:
        print(f"contention: {e}", file=sys.stderr)
        return 2
    pairs = analyse_pairs(runs)
    per_workload = summarise(pairs, runs)
    print_report(runs, pairs, per_workload)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "pairs": pairs, "workloads": per_workload}, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
