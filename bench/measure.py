"""What the benchmarks share: the checkout they measure, the commit a figure is of, one
``bidirl train`` run as a subprocess (its summary and metrics read back), and the JSON
they write under ``bench/results``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# Ray: a private local instance, no usage report (as the test suite runs it).
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def run_env(**extra: str) -> dict[str, str]:
    """This process's environment with Ray's settings and ``extra`` on top."""
    return {**os.environ, **RAY_ENV, **extra}


def code_version() -> str:
    """The commit measured (``+dirty`` when ``src/`` has uncommitted changes)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no", "src") else "")


@dataclass(frozen=True)
class TrainRun:
    """One finished ``bidirl train`` process and its run directory."""

    run_dir: Path
    returncode: int
    stderr: str
    process_wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def metrics(self) -> list[dict]:
        """``metrics.jsonl``'s records, one a step or validation."""
        return [json.loads(x) for x in (self.run_dir / "metrics.jsonl").read_text().splitlines()]


def train(run_dir: Path, overrides: list[str], env: dict[str, str] | None = None) -> TrainRun:
    """``python -m bidirl.cli train --run-dir RUN_DIR OVERRIDES...`` from the checkout, timed."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "bidirl.cli", "train", "--run-dir", str(run_dir), *overrides],
                       cwd=ROOT, capture_output=True, text=True, env=env or run_env())
    return TrainRun(Path(run_dir), p.returncode, p.stderr, time.perf_counter() - t0)


def write_json(path: str | Path, data: object, indent: int | None = 1) -> Path:
    """``data`` as JSON at ``path`` (its directory made first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")
    return path
