"""Make a probe snapshot: ``git archive COMMIT`` into DIR, plus the micro-batch hook.

    python bench/microbatch_probe/snapshot.py COMMIT DIR

The hook (three small edits, applied here so that ``src/`` carries no diagnostic code):
``runtime/trainer_role.py`` wraps each micro-batch's timed call in ``mbprobe.Probe`` when
``BIDIRL_PROBE_DIR`` is set, and ``runtime/worker.py`` tells the trainer its role and device.
Run pairs from DIR with ``run_pair.sh``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMED = """            t0 = time.perf_counter()
            part = self.trainer.compute_chunk_grads([ts], total_tokens, per_microbatch=True)
            took = time.perf_counter() - t0"""
PROBED = """            import os as _os
            from contextlib import nullcontext as _nc
            _pr = _nc()
            if _os.environ.get("BIDIRL_PROBE_DIR"):
                from bidirl.runtime._mbprobe import Probe
                _ll = [len(s.prompt_ids) + len(s.response_ids) for s in ts]
                _pr = Probe(getattr(self, "_probe_role", "?"), sum(_ll), _ll)
            with _pr:
                t0 = time.perf_counter()
                part = self.trainer.compute_chunk_grads([ts], total_tokens, per_microbatch=True)
                took = time.perf_counter() - t0"""
HOSTED = """            if ckpt:
                r.load(ckpt)
            self.roles[role] = r"""
TAGGED = """            if ckpt:
                r.load(ckpt)
            r._probe_role = f"{role}@{self.pool}{self.device}"
            self.roles[role] = r"""


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path}: the code to hook is not there (the snapshot's code moved on)")
    path.write_text(text.replace(old, new, 1))


def main(commit: str, out: str) -> None:
    root, dest = HERE.parents[1], Path(out)
    dest.mkdir(parents=True, exist_ok=False)
    tar = subprocess.run(["git", "archive", commit], cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    rt = dest / "src/bidirl/runtime"
    shutil.copy(HERE / "mbprobe.py", rt / "_mbprobe.py")
    _patch(rt / "trainer_role.py", TIMED, PROBED)
    _patch(rt / "worker.py", HOSTED, TAGGED)
    print(f"probe snapshot of {commit} in {dest}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
