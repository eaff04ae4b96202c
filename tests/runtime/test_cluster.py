"""A private local Ray instance: token-authenticated, and it leaves nothing behind."""

import glob
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bidirl.runtime.leftovers import OWNER

pytestmark = [pytest.mark.ray]


def test_private_ray_removes_its_temp_dir_and_kills_what_outlives_it():
    """The instance's dir goes; so does a Ray process of it that outlived ``ray.shutdown`` (a
    stand-in: ``ray::Leftover`` with the instance's token), not a process that is not Ray's."""
    pytest.importorskip("ray")
    from bidirl.runtime.cluster import ray_session

    before = set(glob.glob("/tmp/bidirl-ray-*"))
    with ray_session(num_cpus=1) as ray:
        assert ray.is_initialized()
        # both inherit this process's environment, the instance's token with it
        leftover = subprocess.Popen(["bash", "-c", "exec -a ray::Leftover sleep 300"])
        bystander = subprocess.Popen(["sleep", "300"])
        # ours is the new one Ray's temp dir is in (another run's may come and go meanwhile)
        temp_dir = ray._private.worker._global_node.get_temp_dir_path()
        (mine,) = [d for d in set(glob.glob("/tmp/bidirl-ray-*")) - before if temp_dir.startswith(d + "/")]
        assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700, "only this user may enter it"
    assert not os.path.exists(mine)
    try:
        assert leftover.wait(timeout=10) == -9, "killed with the instance"
        assert bystander.poll() is None, "not Ray's: left alone"
    finally:
        for p in (leftover, bystander):
            p.kill()
            p.wait()


def test_private_ray_refuses_a_client_without_its_token(monkeypatch):
    """Even with ``RAY_AUTH_MODE=disabled`` in the caller's environment, the private instance
    uses a fresh token; a local client without it (or with another) is refused, one with it
    is not; the token is in no file of the instance's temp dir; the environment is as before
    once the instance ends."""
    pytest.importorskip("ray")
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    from bidirl.runtime.cluster import AUTH_VARS, ray_session

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    before = {k: os.environ.get(k) for k in AUTH_VARS}
    with ray_session(num_cpus=1) as ray:
        token = os.environ["RAY_AUTH_TOKEN"]
        assert len(token) == 64 and is_token_auth_enabled()

        @ray.remote(num_cpus=0)
        def one() -> int:
            return 1

        assert ray.get(one.remote()) == 1, "the driver and its workers hold the token"
        gcs = ray.get_runtime_context().gcs_address
        # Another local process reads the cluster's key-value store (what any client does first).
        code = (f"from ray._raylet import GcsClient\n"
                f"print('READ', len(GcsClient(address={gcs!r}).internal_kv_keys(b'', None, timeout=30)))")
        clean = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
        for extra in ({"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                      {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}):
            out = subprocess.run([sys.executable, "-c", code], env={**clean, **extra}, capture_output=True,
                                 text=True, timeout=120)
            if extra.get("RAY_AUTH_TOKEN") == token:  # the control: with the token it reads
                assert out.returncode == 0 and "READ" in out.stdout, out.stderr[-2000:]
            else:
                assert out.returncode != 0 and "READ" not in out.stdout, (extra, out.stdout)
                assert "InvalidAuthToken" in out.stderr, out.stderr[-2000:]
        temp_dir = ray._private.worker._global_node.get_temp_dir_path()
        hits = subprocess.run(["grep", "-rlF", token, temp_dir], capture_output=True, text=True).stdout
        assert hits == "", f"the token is written in {hits}"
    assert {k: os.environ.get(k) for k in AUTH_VARS} == before
    assert not is_token_auth_enabled()


def test_ray_started_in_the_background_serves_and_an_error_meanwhile_leaves_nothing():
    """``ray_session_started``: Ray comes up on a thread while the block goes on, stays up
    after that thread's ``ray.init`` returned (its processes' parent-death signal is tied to
    the thread), and an error raised before ``ready()`` shuts it down and removes its dir."""
    pytest.importorskip("ray")
    import threading

    from bidirl.runtime.cluster import ray_session_started

    with ray_session_started(num_cpus=1) as start:
        ray = start.ready()
        temp_dir = ray._private.worker._global_node.get_temp_dir_path()

        @ray.remote(num_cpus=0)
        def one() -> int:
            return 1

        assert ray.get(one.remote(), timeout=60) == 1
        assert any(t.name == "bidirl-ray-init" for t in threading.enumerate()), "kept until the session ends"
    assert not ray.is_initialized() and not os.path.exists(os.path.dirname(temp_dir)), "its dir is removed"
    assert not any(t.name == "bidirl-ray-init" for t in threading.enumerate())

    class BadData(Exception):
        pass

    before = set(glob.glob("/tmp/bidirl-ray-*"))
    with pytest.raises(BadData), ray_session_started(num_cpus=1):
        raise BadData("found while Ray was starting")
    assert not ray.is_initialized()
    left = [d for d in set(glob.glob("/tmp/bidirl-ray-*")) - before
            if stat.S_IMODE(os.stat(d).st_mode) == 0o700 and _owned_by_this_process(d)]
    assert not left, f"the private instance's dir is left: {left}"


def _owned_by_this_process(directory: str) -> bool:
    """Whether ``directory``'s ``owner`` names this process: a run of another test going on
    beside this one (``pytest -n 2``) makes directories of its own meanwhile."""
    try:
        return Path(directory, OWNER).read_text().split()[0] == str(os.getpid())
    except (OSError, IndexError):
        return False
