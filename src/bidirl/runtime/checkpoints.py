"""Checkpoint files on disk: reading them back, checking them, choosing one to resume from.

A checkpoint ``step_<k>/`` holds ``model/``, a Hugging Face model directory
(``config.json``, ``generation_config.json``, ``model.safetensors``, the tokenizer files and
chat template) that ``AutoModelForCausalLM``, ``AutoTokenizer`` and ``vllm.LLM`` load as is;
``trainer/`` with the optimizer (``optimizer.pt``; ``trainer.strategy=fsdp2``: one
``optimizer.shard-<r>-of-<n>.pt`` per rank) and the version (``trainer_state.json``);
``state.json`` (prompt cursor, buffered and in-flight groups), ``COMPLETE`` and, written
last, ``MANIFEST.json`` (each file's size and sha256).  Checkpoints
written before model directories kept the weights in ``trainer/model.safetensors``; they
still resume.

A checkpoint is usable when its ``state.json`` parses and names its own step, its model and
trainer files are whole (``config.json`` parses, each safetensors header matches its file's
size, ``optimizer.pt`` is a whole zip), every file matches the size and sha256 its
``MANIFEST.json`` records and every weight is finite (``checkpoint_integrity``; a
checkpoint written before manifests is judged on finiteness alone), and the ledger holds
every group of every step before it exactly once.  One that is not is marked damaged
(``DAMAGED`` holds the reason, ``COMPLETE`` goes) and the next older one is tried.
``metrics.jsonl`` and the ledger are JSON lines; a torn last line (what a crash mid-write
leaves) is dropped.

Writing one (``write_checkpoint``) happens at a step boundary, while the primary trainer is
idle: into ``.step_<k>.partial/``, its manifest written last, then renamed into place
(``checkpoint_integrity.checkpoint_writer``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from bidirl.engines.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_dir
from bidirl.engines.sharding import optimizer_files
from bidirl.runtime.checkpoint_integrity import checkpoint_writer, integrity_problem, manifest_problem
from bidirl.runtime.config import ConfigError
from bidirl.runtime.group_store import result_state


class ResumeError(ConfigError):
    """``--resume`` cannot continue this run directory (reported in one line, exit 2)."""


# -- run-directory files: jsonl tolerant of a torn last line, checkpoint checks ---------------------
def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """(records, torn): a JSON-lines file whose malformed *last* line (a crash mid-write) is
    dropped and counted; a malformed line before the last one raises ``ValueError``."""
    if not path.is_file():
        return [], 0
    lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    records = []
    for i, ln in enumerate(lines, start=1):
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if i == len(lines):
                return records, 1
            raise ValueError(f"{path}: line {i} is corrupt ({e})") from None
        records.append(rec)
    return records, 0


def rewrite_jsonl(path: Path, records: list[dict]) -> None:
    """Replace ``path`` with ``records``, atomically (a crash leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole (header length, header, data size), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n <= 0 or 8 + n > size:
                return f"{path.name}: truncated header"
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        return f"{path.name}: unreadable ({e})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) != size:
        return f"{path.name}: {size} bytes, its header describes {8 + n + max(ends, default=0)}"
    return None


def checkpoint_dirs(ckpt: str | Path, writing: bool = False) -> tuple[Path, Path]:
    """(trainer state directory, model directory) of checkpoint ``ckpt``: ``trainer/`` and
    ``model/``, or ``trainer/`` for both in a checkpoint of the older layout."""
    ckpt = Path(ckpt)
    trainer, model = ckpt / "trainer", ckpt / "model"
    if not writing and not model.is_dir() and (trainer / "model.safetensors").is_file():
        return trainer, trainer
    return trainer, model


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory (the index's shards, or ``model.safetensors``;
    a LoRA run's adapter directory: ``adapter_model.safetensors``)."""
    if is_adapter_dir(model_dir):
        return [model_dir / ADAPTER_WEIGHTS]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return [index]  # reported by model_problem as not a safetensors file
        return [model_dir / s for s in shards]
    return [model_dir / "model.safetensors"]


def model_problem(model_dir: Path, prefix: str = "") -> str | None:
    """Why ``model_dir`` is not a whole model directory (its config and weights; a LoRA run's
    adapter directory: ``adapter_config.json`` and ``adapter_model.safetensors``), or None."""
    if prefix != "trainer/":  # the older layout's trainer/ holds weights alone
        config, key = (ADAPTER_CONFIG, "peft_type") if is_adapter_dir(model_dir) else ("config.json", "model_type")
        try:
            json.loads((model_dir / config).read_text())[key]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{prefix}{config}: {'missing' if isinstance(e, OSError) else 'truncated or corrupt'}"
    for f in weight_files(model_dir):
        if not f.is_file():
            return f"{prefix}{f.name} missing"
        bad = safetensors_problem(f)
        if bad:
            return f"{prefix}{bad}"
    return None


def checkpoint_problem(ckpt: Path) -> tuple[str | None, dict | None]:
    """(why a complete checkpoint cannot be resumed from, or None; its parsed state)."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError) as e:
        return f"state.json: {'missing' if isinstance(e, OSError) else 'truncated or corrupt'}", None
    step = int(ckpt.name.split("_")[1])
    if not isinstance(state, dict) or state.get("next_step") != step or not {"cursor", "store"} <= set(state):
        return f"state.json does not describe step {step}", None
    trainer, model = checkpoint_dirs(ckpt)
    optimizer, missing = optimizer_files(trainer)  # optimizer.pt, or one file of rows per rank (fsdp2)
    if missing:
        return missing, None
    if not (trainer / "trainer_state.json").is_file():
        return "trainer/trainer_state.json missing", None
    bad = model_problem(model, f"{model.name}/")
    if bad:
        return bad, None
    for f in optimizer:
        if not zipfile.is_zipfile(f):
            return f"trainer/{f.name}: truncated or corrupt", None
    try:
        json.loads((trainer / "trainer_state.json").read_text())["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return "trainer/trainer_state.json: truncated or corrupt", None
    bad = integrity_problem(ckpt)  # the contents: sha256 against the manifest, finite weights
    if bad:
        return bad, None
    return None, state


def ledger_problem(records: list[dict], next_step: int, prompts_per_step: int) -> str | None:
    """Why the ledger's records before ``next_step`` are not every group of those steps once.

    Without dynamic sampling the steps' groups are ids ``0 .. next_step x prompts_per_step
    - 1``; with it (records with ``"outcome": "filtered"``) each step has
    ``prompts_per_step`` trained groups and no group has two records."""
    from collections import Counter

    try:
        before = [(int(r["group"]), int(r["step"]), r.get("outcome") == "filtered") for r in records
                  if int(r["step"]) < next_step]
    except (KeyError, TypeError, ValueError):
        return "trained_groups.jsonl: a record without group and step"
    counts = Counter(g for g, _, _ in before)
    if any(filtered for _, _, filtered in before):
        per_step = Counter(step for _, step, filtered in before if not filtered)
        short = [k for k in range(next_step) if per_step[k] != prompts_per_step]
        twice = [g for g, c in counts.items() if c > 1]
        if short or twice:
            return (f"trained_groups.jsonl: steps < {next_step} must each train {prompts_per_step} groups and "
                    f"every group have one record ({len(short)} steps short or over, {len(twice)} groups twice)")
        return None
    expected = next_step * prompts_per_step
    missing = [g for g in range(expected) if counts[g] == 0]
    twice = [g for g, c in counts.items() if c > 1 or g >= expected]
    if missing or twice:
        return (f"trained_groups.jsonl holds {sum(counts.values())} records of steps < {next_step}, "
                f"expected groups 0..{expected - 1} once each ({len(missing)} missing, {len(twice)} extra)")
    return None


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """``step_<k>`` directories with a ``COMPLETE`` marker, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted((p for p in ckpt_root.glob("step_*") if p.name[5:].isdigit() and (p / "COMPLETE").is_file()),
                  key=lambda p: int(p.name.split("_")[1]))


def select_checkpoint(ckpt_root: Path, ledger_path: Path, prompts_per_step: int,
                      mark_damaged: bool = True) -> tuple[Path | None, dict | None]:
    """(newest usable checkpoint, its state) as the module docstring describes, or
    (None, None) when there is no complete checkpoint; ``ResumeError`` when none is usable.

    Newer unusable ones are marked damaged (unless ``mark_damaged`` is False) only once a
    usable one is found, and one line on stderr says which, why, and which is used."""
    done = complete_checkpoints(ckpt_root)
    if not done:
        return None, None
    try:
        ledger, torn = read_jsonl(ledger_path)
        ledger_error = None
    except ValueError as e:
        ledger, torn, ledger_error = [], 0, str(e)
    if torn:
        print(f"[bidirl] {ledger_path.name}: dropping a torn last line", file=sys.stderr)
    unusable: list[tuple[Path, str]] = []
    for ckpt in reversed(done):
        why, state = checkpoint_problem(ckpt)
        if why is None:
            why = ledger_error or ledger_problem(ledger, state["next_step"], prompts_per_step)
        if why is None:
            for bad, reason in unusable if mark_damaged else ():
                (bad / "DAMAGED").write_text(reason + "\n")
                (bad / "COMPLETE").unlink(missing_ok=True)
            if unusable:
                what = "; ".join(f"checkpoint {bad} is unusable ({reason})" for bad, reason in unusable)
                marked = ", marked DAMAGED" if mark_damaged else ""
                print(f"[bidirl] {what}{marked}; falling back to {ckpt}, the newest usable checkpoint",
                      file=sys.stderr)
            return ckpt, state
        unusable.append((ckpt, why))
    reasons = [f"{c.name}: {why}" for c, why in unusable]
    raise ResumeError(f"--resume: no usable checkpoint in {ckpt_root} ({'; '.join(reasons)}); "
                      "start a new run, or repair the run directory")


# -- writing one at a step boundary ---------------------------------------------------------------
def write_checkpoint(ckpt_root: Path, next_step: int, ex, store, cursor, rewards_by_step: dict[int, float],
                     prompts_per_step: int, keep: int) -> Path:
    """Snapshot trainer, cursor, buffered and in-flight groups at step boundary ``next_step``.

    ``ex`` is the run's ``DeviceExecutor`` (the primary trainer saves, the serving replicas
    snapshot their partial responses), ``store`` its ``GroupStore``, ``cursor`` the prompt
    cursor.  It is written to ``.step_<k>.partial/``, its manifest last, and renamed into place
    once whole, so a crash, a full disk (``DiskFullError``) or a refused save
    (``NonFiniteWeightsError``) never leaves a ``step_<k>/`` behind;
    the newest ``keep`` complete ones are kept.
    """
    with checkpoint_writer(ckpt_root, next_step) as tmp:  # manifest last, then renamed into place
        for dev in ex.layout.train_devices:  # rank 0 writes the model; a sharded rank its optimizer rows
            ex.call_now(dev, "call", "train", "save", str(tmp))
        state = _boundary_state(next_step, ex, store, cursor, rewards_by_step, prompts_per_step)
        (tmp / "state.json").write_text(json.dumps(state))
        (tmp / "COMPLETE").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    out = ckpt_root / f"step_{next_step}"
    for old in complete_checkpoints(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _boundary_state(next_step: int, ex, store, cursor, rewards_by_step: dict[int, float],
                    prompts_per_step: int) -> dict:
    """``state.json``: the prompt cursor, the groups of steps from ``next_step`` on (each
    in-flight response with the prefix its replica has generated so far; a group dynamic
    sampling filtered too, until its step is recorded), the id the next new group gets
    (``next_group``: with filtered groups replaced, a step's groups are not a run of ids)
    and the rewards."""
    partials = []
    # A multi-turn run keeps no trajectory in flight: its environment's state cannot be saved,
    # so a resumed run starts those trajectories again from ``reset`` (what finished is kept).
    for u in ex.rollout.serving() if ex.rollout.hub is None else ():
        partials += ex.call_now(ex.unit_device(u), "call", "rollout", "snapshot")
    ex.rollout.sync_batches()  # the steps the controller has the groups in now
    state = store.state_dict()

    def step_of(g: dict) -> int:  # a group not yet assigned in this session: its id's step
        return g["group_id"] // prompts_per_step if g.get("batch") is None else g["batch"]

    state["groups"] = [g for g in state["groups"] if step_of(g) >= next_step]
    by_gid = {g["group_id"]: g for g in state["groups"]}
    for p in partials:
        g = by_gid.get(p.group_id)
        if g is not None and all(r["index"] != p.index for r in g["done"]):
            g["partial"] = [r for r in g["partial"] if r["index"] != p.index] + [result_state(p)]
    return {"next_step": next_step, "cursor": cursor.state_dict(), "store": state,
            "next_group": ex.rollout.next_group_id(),
            "rewards_by_step": {k: v for k, v in rewards_by_step.items() if k < next_step}}


# -- model directories out of a run --------------------------------------------------------------
def _copy_dir(src: Path, dst: Path, link: bool) -> None:
    """Files of ``src`` into a fresh ``dst`` (hard links where ``link`` and the file system
    allows: no second copy of the weights), written beside it and renamed into place."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        for f in sorted(src.iterdir()):
            if not f.is_file():
                continue
            try:
                if not link:
                    raise OSError
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
        if dst.exists():
            old = dst.with_name(f".{dst.name}.old.{os.getpid()}")
            os.replace(dst, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_model(run_dir: Path, step: int | None = None, verify: bool = False) -> Path:
    """The model directory of checkpoint ``step`` of ``run_dir`` (default: the newest complete
    one whose model is whole, and with ``verify`` matches its manifest); a one-line
    ``ConfigError`` when there is none."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a bidirl run directory (no config.yaml)")
    done = complete_checkpoints(run_dir / "checkpoints")
    if step is not None:
        done = [c for c in done if c.name == f"step_{step}"]
        if not done:
            have = ", ".join(c.name.split("_")[1] for c in complete_checkpoints(run_dir / "checkpoints")) or "none"
            raise ConfigError(f"--step: {run_dir} has no complete checkpoint of step {step} (complete: {have})")
    problems = []
    for ckpt in reversed(done):
        model = ckpt / "model"
        why = model_problem(model, "model/") if model.is_dir() else (
            "written before checkpoints held model directories (weights only, in trainer/)")
        if why is None and verify:
            why = manifest_problem(ckpt, under="model/")
        if why is None:
            return model
        problems.append(f"{ckpt.name}: {why}")
    raise ConfigError(f"{run_dir}: no checkpoint with a whole model directory"
                      f"{' (' + '; '.join(problems) + ')' if problems else ' (no complete checkpoint yet)'}")


def export_model(run_dir: Path, out: Path, step: int | None = None, merged: bool = False) -> Path:
    """``bidirl export``: copy a checkpoint's model directory to ``out`` (which must not
    exist or be empty); returns the checkpoint's model directory.  A LoRA run's is its adapter
    directory; ``merged`` writes instead the base model with the adapters merged in."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} exists and is not an empty directory")
    src = checkpoint_model(run_dir, step, verify=True)
    if not merged:
        _copy_dir(src, out, link=False)
    elif not is_adapter_dir(src):
        raise ConfigError(f"export --merged: {src} holds full weights already (the run did not use LoRA)")
    else:
        from bidirl.engines.lora import export_merged  # lazy: pulls in torch and PEFT

        try:
            export_merged(src, out)
        except FileNotFoundError as e:
            raise ConfigError(f"export --merged: {e}") from None
    return src


def publish_model(run_dir: Path) -> Path | None:
    """``RUN_DIR/model/``: the newest checkpoint's model directory, as hard links (it outlives
    the checkpoint's rotation without a second copy).  None when there is no checkpoint."""
    try:
        src = checkpoint_model(run_dir)
    except ConfigError:
        return None
    _copy_dir(src, Path(run_dir) / "model", link=True)
    return src
