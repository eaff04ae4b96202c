"""Per-step metrics: ``metrics.jsonl`` in the run directory, mirrored to TensorBoard.

``metrics.jsonl`` is the record of truth: one flat JSON object per step, appended and
flushed immediately so a crashed run keeps every finished step, readable with nothing
but the standard library (``read_metrics``).  Keys follow veRL's naming so dashboards and
habits carry over: ``timing_s/gen``, ``perf/throughput``, ``trainer/idle_ratio``,
``actor/pg_loss``...  TensorBoard groups tags by the part before ``/``.

TensorBoard is a convenience, not a dependency: the writer is
``torch.utils.tensorboard.SummaryWriter`` when torch is importable, else the
framework-free ``tensorboard.summary.Writer``, else none (one warning per process).
Event files go straight into ``run_dir`` so ``tensorboard --logdir runs/`` lists one
run per run directory.

Weights & Biases is optional too (``run.wandb=true``): ``wandb={"project": ..., "name": ...}``
starts a wandb run in ``run_dir`` (its id kept in ``run_dir/wandb_id``, so a resumed run
continues the same wandb run), and every record is logged to it with its ``step`` as
``trainer/global_step``, the x-axis of every chart (records may arrive out of step order:
a validation reports after the steps that ran meanwhile).  ``WANDB_MODE=offline`` (or
``mode="offline"``) writes it to disk with no network; ``wandb sync`` uploads it later.
The package is not a dependency: without it, ``wandb=...`` is an ``ImportError`` naming
the field (the train config refuses ``run.wandb=true`` before anything starts).

A NaN or infinite value (or a non-number) is never written: JSON has no NaN, and one
NaN ruins a TensorBoard chart's scale.  The key is skipped and named in a warning the
first time; how often each key was skipped is logged on ``close()``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["METRICS_FILENAME", "MetricsLogger", "read_metrics", "truncate_metrics"]

METRICS_FILENAME = "metrics.jsonl"
TB_BACKENDS = ("auto", "torch", "tensorboard", "none")
log = logging.getLogger(__name__)
_warned_no_tensorboard = False


def _as_number(value: Any) -> int | float | None:
    """A finite int/float from a Python, numpy or 0-d torch scalar; None if impossible."""
    if isinstance(value, numbers.Integral):  # bool included
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    item = getattr(value, "item", None)  # numpy 0-d arrays, one-element torch tensors
    if callable(item):
        try:
            inner = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(inner, numbers.Real):
            return _as_number(inner)
    return None


def _open_tensorboard(run_dir: Path, backend: str) -> tuple[Any, str | None]:
    """(writer, backend name) for the first usable TensorBoard writer, or (None, None)."""
    global _warned_no_tensorboard
    if backend in ("auto", "torch"):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if backend == "torch":
                raise
        else:
            return SummaryWriter(log_dir=str(run_dir)), "torch"
    if backend in ("auto", "tensorboard"):
        try:
            from tensorboard.summary import Writer
        except ImportError:
            if backend == "tensorboard":
                raise
        else:
            return Writer(str(run_dir)), "tensorboard"
    if backend == "auto" and not _warned_no_tensorboard:
        _warned_no_tensorboard = True
        log.warning("neither torch nor tensorboard is importable; TensorBoard events are "
                    "not written (metrics.jsonl still is)")
    return None, None


WANDB_STEP = "trainer/global_step"


def _open_wandb(run_dir: Path, opts: Mapping[str, Any]):
    """A wandb run for ``run_dir`` (resumed if the directory already had one)."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError("run.wandb: true needs the wandb package (pip install wandb), or set run.wandb=false") \
            from e
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    if not run_id:
        import uuid

        run_id = uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
    kwargs = {"project": opts.get("project") or "bidirl", "name": opts.get("name") or run_dir.name,
              "dir": str(run_dir), "id": run_id, "resume": "allow", "config": dict(opts.get("config") or {})}
    if opts.get("mode"):
        kwargs["mode"] = opts["mode"]
    run = wandb.init(**kwargs)
    run.define_metric(WANDB_STEP)
    run.define_metric("*", step_metric=WANDB_STEP)
    return run


class MetricsLogger:
    """Appends one flat record per step to ``run_dir/metrics.jsonl`` (+ TensorBoard).

    ``tensorboard`` picks the writer: ``auto`` (torch, else tensorboard, else none),
    ``torch`` or ``tensorboard`` (raise ImportError if missing) or ``none``.
    Re-opening a run directory appends, so a resumed run continues the same file
    (after ``truncate_metrics`` has cut it back to the checkpoint's step).
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, tensorboard: str = "auto",
                 wandb: Mapping[str, Any] | None = None) -> None:
        if tensorboard not in TB_BACKENDS:
            raise ValueError(f"tensorboard must be one of {TB_BACKENDS}, got {tensorboard!r}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILENAME
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tb, self.tb_backend = _open_tensorboard(self.run_dir, tensorboard)
        self._wandb = _open_wandb(self.run_dir, wandb) if wandb is not None else None
        self._skipped: Counter[str] = Counter()
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, int | float]:
        """Write ``metrics`` for ``step``; return the record written (``step`` first).

        Keys with non-finite or non-numeric values are left out, with a warning.
        """
        if self._closed:
            raise RuntimeError(f"MetricsLogger for {self.run_dir} is closed")
        step = int(step)
        record: dict[str, int | float] = {"step": step}
        for key in sorted(metrics):
            number = _as_number(metrics[key]) if key != "step" else None
            if number is None:
                self._skip(step, key, metrics[key])
                continue
            record[key] = number
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self._write_tensorboard(step, record)
        if self._wandb is not None:
            self._wandb.log({**{k: v for k, v in record.items() if k != "step"}, WANDB_STEP: step})
        return record

    def log_text(self, step: int, tag: str, text: str) -> None:
        """A text entry (sample responses) in TensorBoard, where the writer supports text."""
        add_text = getattr(self._tb, "add_text", None)
        if add_text is None:
            return
        add_text(tag, text, **{"global_step" if self.tb_backend == "torch" else "step": int(step)})
        self._tb.flush()

    def _skip(self, step: int, key: str, value: Any) -> None:
        if not self._skipped[key]:
            why = "reserved key" if key == "step" else f"value {value!r} is not a finite number"
            log.warning("metric %r skipped at step %d: %s", key, step, why)
        self._skipped[key] += 1

    def _write_tensorboard(self, step: int, record: Mapping[str, int | float]) -> None:
        if self._tb is None:
            return
        step_kw = {"global_step" if self.tb_backend == "torch" else "step": step}
        for key, value in record.items():
            if key != "step":
                self._tb.add_scalar(key, value, **step_kw)
        self._tb.flush()

    def close(self) -> None:
        """Flush and close the file and the TensorBoard writer; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        for key, count in sorted(self._skipped.items()):
            log.warning("metric %r was skipped %d time(s) in %s", key, count, self.path)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file (or of a run directory holding one).

    A malformed *last* line is what a crash mid-write leaves, so it is dropped with a
    warning; a malformed line anywhere else means the file is corrupt, and raises.
    """
    target = Path(path)
    if target.is_dir():
        target = target / METRICS_FILENAME
    lines = target.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                log.warning("dropping truncated last line %d of %s", number, target)
                break
            raise ValueError(f"{target}:{number}: not a JSON object ({err})") from err
    return records


def truncate_metrics(path: str | os.PathLike[str], next_step: int) -> int:
    """Cut ``metrics.jsonl`` (or a run directory's) back to the records of steps before
    ``next_step``, as a resume from that step's checkpoint needs; returns how many went.

    The steps from ``next_step`` on are trained again and logged again, so their old
    records (and a final record) would be duplicates.  A malformed last line (a crash
    mid-write) is dropped, a malformed line elsewhere too, with a warning: this file is a
    report, not the ledger.  The file is replaced atomically.
    """
    target = Path(path)
    if target.is_dir():
        target = target / METRICS_FILENAME
    if not target.is_file():
        return 0
    keep, dropped = [], 0
    text = target.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, TypeError, KeyError):
            log.warning("dropping malformed line %d of %s", number, target)
            dropped += 1
            continue
        if step < next_step:
            keep.append(line)
        else:
            dropped += 1
    if dropped or (text and not text.endswith("\n")):  # the next record must start a line
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
        os.replace(tmp, target)
    return dropped
