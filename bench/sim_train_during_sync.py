"""What the trainer's wait for each weight sync costs, in the simulator.

Until issue 11's last change the controller started a step only once the replicas had
loaded the last step's weights (``WeightsSynced``); now the trainer starts it while they
load (``policy.asynchronous.TRAIN_DURING_SYNC``).  This runs a policy on each given scenario
(e.g. the ``RUN_DIR/scenario.yaml`` a real run calibrated) both ways and prints both
throughputs and their ratio; by default each scenario runs the policy its run ran (the
scenario's file records it), else ``--policy``:

    .venv/bin/python bench/sim_train_during_sync.py RUN_DIR/scenario.yaml [...] --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bidirl.policy import asynchronous
from bidirl.sim import scenario as scn
from bidirl.sim.run import simulate


def tokens_per_s(sc, policy: str, during: bool) -> float:
    """Simulated tokens/s of ``policy`` on ``sc``, the next step starting during the sync or not."""
    before = asynchronous.TRAIN_DURING_SYNC
    asynchronous.TRAIN_DURING_SYNC = during
    try:
        return simulate(sc, policy, record_intervals=False).throughput_tokens_per_s
    finally:
        asynchronous.TRAIN_DURING_SYNC = before


def policy_of(path: str, default: str) -> str:
    """The policy of the run whose directory holds the scenario (its ``summary.json``), else ``default``."""
    summary = Path(path).parent / "summary.json"
    try:
        return json.loads(summary.read_text())["policy"]
    except (OSError, ValueError, KeyError):
        return default


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+", help="scenario files (.yaml) or built-in names")
    ap.add_argument("--policy", default=None, help="run this policy on every scenario (default: its run's, "
                                                   "else bidirl)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    rows = []
    print(f"{'scenario':<58}{'policy':>8}{'waits':>10}{'during':>10}{'ratio':>8}")
    for name in args.scenarios:
        try:
            sc = scn.load(name)
        except (OSError, ValueError) as e:
            ap.error(f"{name}: {e}")
        policy = args.policy or policy_of(name, "bidirl")
        wait, during = tokens_per_s(sc, policy, False), tokens_per_s(sc, policy, True)
        ratio = during / wait if wait else None
        rows.append({"scenario": name, "policy": policy, "waits_tokens_per_s": wait,
                     "during_tokens_per_s": during, "during_over_waits": ratio})
        shown = name if len(name) <= 56 else "..." + name[-53:]
        print(f"{shown:<58}{policy:>8}{wait:>10.1f}{during:>10.1f}{ratio:>8.3f}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
