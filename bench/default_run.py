"""The README's main job, measured: ``bidirl train`` with its embedded default.

BENCHMARKS.md, "Default run":

    .venv/bin/python -m bench.default_run [key=value ...]

Runs the default (tiny model, built-in task, 2 CPU devices), prints the wall time (whole
process and training loop) and the reward curve as 50-step means, and writes
bench/results/default_run.json and the curve to bench/results/default_reward.png.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import RESULTS, train, write_json


def main() -> int:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="bidirl-default-") as tmp:
        out = train(Path(tmp) / "run", extra)
        if not out.ok:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        s = out.summary()
    wall = out.process_wall_s
    rewards = s["rewards"]
    means = [round(statistics.mean(rewards[i:i + 50]), 3) for i in range(0, len(rewards), 50)]
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "overrides": extra, "process_wall_s": round(wall, 1),
              "loop_wall_s": s["wall_s"], "steps": s["steps"], "tokens_per_s": s["throughput_tokens_per_s"],
              "reward_50_step_means": means, "reward_first": s["reward_first"], "reward_last": s["reward_last"],
              "audit_ok": s["audit_ok"], "idle_ratio": s["idle_ratio"], "borrows": s["borrows"],
              "stage_model_median_error": s["stage_model_median_error"]}
    print(json.dumps(result, indent=1))
    write_json(RESULTS / "default_run.json", {**result, "rewards": rewards})
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(range(len(rewards)), rewards, lw=0.6, alpha=0.4, label="mean reward per step")
    k = 20
    smooth = [statistics.mean(rewards[max(0, i - k + 1):i + 1]) for i in range(len(rewards))]
    ax.plot(range(len(rewards)), smooth, lw=2, label=f"{k}-step moving mean")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(f"bidirl train (default): {len(rewards)} steps, {s['wall_s']:.0f} s loop, {wall:.0f} s total")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(RESULTS / "default_reward.png", dpi=110)
    return 0 if s["audit_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
