"""The run directory and the rules of ``--resume``.

A new run gets a new empty directory (``resolve_run_dir``) with its whole config written
first (``write_config``); a run that fails before writing anything else leaves no directory
behind (``remove_unstarted``).  A resumed run keeps its directory and its ``config.yaml``:
the file must state every field the data stream and the ledger depend on
(``check_saved_config``), and an override may change only the fields ``config.py``
declares ``resume_safe`` (``resume_changes``); each change is appended to
``resume_changes.jsonl``.  The ledger of trained groups (``trained_groups.jsonl``) is
appended to after every step and cut back to the checkpoint on resume.

The ledger and the prompt cursor count prompts by index, so a resume must read the same
training data: a new run records each data file's fingerprint (``data_fingerprint.json``:
sha256, rows, bytes) and a resume refuses a file changed since (``check_data_unchanged``),
naming what changed, unless ``--allow-data-change`` says the change is meant.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

from bidirl.algo.data import DataError, data_changes, data_fingerprint
from bidirl.runtime.checkpoints import read_jsonl, rewrite_jsonl
from bidirl.runtime.config import ConfigError, TrainConfig, resume_safe, resume_safe_names

RESUME_CHANGES = "resume_changes.jsonl"
LEDGER = "trained_groups.jsonl"
DATA_FINGERPRINT = "data_fingerprint.json"


def flat_fields(d: dict, prefix: str = "") -> dict:
    """A nested mapping as ``{"a.b.c": value}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_fields(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_changes(saved: TrainConfig, cfg: TrainConfig) -> list[tuple[str, object, object]]:
    """(field, saved value, new value) for every field ``cfg`` changes.

    A ``ConfigError`` lists every changed field that is not ``resume_safe``, with its
    checkpointed value and the override's."""
    old, new = flat_fields(saved.to_dict()), flat_fields(cfg.to_dict())
    changed = [(k, old.get(k), new[k]) for k in sorted(new) if new[k] != old.get(k)]
    refused = [c for c in changed if not resume_safe(c[0])]
    if refused:
        what = "; ".join(f"{k} is {a!r} in the checkpointed run (config.yaml), the override sets {b!r}"
                         for k, a, b in refused)
        raise ConfigError(f"--resume: {what}: the data stream and the ledger of trained groups depend on "
                          f"{'it' if len(refused) == 1 else 'them'}; on resume only "
                          f"{', '.join(resume_safe_names())} may change")
    return changed


def record_resume_changes(run_dir: Path, step: int, changes: list[tuple[str, object, object]]) -> None:
    """Append each allowed change to ``RUN_DIR/resume_changes.jsonl`` and say so on stderr."""
    if not changes:
        return
    when = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (run_dir / RESUME_CHANGES).open("a") as f:
        for key, old, new in changes:
            f.write(json.dumps({"time": when, "step": step, "field": key, "old": old, "new": new}) + "\n")
    print(f"[bidirl] resume from step {step} changes "
          f"{', '.join(f'{k} {a!r} -> {b!r}' for k, a, b in changes)} (recorded in {RESUME_CHANGES})",
          file=sys.stderr)


def check_saved_config(path: Path) -> None:
    """A resumed run's ``config.yaml`` (already loaded once, so valid) must state every field
    the data stream and the ledger depend on.

    ``write_config`` writes every field; one missing means the file was cut short or
    edited, and the defaults that would fill in might not be what the run trained with."""
    raw = yaml.safe_load(path.read_text())
    present = set(flat_fields(raw)) if isinstance(raw, dict) else set()
    needed = [k for k in flat_fields(TrainConfig().to_dict()) if not resume_safe(k) and k != "run.run_dir"]
    missing = [k for k in needed if k not in present]
    if missing:
        raise ConfigError(f"--resume: {path} does not state {', '.join(missing[:4])}"
                          f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}, which the run's "
                          "data stream and ledger depend on: the file is cut short or was edited (or written before "
                          "these fields existed); restore it, or add them with the values the run used")


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """``RUN_DIR/config.yaml``, every field, written whole or not at all (temporary file, rename)."""
    tmp = run_dir / ".config.yaml.partial"
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, run_dir / "config.yaml")


def resolve_run_dir(cfg: TrainConfig | None, resume: str | None, run_dir: str | None) -> Path:
    """The run directory: ``--resume``'s (which must hold a ``config.yaml``), or a new empty one."""
    if resume:
        p = Path(resume)
        if not (p / "config.yaml").is_file():
            raise ConfigError(f"--resume: {p} is not a bidirl run directory (no config.yaml)")
        return p
    p = Path(run_dir or cfg.run.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--run-dir: {p} is a file, not a directory")
    if p.exists() and any(p.iterdir()):
        raise ConfigError(f"run directory {p} exists and is not empty; use --resume {p} or another --run-dir")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--run-dir: cannot create {p}: {e.strerror or e}") from None
    return p


def remove_unstarted(run_dir: Path) -> None:
    """A new run that failed before writing anything but its ``config.yaml`` (bad data, a bad
    reward, the machine too small) leaves no directory behind, so the same command, once
    fixed, can use it again."""
    try:
        if {p.name for p in run_dir.iterdir()} <= {"config.yaml", DATA_FINGERPRINT}:
            for name in ("config.yaml", DATA_FINGERPRINT):
                (run_dir / name).unlink(missing_ok=True)
            run_dir.rmdir()
    except OSError:
        pass


def record_data(run_dir: Path, cfg: TrainConfig) -> None:
    """Write the training data files' fingerprint (none for a built-in task, whose rows follow
    from ``data.task`` and ``data.seed`` in the config). A file that cannot be read is left to
    the data loader, whose error names it; the run then stops before it starts."""
    try:
        prints = data_fingerprint(cfg.data.files)
    except (OSError, DataError):
        return
    (run_dir / DATA_FINGERPRINT).write_text(json.dumps(prints, indent=1) + "\n")


def check_data_unchanged(run_dir: Path, cfg: TrainConfig, allow_change: bool = False) -> list[str]:
    """The changes to the training data since the run began (empty: none); refused with a
    one-line ``ConfigError`` unless ``allow_change``, in which case they are printed, appended
    to ``resume_changes.jsonl`` and the new fingerprint becomes the run's. A run directory
    from before fingerprints (no ``data_fingerprint.json``) is not checked."""
    path = run_dir / DATA_FINGERPRINT
    if not path.is_file():
        return []
    try:
        now = data_fingerprint(cfg.data.files)
    except OSError as e:
        raise ConfigError(f"data.files: cannot read {e.filename}: {e.strerror or e}") from None
    changes = data_changes(json.loads(path.read_text()), now)
    if changes and not allow_change:
        raise ConfigError(f"--resume: the training data changed since this run began ({'; '.join(changes)}); the "
                          f"ledger counts prompts by index, so the run would no longer know which prompts it "
                          f"trained on: restore the files, or pass --allow-data-change if the change is meant")
    if changes:
        print(f"[bidirl] warning: resuming on changed training data (--allow-data-change): {'; '.join(changes)}",
              file=sys.stderr)
        with (run_dir / RESUME_CHANGES).open("a") as f:
            f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "field": "data.files",
                                "changes": changes}) + "\n")
        path.write_text(json.dumps(now, indent=1) + "\n")
    return changes


def truncate_ledger(path: Path, next_step: int) -> None:
    """Keep the ledger's records of steps before ``next_step`` (a torn last line is dropped)."""
    if not path.is_file():
        return
    records = read_jsonl(path)[0] if next_step > 0 else []
    rewrite_jsonl(path, [r for r in records if r["step"] < next_step])


class LedgerFile:
    """``trained_groups.jsonl``, open for appending: one line per trained group, flushed per step.

    With dynamic sampling (``algorithm.filter_groups``) the step's filtered groups follow its
    trained ones, ``{"group": g, "step": k, "outcome": "filtered"}``: an outcome like
    training, so the audit accounts for every group, and cut back with its step on resume."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def append_step(self, step: int, group_ids, staleness, filtered=()) -> None:
        for g, st in zip(group_ids, staleness):
            self.file.write(json.dumps({"group": g, "step": step, "staleness": st}) + "\n")
        for g in filtered:
            self.file.write(json.dumps({"group": g, "step": step, "outcome": "filtered"}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
