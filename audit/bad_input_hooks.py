"""The bad-input cases that need more than one command line: issue 43's faults.

``audit/bad_input_cases.py`` runs each case as one ``bidirl`` subprocess; the cases here add
what happens around it, through the hooks a :class:`~audit.bad_input_cases.Case` takes:

- set-ups (``setup``): model directories bidirl cannot use, built locally (nothing is
  downloaded: a config.json, and for the small-vocabulary one bidirl's own tiny tokenizer);
  a real run whose newest checkpoint then gets random bytes in the middle of its weights;
- actions while the command runs (``during``): note the run's private Ray directory
  (``/tmp/bidirl-ray-*`` whose ``owner`` is the driver, ``runtime/leftovers.py``), send
  SIGTERM 4 s after the start, SIGKILL the driver once its workers are up;
- checks (``check``): nothing of the run left once it ended (or once the next ``bidirl``
  command ran, after a SIGKILL): no directory, no process carrying its mark, no new
  ``/tmp/vllm_dist_*`` file; the damaged checkpoint passed over and the run finished sound;
- :data:`PROBE`, the command a ``probe`` case runs instead of ``python -m bidirl.cli``: the
  same ``main``, then it records whether Ray, vLLM or torch was imported (none may be, for
  an error meant to come before any worker starts).

A run's stdout and stderr go to files beside the case's directory (:func:`log`), not into
it (some cases pass the directory itself as an argument), so that ``during`` can read them
while it runs.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.measure import ROOT, run_env
from bidirl.runtime.leftovers import MARK_VAR, OWNER

LEFTOVER_WAIT_S = 20.0
"""How long a check waits for a run's directory and processes to go (Ray's agents take a moment)."""

PROBE = """\
import json, os, sys
from bidirl.cli import main
try:
    rc = main(sys.argv[1:])
finally:
    with open(os.environ["BIDIRL_BENCH_PROBE"], "w") as f:
        json.dump(sorted(m for m in ("ray", "vllm", "torch") if m in sys.modules), f)
sys.exit(rc)
"""


def cli_env() -> dict[str, str]:
    """The environment of every case's subprocess: Ray's settings, this checkout's ``src`` first."""
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def log(d: Path, what: str) -> Path:
    """Where the case of directory ``d`` keeps ``what`` (``stdout``, ``stderr``, ``imported``, ``ray_dir``)."""
    return d.with_name(f"{d.name}.{what}")


def _stderr(d: Path) -> str:
    try:
        return log(d, "stderr").read_text(errors="replace")
    except OSError:
        return ""


def _bidirl(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bidirl.cli", *args], cwd=cwd, env=cli_env(), text=True,
                          capture_output=True, timeout=timeout)


# -- before any worker starts: what was imported ---------------------------------------------------
def heavy_imports(d: Path, stderr: str = "") -> str | None:
    """For a ``probe`` case: what is wrong with what it imported (None: no Ray, vLLM or torch)."""
    try:
        heavy = json.loads(log(d, "imported").read_text())
    except (OSError, ValueError):
        return "the probe did not record its imports"
    return f"imported {', '.join(heavy)} (a worker may have started)" if heavy else None


# -- model directories (no weights: config.json and tokenizer files are all the check reads) --------
def _config_dir(path: Path, **config) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_bert_model(path: Path) -> None:
    """A BERT masked-LM directory (vLLM runs it only for pooling)."""
    _config_dir(path, architectures=["BertForMaskedLM"], model_type="bert", hidden_size=768, num_attention_heads=12,
                num_hidden_layers=12, intermediate_size=3072, vocab_size=30522, max_position_embeddings=512,
                type_vocab_size=2, torch_dtype="float32")
    (path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                            "do_lower_case": True}))


def write_vision_language_model(path: Path) -> None:
    """A Qwen2-VL directory's config (a vision tower: images in the prompt)."""
    _config_dir(path, architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl", hidden_size=1536,
                num_attention_heads=12, vocab_size=151936, torch_dtype="bfloat16", vision_config={"depth": 2})


def small_vocab_model(d: Path) -> None:
    """``d/small_vocab``: bidirl's tiny Qwen2 config and tokenizer, ``vocab_size`` 200 (the
    tokenizer has more tokens).  A set-up, not a fixture: it imports transformers (seconds)."""
    from bidirl.models.tiny import build_tokenizer, tiny_config  # lazy: pulls in transformers

    path = d / "small_vocab"
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(2, 128, 4, 2)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, "vocab_size": 200}))


# -- a damaged newest checkpoint ---------------------------------------------------------------------
def scribble(path: Path, seed: int = 0) -> None:
    """Random bytes into the middle of ``path``: its size, header and markers intact."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = np.random.default_rng(seed).integers(0, 256, 8, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def trained_then_damaged(*args: str) -> Callable[[Path], None]:
    """A set-up: ``bidirl train --run-dir d/run *args`` (which must leave two checkpoints or
    more), then random bytes into the newest checkpoint's ``model/model.safetensors``."""
    def setup(d: Path) -> None:
        out = _bidirl("train", "--run-dir", str(d / "run"), *args, cwd=d)
        if out.returncode != 0:
            raise RuntimeError(f"the first run ended with exit {out.returncode}: {out.stderr.strip()[-300:]}")
        checkpoints = sorted((d / "run" / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
        if len(checkpoints) < 2:
            raise RuntimeError(f"the first run left {len(checkpoints)} checkpoint(s), not two")
        scribble(checkpoints[-1] / "model" / "model.safetensors")
        (d / "damaged.txt").write_text(checkpoints[-1].name)
    return setup


def fell_back_and_finished(steps: int) -> Callable[[Path, str], str | None]:
    """The check of the resume of :func:`trained_then_damaged`'s run of ``steps`` steps: the
    damaged checkpoint named and marked, the previous one used, the run finished with its
    audit ok, finite weights in its last checkpoint, ``steps`` counting the whole run."""
    def check(d: Path, stderr: str) -> str | None:
        from bidirl.runtime.checkpoint_integrity import integrity_problem  # lazy: bidirl from this checkout

        run = d / "run"
        damaged = (d / "damaged.txt").read_text()
        said = [ln for ln in stderr.splitlines() if "is unusable (" in ln and "marked DAMAGED; falling back to" in ln]
        if not said or f"checkpoints/{damaged} is unusable" not in said[0]:
            return f"the damaged {damaged} was not reported as such"
        summary = json.loads((run / "summary.json").read_text())
        if not summary.get("audit_ok"):
            return f"audit failed: {summary.get('audit')}"
        if summary.get("steps") != steps:
            return f"summary.json steps {summary.get('steps')}, not the run's {steps}"
        problem = integrity_problem(run / "checkpoints" / f"step_{steps}")
        return f"the last checkpoint: {problem}" if problem else nothing_left(d, stderr)
    return check


# -- the run's private Ray directory, and what is left of it --------------------------------------------
def private_dir_of(pid: int) -> str | None:
    """The private Ray directory whose owner is ``pid``, if there is one now."""
    for path in glob.glob("/tmp/bidirl-ray-*"):
        try:
            if Path(path, OWNER).read_text().split()[0] == str(pid):
                return path
        except (OSError, IndexError):
            continue
    return None


def marked(directory: str) -> list[tuple[int, str, str]]:
    """(pid, command line, TMPDIR) of every process carrying the mark (``BIDIRL_RAY_DIR``) of
    ``directory``."""
    needle, out = f"{MARK_VAR}={directory}".encode(), []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env:
            tmpdir = next((e[7:].decode() for e in env if e.startswith(b"TMPDIR=")), "")
            out.append((int(pid), cmd, tmpdir))
    return out


def _vllm_dist_files() -> set[str]:
    return set(glob.glob("/tmp/vllm_dist_*"))


def wait_for(cond: Callable[[], object], proc: subprocess.Popen, timeout: float = 300.0) -> object:
    """``cond()`` once it is true, or when ``proc`` has ended or ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    return cond()


def note_private_dir(proc: subprocess.Popen, d: Path, timeout: float = 60.0) -> str | None:
    """A ``during`` hook: wait for the run's private Ray directory and note it (and the
    ``/tmp/vllm_dist_*`` files there were) for :func:`nothing_left`."""
    before = sorted(_vllm_dist_files())
    found = wait_for(lambda: private_dir_of(proc.pid), proc, timeout)
    log(d, "ray_dir").write_text(json.dumps({"dir": found, "vllm_dist_before": before}))
    return found  # type: ignore[return-value]


def sigterm_at(seconds: float) -> Callable[[subprocess.Popen, Path], None]:
    """A ``during`` hook: SIGTERM to the driver ``seconds`` after its start (in start-up)."""
    def during(proc: subprocess.Popen, d: Path) -> None:
        t0 = time.monotonic()
        note_private_dir(proc, d, timeout=seconds)
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        proc.send_signal(signal.SIGTERM)
    return during


def kill_when_workers_up(proc: subprocess.Popen, d: Path) -> None:
    """A ``during`` hook: SIGKILL to the driver (only it) once its workers are up."""
    note_private_dir(proc, d)
    if not wait_for(lambda: "workers up" in _stderr(d), proc, 600):
        return  # ended or stuck before: the exit status tells
    proc.kill()


def nothing_left(d: Path, stderr: str) -> str | None:
    """What is left of the run noted by :func:`note_private_dir` after :data:`LEFTOVER_WAIT_S`
    at most: its directory, processes carrying its mark, new ``/tmp/vllm_dist_*`` files."""
    noted = json.loads(log(d, "ray_dir").read_text())
    directory = noted["dir"]
    if directory is None:
        return "no private Ray directory of the run was seen"
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while True:
        left = ([directory] if os.path.exists(directory) else []) + [f"process {p}" for p, _, _ in marked(directory)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    left += sorted(_vllm_dist_files() - set(noted["vllm_dist_before"]))
    return f"left behind: {', '.join(left)}" if left else None


def sigterm_line_and_nothing_left(d: Path, stderr: str) -> str | None:
    """After SIGTERM: one bidirl line last (none of Ray's C++ stack dump), nothing left. The
    line is the start-up's (still starting at 4 s) or the loop's (a quiet machine may be in it:
    it stops at the first step boundary)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if not last.startswith(("[bidirl] SIGTERM: stopped", "[bidirl] stopped at step 0 by SIGTERM")):
        return f"last line: {last!r}"
    if "SIGTERM received" in stderr or "logging.cc" in stderr:
        return "Ray's stack dump reached stderr"
    return nothing_left(d, stderr)


def next_command_cleans_up(d: Path, stderr: str) -> str | None:
    """After SIGKILL of the driver: the next ``bidirl`` command (any: ``simulate --steps 1``)
    removes the run's directory and stops its Ray processes."""
    directory = json.loads(log(d, "ray_dir").read_text())["dir"]
    stayed = directory is not None and os.path.exists(directory)  # else another bidirl on this machine came first
    out = _bidirl("simulate", "--steps", "1", cwd=d, timeout=300)
    if out.returncode != 0:
        return f"the next command ended with exit {out.returncode}: {out.stderr.strip()[-300:]}"
    if stayed and directory not in out.stderr:
        return f"the next command did not say it cleaned up {directory}"
    return nothing_left(d, stderr)
