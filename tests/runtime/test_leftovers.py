"""A run's private directory, and the next ``bidirl`` cleaning up after a run that was killed.

Stand-ins for Ray's processes (``exec -a ray::...``: the name Ray's agents give themselves)
and a private ``ROOT`` instead of ``/tmp``: no Ray starts, and nothing of another run on
this machine is looked at.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import pytest

from bidirl.runtime import leftovers
from bidirl.runtime.leftovers import MARK_VAR, OWNER, clean_stale_runs, private_dir, stale_dirs


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "tmp"
    r.mkdir()
    monkeypatch.setattr(leftovers, "ROOT", str(r))
    return r


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _run_dir(root, name: str, owner: str | None) -> str:
    d = root / f"bidirl-ray-{name}"
    (d / "r").mkdir(parents=True)
    if owner is not None:
        (d / OWNER).write_text(owner + "\n")
    return str(d)


def _ray_like(name: str, env: dict | None = None, stdout=None) -> subprocess.Popen:
    """A process whose command line reads like one of Ray's (``ray::<name>``)."""
    return subprocess.Popen(["bash", "-c", f"exec -a ray::{name} sleep 300"], env={**os.environ, **(env or {})},
                            stdout=stdout)


def test_private_dir_records_its_owner_and_is_the_workers_tmpdir(root):
    before = {k: os.environ.get(k) for k in (MARK_VAR, "TMPDIR")}
    with private_dir() as d:
        assert d.startswith(str(root / "bidirl-ray-")) and oct(os.stat(d).st_mode & 0o777) == "0o700"
        pid, started = open(os.path.join(d, OWNER)).read().split()
        assert int(pid) == os.getpid() and started == leftovers._start_time(os.getpid())
        assert os.environ[MARK_VAR] == d and os.environ["TMPDIR"] == os.path.join(d, "t")
        out = subprocess.run(["bash", "-c", "mktemp"], capture_output=True, text=True).stdout.strip()
        assert out.startswith(os.path.join(d, "t") + "/"), "a child's temporary files go inside"
        assert not tempfile.gettempdir().startswith(d), "this process's own stay where they were"
        assert stale_dirs() == [], "its owner is alive"
    assert not os.path.exists(d)
    assert {k: os.environ.get(k) for k in (MARK_VAR, "TMPDIR")} == before


def test_stale_means_the_owner_is_gone(root):
    mine = _run_dir(root, "live", f"{os.getpid()} {leftovers._start_time(os.getpid())}")
    dead = _run_dir(root, "dead", f"{_dead_pid()} 123")
    reused = _run_dir(root, "reused", f"{os.getpid()} 1")  # this pid, another start time: pid reused
    fresh = _run_dir(root, "fresh", None)  # no owner: an older bidirl's, or one being made
    old = _run_dir(root, "old", None)
    os.utime(old, (time.time() - 600, time.time() - 600))
    found = dict(stale_dirs())
    assert set(found) == {dead, reused, old}, found
    assert found[dead].startswith("its driver (pid ") and mine not in found and fresh not in found
    assert found[old] == "no Ray instance uses it (written by an older bidirl)"


def test_an_old_directory_without_owner_in_use_by_a_raylet_is_live(root):
    old = _run_dir(root, "old", None)
    os.utime(old, (time.time() - 600, time.time() - 600))
    fake = f"/x/ray/core/src/ray/raylet/raylet --log_dir={old}/r"
    raylet = subprocess.Popen(["bash", "-c", f"exec -a '{fake}' sleep 300"])
    try:
        time.sleep(0.2)
        assert stale_dirs() == [], "a live instance of an older bidirl: left alone"
    finally:
        raylet.kill()
        raylet.wait()
    assert [d for d, _ in stale_dirs()] == [old]


def test_zombie_owner_counts_as_gone(root):
    p = subprocess.Popen(["true"])
    time.sleep(0.3)  # exited, not reaped: a zombie
    try:
        d = _run_dir(root, "zombie", f"{p.pid} {leftovers._start_time(p.pid) or 5}")
        assert [x for x, _ in stale_dirs()] == [d]
    finally:
        p.wait()


def test_clean_stale_runs_stops_only_the_dead_runs_ray_processes(root, capsys):
    dead = _run_dir(root, "dead", f"{_dead_pid()} 123")
    live = _run_dir(root, "live", f"{os.getpid()} {leftovers._start_time(os.getpid())}")
    legacy = _run_dir(root, "legacy", None)
    log = open(os.path.join(legacy, "r", "agent.log"), "w")
    procs = {
        "agent": _ray_like("DashboardAgent", {MARK_VAR: dead}),  # the dead run's: marked
        "legacy_agent": _ray_like("RuntimeEnvAgent", stdout=log),  # an older bidirl's: its log open inside
        "live_agent": _ray_like("DashboardAgent", {MARK_VAR: live}),  # a live run's
        "bystander": subprocess.Popen(["sleep", "300"], env={**os.environ, MARK_VAR: dead}),  # not Ray's
    }
    log.close()
    os.utime(legacy, (time.time() - 600, time.time() - 600))
    try:
        time.sleep(0.3)
        removed = clean_stale_runs()
        assert sorted(removed) == sorted([dead, legacy])
        assert procs["agent"].wait(timeout=10) == -9 and procs["legacy_agent"].wait(timeout=10) == -9
        assert procs["live_agent"].poll() is None and procs["bystander"].poll() is None
        assert not os.path.exists(dead) and not os.path.exists(legacy) and os.path.isdir(live)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("[bidirl] cleaned up after 2 run(s) that did not end cleanly: "
                                                   "stopped 2 Ray process(es) and removed "), err
        assert clean_stale_runs() == [] and capsys.readouterr().err == "", "nothing left: silent"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.cleans_leftovers
def test_every_cli_command_cleans_up_after_dead_runs_first(root, capsys):
    """``bidirl``'s entry point runs the cleanup before the command itself (``cli.main``)."""
    from bidirl.cli import main

    dead = _run_dir(root, "dead", f"{_dead_pid()} 123")
    assert main(["train", "--run-dir", "", "no_such_key=1"]) == 2
    assert not os.path.exists(dead)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("[bidirl] cleaned up after 1 run(s) that did not end cleanly: removed "), err
    assert err[1].startswith("bidirl train: error: "), err
