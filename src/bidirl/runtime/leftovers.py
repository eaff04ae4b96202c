"""What a run's private Ray instance keeps in ``/tmp``, and cleaning up after runs that could not.

A private instance (``runtime/cluster.py``) lives in its own ``/tmp/bidirl-ray-XXXXXXXX/``
(mode 0700), made by :func:`private_dir`:

- ``r/``: Ray's temp dir (sockets, logs, spilled objects);
- ``t/``: ``TMPDIR`` of every process the instance starts, so the temporary files of the
  workers go there and with it (vLLM's ``vllm_dist_*`` rendezvous files among them: a run
  used to leave two in ``/tmp`` each time);
- ``owner``: the driver's pid and its start time (``/proc/PID/stat``), so that a later
  ``bidirl`` can tell a live run's directory from a dead one's even after the pid is reused;

and every process it starts carries ``BIDIRL_RAY_DIR=<that directory>`` in its environment
(Ray's processes inherit the driver's environment, as they do the run's token).

A run that ends in any way Python sees (an error, a signal) removes the directory and stops
its Ray processes on the way out.  A driver killed with SIGKILL cannot: its GCS and raylet
die with it (their parent-death signal), but Ray's agents live on for minutes (one still
listening on loopback) and the directory stays.  :func:`clean_stale_runs`, which every
``bidirl`` command calls first, removes those: a directory of this user whose owner is
gone, after SIGKILLing the Ray processes that belong to it (its ``BIDIRL_RAY_DIR``, or for
a directory of an older bidirl without ``owner``, a command line or open file inside it).
Never ``ray stop``, never a process of a live run, never another user's directory.  A
directory without ``owner`` counts as dead only when it is over a minute old and no GCS or
raylet uses it (a live run's always do).  ``vllm_dist_*`` files that older bidirl versions
left in ``/tmp`` name no process and are left alone.

Linux only (``/proc``); elsewhere nothing is cleaned.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = "/tmp"
PREFIX = "bidirl-ray-"
OWNER = "owner"
MARK_VAR = "BIDIRL_RAY_DIR"
NO_OWNER_GRACE_S = 60.0
"""A directory without ``owner`` younger than this may be a run starting: left alone."""

RAY_PROCESS_NAMES = ("ray::", "ray/_private/", "ray/core/src/ray/", "ray/dashboard/", "ray/autoscaler/")
"""How a Ray process's command line starts or reads: a worker or agent after it names itself
(``ray::DeviceWorker``, ``ray::DashboardAgent``) and before (``default_worker.py``,
``dashboard/agent.py``, ``runtime_env/agent/main.py``, ``log_monitor.py``), or Ray's own
binaries (``gcs_server``, ``raylet``)."""
RAY_DAEMONS = "ray/core/src/ray/"
"""The GCS and the raylet: a live instance always has them."""


# -- a run's own directory --------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int, started: str) -> bool:
    """Whether process ``pid`` is the one that started at ``started`` ("None": unknown, then
    whether ``pid`` exists at all)."""
    now = _start_time(pid)
    if started != "None":
        return now == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextmanager
def private_dir():
    """A fresh ``/tmp/bidirl-ray-XXXXXXXX/`` as the module docstring describes; for the
    block, ``BIDIRL_RAY_DIR`` and ``TMPDIR`` of this process's environment point into it
    (its children, Ray's processes, inherit them; this process's ``tempfile`` keeps its
    own directory); afterwards both are as before and the directory is gone.  Yields its path."""
    tempfile.gettempdir()  # cached now: this process's own temporary files stay where they were
    tmp = tempfile.mkdtemp(prefix=PREFIX, dir=ROOT)
    saved = {k: os.environ.get(k) for k in (MARK_VAR, "TMPDIR")}
    try:
        Path(tmp, OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        os.mkdir(os.path.join(tmp, "t"))
        os.environ.update({MARK_VAR: tmp, "TMPDIR": os.path.join(tmp, "t")})
        yield tmp
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


# -- processes --------------------------------------------------------------------------------
def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return None


def ray_processes() -> list[tuple[int, str, list[bytes]]]:
    """(pid, command line, environment) of every Ray process of this machine this user may read."""
    out = []
    try:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and int(e.name) != os.getpid()]
    except OSError:
        return out
    for pid in pids:
        cmd, env = _read(f"/proc/{pid}/cmdline"), _read(f"/proc/{pid}/environ")
        if cmd is None or env is None:
            continue
        cmd = cmd.replace(b"\0", b" ").decode(errors="replace")
        if any(name in cmd for name in RAY_PROCESS_NAMES):
            out.append((pid, cmd, env.split(b"\0")))
    return out


def _uses(pid: int, cmd: str, env: list[bytes], directory: str) -> bool:
    """Whether the process belongs to the instance in ``directory``: its mark, its command
    line, or a file it holds open (an agent that renamed itself keeps its logs open)."""
    if f"{MARK_VAR}={directory}".encode() in env or directory + "/" in cmd:
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(directory + "/"):
                return True
        except OSError:
            continue
    return False


def kill_processes(pids) -> list[int]:
    """SIGKILL each pid; the ones that were still there."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def kill_ray_processes_with(env_entry: str) -> list[int]:
    """SIGKILL every Ray process holding ``env_entry`` (``NAME=value``) in its environment;
    a process that is not Ray's, whatever its environment, is never touched."""
    needle = env_entry.encode()
    return kill_processes(pid for pid, _, env in ray_processes() if needle in env)


# -- dead runs' directories ----------------------------------------------------------------------
def stale_dirs(now: float | None = None) -> list[tuple[str, str]]:
    """(directory, why it is stale) for each ``/tmp/bidirl-ray-*`` of this user whose run is gone."""
    now = time.time() if now is None else now
    out, daemons = [], None
    try:
        names = sorted(e.name for e in os.scandir(ROOT) if e.name.startswith(PREFIX))
    except OSError:
        return out
    for name in names:
        d = os.path.join(ROOT, name)
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not os.path.isdir(d) or os.path.islink(d):
            continue
        owner = _read(os.path.join(d, OWNER))
        if owner is not None:
            try:
                pid, started = owner.decode().split()
                pid = int(pid)
            except ValueError:
                continue  # being written this instant, or not ours to judge
            if not _alive(pid, started):
                out.append((d, f"its driver (pid {pid}) is gone"))
            continue
        if now - st.st_mtime < NO_OWNER_GRACE_S:
            continue
        if daemons is None:
            daemons = [p for p in ray_processes() if RAY_DAEMONS in p[1]]
        if not any(_uses(pid, cmd, env, d) for pid, cmd, env in daemons):
            out.append((d, "no Ray instance uses it (written by an older bidirl)"))
    return out


def clean_stale_runs(err=None) -> list[str]:
    """Remove the directories of runs whose driver is gone and SIGKILL the Ray processes that
    belong to them (module docstring); one line on ``err`` (stderr) when anything was
    cleaned.  Returns the directories removed."""
    stale = stale_dirs()
    if not stale:
        return []
    procs = ray_processes()
    killed = kill_processes(pid for pid, cmd, env in procs if any(_uses(pid, cmd, env, d) for d, _ in stale))
    for d, _ in stale:
        shutil.rmtree(d, ignore_errors=True)
    reasons = "; ".join(f"{d} ({why})" for d, why in stale)
    what = f"stopped {len(killed)} Ray process(es) and removed " if killed else "removed "
    print(f"[bidirl] cleaned up after {len(stale)} run(s) that did not end cleanly: {what}{reasons}",
          file=err or sys.stderr)
    return [d for d, _ in stale]
