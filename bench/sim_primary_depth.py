"""What the primary's queue depth costs a late joiner, in the simulator.

A primary rank keeps ``policy.split.PRIMARY_DEPTH`` calls on its device (1 since issue 11's
depth-1 series; 2 before).  At 2 its last two micro-batches are claimed, and a rollout replica that runs
dry late in a step finds nothing to take; at 1 the one that would be queued is still there
for it.  This runs ``bidirl`` on each given scenario (e.g. the ``RUN_DIR/scenario.yaml`` a
real run calibrated) at depth 2 and at depth 1 and prints both throughputs and their ratio
(the simulator charges no round trip between a rank's micro-batches at depth 1: the real
driver would pay one per micro-batch):

    .venv/bin/python bench/sim_primary_depth.py RUN_DIR/scenario.yaml [...] --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bidirl.policy import split
from bidirl.sim import scenario as scn
from bidirl.sim.run import simulate

DEPTHS = (2, 1)


def at_depth(sc, policy: str, depth: int) -> float:
    """Simulated tokens/s of ``policy`` on ``sc`` with primaries keeping ``depth`` calls."""
    before = split.PRIMARY_DEPTH
    split.PRIMARY_DEPTH = depth
    try:
        return simulate(sc, policy, record_intervals=False).throughput_tokens_per_s
    finally:
        split.PRIMARY_DEPTH = before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+", help="scenario files (.yaml) or built-in names")
    ap.add_argument("--policy", default="bidirl")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    rows = []
    print(f"{'scenario':<64}{'depth 2':>10}{'depth 1':>10}{'1 / 2':>8}")
    for name in args.scenarios:
        try:
            sc = scn.load(name)
        except (OSError, ValueError) as e:
            ap.error(f"{name}: {e}")
        tps = {d: at_depth(sc, args.policy, d) for d in DEPTHS}
        ratio = tps[1] / tps[2] if tps[2] else None
        rows.append({"scenario": name, "policy": args.policy,
                     "tokens_per_s": {str(d): v for d, v in tps.items()}, "depth1_over_depth2": ratio})
        shown = name if len(name) <= 62 else "..." + name[-59:]
        print(f"{shown:<64}{tps[2]:>10.1f}{tps[1]:>10.1f}{ratio:>8.3f}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
