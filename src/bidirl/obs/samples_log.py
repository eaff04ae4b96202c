"""``samples.jsonl``: what the model answered, so a run shows what it learned.

One JSON object per line, appended and flushed as it is written (like ``metrics.jsonl``):

    {"kind": "val", "step": 50, "version": 50, "data_source": "add", "prompt": "...",
     "response": "...", "score": 1.0, "ground_truth": "7"}

``kind`` is ``val`` (a validation response, ``step`` = the weights' version) or ``train``
(a training response, ``step`` = the training step it was trained in, ``version`` = the
oldest weights version among its tokens).  A resume cuts the file back to the records of
steps before the checkpoint's, as it does ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SAMPLES_FILENAME = "samples.jsonl"

__all__ = ["SAMPLES_FILENAME", "SamplesLog", "read_samples", "truncate_samples"]


class SamplesLog:
    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / SAMPLES_FILENAME
        self._file = None

    def write(self, records: list[dict]) -> None:
        if not records:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        for r in records:
            self._file.write(json.dumps(r, default=str, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_samples(path: str | os.PathLike[str]) -> list[dict]:
    """The records of a ``samples.jsonl`` (or of a run directory's); a torn last line is dropped."""
    target = Path(path)
    if target.is_dir():
        target = target / SAMPLES_FILENAME
    if not target.is_file():
        return []
    out = []
    for line in target.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def truncate_samples(path: str | os.PathLike[str], next_step: int) -> int:
    """Keep the records of steps before ``next_step`` (a resume from that checkpoint); how many went."""
    target = Path(path)
    if target.is_dir():
        target = target / SAMPLES_FILENAME
    if not target.is_file():
        return 0
    records = read_samples(target)
    keep = [r for r in records if isinstance(r.get("step"), int) and r["step"] < next_step]
    dropped = len(target.read_text(encoding="utf-8").splitlines()) - len(keep)
    if dropped:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in keep),
                       encoding="utf-8")
        os.replace(tmp, target)
    return dropped
