"""Checkpoints that prove themselves, on synthetic run directories (no Ray, no vLLM).

The manifest written last (size and sha256 of every file), checked on resume with the
weights' finiteness; a damaged checkpoint marked and passed over for the newest good one,
the ledger cut back to it; a checkpoint write that runs out of space leaving nothing
half-written and saying so in one line; weights loaded with NaN refused by the trainer.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_resume_files import PPS, _checkpoint, _run_dir, _session

from bidirl.runtime.checkpoint_integrity import (
    MANIFEST,
    DiskFullError,
    checkpoint_writer,
    integrity_problem,
    manifest_problem,
    nonfinite_problem,
    nonfinite_tensor,
    require_finite,
    write_manifest,
)
from bidirl.runtime.checkpoints import read_jsonl, select_checkpoint


def _weights(path: Path, values: np.ndarray, dtype: str = "F32") -> None:
    """A safetensors file of one tensor ``w`` (plus an integer one, never checked), raw bits."""
    import struct

    raw = {"F32": values.astype(np.float32).view(np.uint32),
           "F16": values.astype(np.float16).view(np.uint16),
           "BF16": (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)}[dtype].tobytes()
    ints = np.array([-1, 7], dtype=np.int64).tobytes()
    header = json.dumps({"w": {"dtype": dtype, "shape": [values.size], "data_offsets": [0, len(raw)]},
                         "steps": {"dtype": "I64", "shape": [2], "data_offsets": [len(raw), len(raw) + 16]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + raw + ints)


def _scribble(path: Path, seed: int = 0) -> None:
    """Random bytes into the middle of ``path``: its size and any header or marker intact."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = np.random.default_rng(seed).integers(0, 256, 8, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


# -- the manifest ---------------------------------------------------------------------------------
def test_the_manifest_catches_a_changed_cut_or_missing_file(tmp_path):
    run = _run_dir(tmp_path, 6)
    ck = _checkpoint(run, 6)
    _weights(ck / "model" / "model.safetensors", np.linspace(-1, 1, 64))
    assert manifest_problem(ck) is None, "no manifest: an older checkpoint, judged on finiteness alone"
    write_manifest(ck)
    files = json.loads((ck / MANIFEST).read_text())["files"]
    assert {"model/model.safetensors", "trainer/optimizer.pt", "state.json"} <= set(files)
    assert "COMPLETE" not in files and not list(ck.glob(".*")), "markers unlisted, no temporary left"
    assert integrity_problem(ck) is None

    weights = ck / "model" / "model.safetensors"
    before = weights.read_bytes()
    _scribble(weights)
    assert weights.stat().st_size == len(before)
    assert "model/model.safetensors: content differs from MANIFEST.json" in manifest_problem(ck)
    weights.write_bytes(before[:-4])
    assert manifest_problem(ck) == f"model/model.safetensors: {len(before) - 4} bytes, MANIFEST.json says {len(before)}"
    weights.unlink()
    assert manifest_problem(ck).startswith("model/model.safetensors missing")
    weights.write_bytes(before)
    assert manifest_problem(ck) is None
    assert manifest_problem(ck, under="model/") is None
    (ck / MANIFEST).write_text('{"files": {"a')
    assert manifest_problem(ck) == "MANIFEST.json: truncated or corrupt"


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_nonfinite_weights_are_found_in_each_float_format(tmp_path, dtype, bad):
    values = np.linspace(-3, 3, 1000)
    if bad is not None:
        values[777] = bad
    _weights(tmp_path / "m.safetensors", values, dtype)
    assert nonfinite_tensor(tmp_path / "m.safetensors") == (None if bad is None else "w")


def test_nonfinite_problem_names_the_file_and_tensor(tmp_path):
    (tmp_path / "model").mkdir()
    values = np.ones(8)
    values[3] = np.nan
    _weights(tmp_path / "model" / "model.safetensors", values)
    assert nonfinite_problem(tmp_path) == "model/model.safetensors: tensor w holds NaN or inf"


def test_require_finite_takes_arrays_and_tensors():
    from bidirl.engines.trainer_config import NonFiniteWeightsError

    require_finite({"a": np.ones(3), "steps": np.array([1, 2])}, "x")
    with pytest.raises(NonFiniteWeightsError, match=r"checkpoint c: weight b holds NaN or inf as loaded"):
        require_finite({"a": np.ones(3), "b": np.array([1.0, np.inf])}, "checkpoint c")
    torch = pytest.importorskip("torch")
    with pytest.raises(NonFiniteWeightsError, match="weight t "):
        require_finite({"t": torch.tensor([0.0, float("nan")], dtype=torch.bfloat16)}, "model m")


# -- resume: the damaged checkpoint marked, the newest good one used ---------------------------------
def _with_weights(run: Path, step: int) -> Path:
    ck = _checkpoint(run, step)
    _weights(ck / "model" / "model.safetensors", np.linspace(-1, 1, 4096))
    write_manifest(ck)
    return ck


def test_scribbled_weights_fall_back_to_the_newest_good_checkpoint(tmp_path, capsys):
    run = _run_dir(tmp_path, 7)
    for k in (4, 6):
        _with_weights(run, k)
    newest = run / "checkpoints" / "step_6"
    _scribble(newest / "model" / "model.safetensors")
    s = _session(run)
    ck, state = s.prepare_resume()
    assert ck.name == "step_4" and s.start_step == 4 and state["next_step"] == 4
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "unusable" in ln]
    assert len(lines) == 1, lines
    assert lines[0] == (f"[bidirl] checkpoint {newest} is unusable (model/model.safetensors: content differs from "
                        "MANIFEST.json (sha256 mismatch: changed after it was written)), marked DAMAGED; falling "
                        f"back to {run / 'checkpoints' / 'step_4'}, the newest usable checkpoint")
    assert "sha256 mismatch" in (newest / "DAMAGED").read_text() and not (newest / "COMPLETE").exists()
    assert sorted(r["group"] for r in read_jsonl(s.ledger_path)[0]) == list(range(4 * PPS)), "ledger cut to it"


def test_an_older_checkpoint_without_a_manifest_is_judged_on_its_weights(tmp_path, capsys):
    run = _run_dir(tmp_path, 6)
    _with_weights(run, 4)
    legacy = _checkpoint(run, 6)  # no manifest: written before they existed
    values = np.zeros(16)
    _weights(legacy / "model" / "model.safetensors", values)
    assert select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)[0] == legacy
    values[5] = np.inf
    _weights(legacy / "model" / "model.safetensors", values)  # whole, but not finite
    ck, _ = select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)
    assert ck.name == "step_4"
    assert "model/model.safetensors: tensor w holds NaN or inf" in capsys.readouterr().err


def test_export_refuses_a_model_that_differs_from_its_manifest(tmp_path, capsys):
    from bidirl.cli import main

    run = _run_dir(tmp_path, 6)
    for k in (4, 6):
        _with_weights(run, k)
    _scribble(run / "checkpoints" / "step_6" / "model" / "model.safetensors")
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert "step_4" in capsys.readouterr().err


# -- writing: the manifest last, nothing half-written, a full disk in one line -------------------------
def test_checkpoint_writer_renames_into_place_with_the_manifest(tmp_path):
    root = tmp_path / "checkpoints"
    with checkpoint_writer(root, 3) as tmp:
        assert tmp.name == ".step_3.partial"
        (tmp / "state.json").write_text("{}")
        (tmp / "COMPLETE").write_text("now")
    assert sorted(p.name for p in root.iterdir()) == ["step_3"]
    assert json.loads((root / "step_3" / MANIFEST).read_text())["files"]["state.json"]["bytes"] == 2


def _fill(tmp: Path) -> None:
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").write_bytes(b"\0" * 1000)
    os.utime(tmp / "model" / "model.safetensors", ns=(1, 1))
    (tmp / "trainer").mkdir()
    (tmp / "trainer" / "optimizer.pt").write_bytes(b"\0" * 100)  # written last: the one that failed


def test_disk_full_keeps_nothing_and_names_the_file_and_the_good_checkpoint(tmp_path):
    run = _run_dir(tmp_path, 6)
    _with_weights(run, 4)
    root = run / "checkpoints"
    with pytest.raises(DiskFullError) as e, checkpoint_writer(root, 6) as tmp:
        _fill(tmp)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "state.json"))
    msg = str(e.value)
    assert "\n" not in msg and e.value.__cause__ is None and e.value.__suppress_context__
    assert msg.startswith("no space left on device writing checkpoint step_6 (state.json): a checkpoint of "
                          "this run takes ")
    assert " free on " in msg and "nothing of step_6 was kept; the newest good checkpoint stays step_4" in msg
    assert msg.endswith(f"resume with: bidirl train --resume {run}")
    assert sorted(p.name for p in root.iterdir()) == ["step_4"], "no partial, no step_6"


def test_a_full_disk_inside_a_worker_names_the_file_written_last(tmp_path, monkeypatch):
    """Torch's zip writer out of space says "unexpected pos" with no errno, wrapped by Ray:
    believed when the disk is nearly full, passed on as it is when it is not."""
    import shutil
    from collections import namedtuple

    class RayTaskError(RuntimeError):
        def __init__(self, cause):
            super().__init__("ray task failed")
            self.cause = cause

    usage = namedtuple("usage", "total used free")
    root = tmp_path / "checkpoints"
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 30, 10 << 30, 4096))
    with pytest.raises(DiskFullError, match=r"checkpoint step_2 \(trainer/optimizer.pt\): it needed more than "
                       r"the 1.1 KiB written before it failed, 4.0 KiB free .*no checkpoint was written before"):
        with checkpoint_writer(root, 2) as tmp:
            _fill(tmp)
            raise RayTaskError(RuntimeError("[enforce fail at inline_container.cc:783] . unexpected pos 64 vs 0"))
    class SafetensorError(Exception):  # what safetensors raises, having removed its file
        pass

    with pytest.raises(DiskFullError, match=r"checkpoint step_2 \(model/\*.safetensors\)"):
        with checkpoint_writer(root, 2) as tmp:
            (tmp / "model").mkdir()
            (tmp / "model" / "config.json").write_text("{}")
            raise RayTaskError(SafetensorError("Error while serializing: I/O error: No space left on device "
                                               "(os error 28)"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 30, 1 << 30, 9 << 30))
    with pytest.raises(RayTaskError), checkpoint_writer(root, 2) as tmp:
        raise RayTaskError(RuntimeError("unexpected pos 64 vs 0"))
    assert list(root.iterdir()) == []


def test_a_failed_rewrite_keeps_the_checkpoint_of_the_same_step(tmp_path):
    run = _run_dir(tmp_path, 6)
    good = _with_weights(run, 6)
    with pytest.raises(ValueError, match="refused"), checkpoint_writer(run / "checkpoints", 6) as tmp:
        (tmp / "state.json").write_text("{}")
        raise ValueError("refused")
    assert integrity_problem(good) is None and (good / "COMPLETE").is_file()


# -- the trainer: weights loaded with NaN are refused ------------------------------------------------
def test_trainer_role_refuses_a_checkpoint_whose_weights_are_not_finite(tiny_model_dir, tmp_path):
    pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from bidirl.engines.trainer_config import NonFiniteWeightsError, trainer_wire
    from bidirl.runtime.config import load_config
    from bidirl.runtime.trainer_role import TrainerRole

    wire = trainer_wire(load_config(None, []).trainer, device="cpu", seed=0, steps=4)
    role = TrainerRole(tiny_model_dir, wire)
    role.save(str(tmp_path / "ckpt"))
    weights = tmp_path / "ckpt" / "model" / "model.safetensors"
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(NonFiniteWeightsError, match=f"checkpoint {tmp_path / 'ckpt'}: weight .* holds NaN or inf"):
        TrainerRole(tiny_model_dir, wire).load(str(tmp_path / "ckpt"))
