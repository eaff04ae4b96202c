"""Checkpoints that prove themselves: written whole or not at all, checked before they are trusted.

Writing (:func:`checkpoint_writer`): a checkpoint is written into ``.step_<k>.partial/``;
once every file is there, ``MANIFEST.json`` (each file's size and sha256) is written last,
atomically (a temporary file renamed into place), and the directory is renamed to
``step_<k>/``.  Whatever fails on the way (a refused save, a crash, a full disk) leaves no
``step_<k>/`` behind and the partial directory is removed.  A full disk (``ENOSPC``, or the
torch zip writer's "unexpected pos" / "file write failed" that it causes inside a worker)
is reported as one :class:`DiskFullError` line: which file, how much a checkpoint needs
against what is free, and which checkpoint stays the newest good one.

Checking (:func:`integrity_problem`, called by ``checkpoints.checkpoint_problem`` for each
candidate on resume): every file the manifest lists must be there with its size and
sha256, and every floating-point tensor of every ``*.safetensors`` file must be finite
(read with numpy through a memory map, bf16 and fp16 included, no torch).  Checkpoints
written before manifests existed have none: they are accepted on the finiteness check alone.

Cost: hashing reads every byte once at writing and once at resume (about 1 s per GB here);
the finiteness check reads the weights once more, on resume only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bidirl.engines.trainer_config import NonFiniteWeightsError
from bidirl.runtime.config import ConfigError

MANIFEST = "MANIFEST.json"
MARKERS = ("COMPLETE", "DAMAGED", MANIFEST)
"""Files a checkpoint holds that its manifest does not list: the markers and the manifest itself."""


class DiskFullError(ConfigError):
    """A checkpoint could not be written for lack of space (reported in one line, exit 2)."""


# -- the manifest ---------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _listed_files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.rglob("*") if p.is_file() and p.relative_to(ckpt).as_posix() not in MARKERS
                  and not p.name.startswith("."))


def write_manifest(ckpt: Path) -> Path:
    """``ckpt/MANIFEST.json``: size and sha256 of every file of the checkpoint, written last
    and atomically (temporary file, then rename): its presence says the checkpoint is whole."""
    files = {p.relative_to(ckpt).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in _listed_files(ckpt)}
    tmp = ckpt / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": 1, "files": files}, indent=1))
    out = ckpt / MANIFEST
    os.replace(tmp, out)
    return out


def manifest_problem(ckpt: Path, under: str = "") -> str | None:
    """Why the files of ``ckpt`` (those whose path starts with ``under``) differ from its
    manifest, or None; None too for a checkpoint without one (written before manifests)."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        listed = {name: (int(v["bytes"]), str(v["sha256"])) for name, v in files.items() if name.startswith(under)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST}: truncated or corrupt"
    for name, (size, _) in listed.items():  # sizes first: cheap, and they name a cut file plainly
        f = ckpt / name
        if not f.is_file():
            return f"{name} missing (listed in {MANIFEST})"
        if f.stat().st_size != size:
            return f"{name}: {f.stat().st_size} bytes, {MANIFEST} says {size}"
    for name, (_, digest) in listed.items():
        if _sha256(ckpt / name) != digest:
            return f"{name}: content differs from {MANIFEST} (sha256 mismatch: changed after it was written)"
    return None


# -- finiteness of the weights --------------------------------------------------------------------
# (unsigned view, exponent mask): a float is NaN or inf when all its exponent bits are set.
# F8_E4M3 has no inf and one NaN pattern per sign (S.1111.111): the mask is those seven bits.
_FLOAT_BITS = {"F64": (np.uint64, 0x7FF0000000000000), "F32": (np.uint32, 0x7F800000),
               "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80),
               "F8_E5M2": (np.uint8, 0x7C), "F8_E4M3": (np.uint8, 0x7F)}
_CHUNK = 1 << 24  # elements per pass: bounds the temporary arrays to tens of MB


def _header(path: Path) -> tuple[int, dict]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def nonfinite_tensor(path: Path) -> str | None:
    """The name of the first floating-point tensor of safetensors file ``path`` holding a NaN
    or an infinity, or None.  Bit patterns are compared through a memory map: no float is
    converted and no tensor is loaded whole."""
    n, header = _header(path)
    if path.stat().st_size <= 8 + n:
        return None  # no data at all (an empty model): nothing to check
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if name == "__metadata__" or info.get("dtype") not in _FLOAT_BITS:
            continue
        kind, mask = _FLOAT_BITS[info["dtype"]]
        start, end = info["data_offsets"]
        values = data[start:end].view(kind)
        mask = kind(mask)
        for i in range(0, values.size, _CHUNK):
            if np.any((values[i:i + _CHUNK] & mask) == mask):
                return name
    return None


def nonfinite_problem(ckpt: Path) -> str | None:
    """Why the weights of ``ckpt`` are not all finite (the file and the first tensor), or None."""
    for f in sorted(ckpt.rglob("*.safetensors")):
        try:
            bad = nonfinite_tensor(f)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            return f"{f.relative_to(ckpt).as_posix()}: unreadable ({e})"
        if bad is not None:
            return f"{f.relative_to(ckpt).as_posix()}: tensor {bad} holds NaN or inf"
    return None


def integrity_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be trusted: a file that differs from its manifest, or a weight that
    is not finite; None when it can.  A checkpoint without a manifest (written before they
    existed) is judged on its weights' finiteness alone."""
    return manifest_problem(ckpt) or nonfinite_problem(ckpt)


def require_finite(params, where: str) -> None:
    """``NonFiniteWeightsError`` naming the first of ``params`` (name -> torch tensor or numpy
    array) that holds NaN or inf: weights loaded from ``where``, which no step of this run
    produced.  Tensors are looked at one at a time (no copy of the whole model on a CPU)."""
    for name, p in params.items():
        if hasattr(p, "detach"):  # torch's own check: numpy would pin the storage a sharded trainer re-allocates
            bad = p.is_floating_point() and not bool(p.detach().isfinite().all())
        else:
            a = np.asarray(p)
            bad = np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all()
        if bad:
            raise NonFiniteWeightsError(
                f"{where}: weight {name} holds NaN or inf as loaded, before any step of this run; training "
                "from it would only skip steps; resume from an older checkpoint or use another model")


# -- writing ------------------------------------------------------------------------------------------
def _complete_steps(ckpt_root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in ckpt_root.glob("step_*")
                  if p.name[5:].isdigit() and (p / "COMPLETE").is_file())


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _bytes(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


_TORCH_WRITE_FAILURES = ("unexpected pos", "file write failed", "No space left on device")


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and what it wraps: its cause, its context, and a Ray task error's ``cause``."""
    seen, todo, out = set(), [e], []
    while todo:
        x = todo.pop()
        if not isinstance(x, BaseException) or id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        todo += [x.__cause__, x.__context__, getattr(x, "cause", None)]
    return out


def _out_of_space(e: BaseException) -> tuple[str | None, str | None]:
    """(how ``e``, or what it wraps, says the disk is full: ``"errno"``, ``"text"`` or None;
    the file it names, if any).  Torch's zip writer, out of space, says "unexpected pos" or
    "file write failed" with no errno: the ``"text"`` case."""
    chain = _chain(e)
    for x in chain:
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return "errno", x.filename
    return ("text" if any(s in str(x) for x in chain for s in _TORCH_WRITE_FAILURES) else None), None


def _written_last(partial: Path) -> str | None:
    """The file of ``partial`` written last: the one a write that names no file failed on."""
    files = [p for p in partial.rglob("*") if p.is_file()] if partial.is_dir() else []
    return max(files, key=lambda p: p.stat().st_mtime_ns).relative_to(partial).as_posix() if files else None


def disk_full_error(e: BaseException, ckpt_root: Path, step: int, partial: Path, written_last: str | None,
                    written: int) -> DiskFullError | None:
    """The one-line error for a checkpoint write into ``partial`` (already removed) that
    failed for lack of space, or None when ``e`` is something else (a torch writer failure
    with room to spare included).  ``written_last`` and ``written``: the file written last
    in ``partial`` and its bytes, taken before it was removed."""
    how, filename = _out_of_space(e)
    if how is None:
        return None
    free = shutil.disk_usage(ckpt_root).free  # with the partial write removed: what there is to work with
    done = _complete_steps(ckpt_root)
    newest = _size(ckpt_root / f"step_{done[-1]}") if done else 0
    if how == "text" and free >= max(64 << 20, newest + written):
        return None
    name = written_last or "?"
    if any("Safetensor" in type(x).__name__ for x in _chain(e)):  # it removes what it could not finish
        name = (Path(written_last).parent / "*.safetensors").as_posix() if written_last else "*.safetensors"
    if filename:
        path = Path(filename)
        name = path.relative_to(partial).as_posix() if path.is_relative_to(partial) else str(path)
    if done:
        need = f"a checkpoint of this run takes {_bytes(newest)} (step_{done[-1]})"
        keep = (f"the newest good checkpoint stays step_{done[-1]} (the steps before it are safe; those after "
                "it are trained again on resume)")
    else:
        need = f"it needed more than the {_bytes(written)} written before it failed"
        keep = "no checkpoint was written before: a resume starts from step 0"
    return DiskFullError(f"no space left on device writing checkpoint step_{step} ({name}): {need}, "
                         f"{_bytes(free)} free on {ckpt_root}; nothing of step_{step} was kept; {keep}; free some "
                         f"space, then resume with: bidirl train --resume {ckpt_root.parent}")


@contextmanager
def checkpoint_writer(ckpt_root: Path, step: int):
    """Yield ``.step_<step>.partial/`` to write a checkpoint into; on leaving, the manifest
    is written last and the directory renamed to ``step_<step>/`` (replacing one of the
    same step only then).  On any error the partial directory is removed, so nothing
    half-written is ever taken for a checkpoint; a full disk becomes :class:`DiskFullError`."""
    ckpt_root = Path(ckpt_root)
    out, tmp = ckpt_root / f"step_{step}", ckpt_root / f".step_{step}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        write_manifest(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException as e:
        last, written = _written_last(tmp), _size(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full_error(e, ckpt_root, step, tmp, last, written)
        if full is not None:
            raise full from None
        raise
