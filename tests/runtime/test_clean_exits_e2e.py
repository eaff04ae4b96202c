"""End to end: whatever ends a run, nothing of it is left once the next ``bidirl`` has run.

Three real runs of the CLI: a SIGTERM 4 s after the start (one bidirl line, exit 143, no
stack dump from Ray), a driver killed with SIGKILL once its workers are up (its directory
and agents stay until the next ``bidirl`` command, which removes them), and a normal run.
Each run is followed by its own private directory (``/tmp/bidirl-ray-*`` whose ``owner``
is the driver's pid) and the processes carrying its mark: other runs on this machine are
never counted.  About a minute and a half on 2 cores.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from runtime_cli_helpers import ROOT, SMALL, bidirl_cmd, run_cli

from audit.bad_input_hooks import marked, private_dir_of, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ARGS = [*SMALL, "cluster.prewarm=false", "run.tensorboard=false", "run.plot=false"]
ENV = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")


def _start(run: Path, err: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(bidirl_cmd("train", "--run-dir", str(run), *ARGS, *extra), cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=err.open("w"), start_new_session=True)


def _gone(d: str, timeout: float = 20.0) -> list:
    """What is left of directory ``d``'s run after ``timeout`` s at most: [] when nothing."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = ([d] if os.path.exists(d) else []) + marked(d)
        if not left:
            return []
        time.sleep(0.5)
    return left


def test_nothing_is_left_after_a_sigterm_a_sigkill_and_a_normal_run(tmp_path, real_runtime_available):
    # 1. SIGTERM 4 s after the start
    err = tmp_path / "sigterm.txt"
    t0 = time.time()
    proc = _start(tmp_path / "run1", err, "run.steps=3")
    try:
        mine = wait_for(lambda: private_dir_of(proc.pid), proc, timeout=30)
        time.sleep(max(0.0, t0 + 4.0 - time.time()))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = err.read_text()
    assert "Traceback" not in text and "SIGTERM received" not in text and "logging.cc" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    # 4 s in, a loaded machine is still starting (the driver's handler unwinds at once) and a
    # quiet one may have reached the loop (stop at the first step boundary): one line either way
    starting = "[bidirl] SIGTERM: stopped; Ray and its agents stopped, temporary files removed"
    in_loop = "[bidirl] stopped at step 0 by SIGTERM; resume with: bidirl train --resume "
    assert last.startswith((starting, in_loop)), last
    assert f"bidirl train --resume {tmp_path / 'run1'}" in last or "nothing was trained or kept" in last, last
    assert mine and _gone(mine) == []

    # 2. SIGKILL once the workers are up: the directory and Ray's agents stay behind
    err = tmp_path / "sigkill.txt"
    proc = _start(tmp_path / "run2", err, "run.steps=50")
    try:
        mine = wait_for(lambda: private_dir_of(proc.pid), proc, timeout=30)
        assert wait_for(lambda: "workers up" in err.read_text(), proc), err.read_text()[-3000:]
        workers = [(pid, tmpdir) for pid, cmd, tmpdir in marked(mine) if "DeviceWorker" in cmd]
        assert workers and all(t == os.path.join(mine, "t") for _, t in workers), workers
        assert glob.glob(os.path.join(mine, "t", "vllm_dist_*")), "vLLM's rendezvous file is the run's"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    time.sleep(2)
    assert os.path.exists(mine), "a killed driver cannot clean up"
    out = run_cli("simulate", "--steps", "2")  # the next bidirl command, any
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{mine} (its driver (pid {proc.pid}) is gone)" in out.stderr, out.stderr[-2000:]
    assert _gone(mine) == []

    # 3. a normal run
    err = tmp_path / "normal.txt"
    proc = _start(tmp_path / "run3", err, "run.steps=2")
    try:
        mine = wait_for(lambda: private_dir_of(proc.pid), proc, timeout=30)
        assert proc.wait(timeout=400) == 0, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert mine and _gone(mine) == []
    assert run_cli("simulate", "--steps", "1").returncode == 0
