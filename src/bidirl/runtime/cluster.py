"""Start, join and stop Ray for a run, loopback-only and token-authenticated by default.

A local run must not listen on the machine's external interface and must never kill
other users' Ray processes (so no ``ray stop``): we start a private instance with its own
temp dir, shut down only that one, and remove its temp dir when it ends.  That directory
(``runtime/leftovers.py``) also records the driver as its owner and is the ``TMPDIR`` of
every process the instance starts (vLLM's ``vllm_dist_*`` files go with it); what a driver
killed outright leaves is removed by the next ``bidirl`` command.  In the driver, Ray's
C++ failure-signal handler is switched off (:func:`_keep_driver_signals`): the driver's
own SIGINT/SIGTERM handlers (``runtime/exits.py``, ``runtime/stops.py``) stay in charge.

Loopback alone does not keep other users of a shared host out: any local account can
connect to a port on 127.0.0.1, and a Ray cluster runs whatever code a client sends it.
So the private instance uses Ray's token authentication (the pinned Ray 2.60 has it):
every run draws a fresh random token (256 bits), puts it in this process's environment
(``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``), which Ray's own processes inherit, and
takes both out again when the instance ends.  The token is written to no file and no
log; ``/proc/PID/environ`` shows it only to the same user (and root), who could reach
the run's processes anyway.  A client without it is refused
(``tests/runtime/test_cluster.py``).  Whatever ``RAY_AUTH_MODE`` the caller's environment
holds, a private instance is always authenticated; joining a cluster (``--ray-address``)
leaves authentication to that cluster's settings in the environment (``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``, as its nodes were started with).

Joining a cluster (``cluster.ray_address``): this process is a driver on one of the
cluster's nodes, reached by the others at the address Ray finds for it towards the head
(the route to the head's address: the cluster's interface, never a loopback one); Ray's
multi-node mode is switched on for it whatever the environment said (a loopback-only
driver cannot be reached by workers on other nodes).  What it listens on itself is Ray's
driver (the cluster's address) and, on the primary trainer's first node, the
data-parallel rendezvous on that node's cluster address (``runtime/placement.py``).
Ray's temp dir
(sockets, logs, spilled objects; Ray makes it world-writable) lies inside a 0700
directory of ours, so other users cannot enter it either.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from contextlib import contextmanager

from bidirl.runtime.leftovers import kill_ray_processes_with, private_dir

LOCAL_ENV = {
    # Ray binds 127.0.0.1 instead of the external interface with this set.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    # Ray starts its workers at nice 15; here they are the run itself (vLLM, torch), so they
    # run at the driver's priority instead of yielding to every other process on the machine.
    "RAY_worker_niceness": "0",
}
# Ray starts one idle Python worker per CPU when the driver connects, for tasks to come; a
# run's device workers carry their own environment (``runtime_env``), so they never use
# those, and the idle ones only took the two cores from the driver's start-up (a short run
# 32-34 s without them against 35-38 s with, 3 interleaved pairs here).
NO_IDLE_WORKERS = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}
CLUSTER_MODE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray binds loopback only, one node
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _reload_auth() -> None:
    """Make this process's Ray read the authentication variables again.

    Ray caches the mode (in its config) and the token (in its token loader) the first
    time it reads them, which in a process that imported Ray earlier (a test run) is
    before ``private_token`` set them.  The config goes first: Ray's own tests do the
    same, so that a draining gRPC thread never finds token mode without a token."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def kill_leftovers(token: str) -> list[int]:
    """SIGKILL every Ray process of this machine still holding ``token`` in its environment.

    ``ray.shutdown`` stops the GCS and the raylet but does not wait for the workers: one still
    starting (a device worker restarted after a fault, in the middle of importing vLLM) lives
    on for tens of seconds, takes a core, and re-creates the instance's temp directory when it
    writes its log (seen in the test suite, 40 s after its run).  The private instance's token
    is in every process it started and in no other Ray's (a fresh one per instance), so it
    names them; a process that is not Ray's (whatever its environment) is never touched.
    Linux only (``/proc``); elsewhere nothing is done.
    """
    return kill_ray_processes_with(f"RAY_AUTH_TOKEN={token}")


@contextmanager
def private_token():
    """A fresh token and token mode in ``os.environ`` for the duration; then as before.

    On the way out, any Ray process still holding the token is killed (:func:`kill_leftovers`)."""
    saved = {k: os.environ.get(k) for k in AUTH_VARS}
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    token = secrets.token_hex(32)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    _reload_auth()
    try:
        yield
    finally:
        kill_leftovers(token)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_auth()


class RayStart:
    """``ray.init`` running on a thread of its own while the caller goes on.

    A run's driver spends its first seconds loading the tokenizer (transformers imports
    torch: ~7 s here) and measuring the prompts; Ray's start (~5-6 s: its GCS and raylet
    processes) overlaps it instead of following it.  ``ready()`` waits for the start and
    returns ``ray`` (or raises what ``ray.init`` raised).

    The thread lives until :meth:`close`: Ray starts its GCS and raylet with a parent-death
    signal, which Linux ties to the *thread* that started them, so a thread that ended after
    ``ray.init`` would take them with it (seen: "Failed to connect to GCS within 60 seconds").
    """

    def __init__(self, init) -> None:
        self._error: BaseException | None = None
        self._started = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(init,), name="bidirl-ray-init", daemon=True)
        self._thread.start()

    def _run(self, init) -> None:
        try:
            init()
        except BaseException as e:  # handed to ready(), in the caller's thread
            self._error = e
        finally:
            self._started.set()
        self._closed.wait()  # Ray's processes live as long as this thread (see the class doc)

    def wait(self) -> None:
        self._started.wait()

    def ready(self):
        self.wait()
        if self._error is not None:
            raise self._error
        import ray

        return ray

    def close(self) -> None:
        """After ``ray.shutdown(wait_for_processes=True)``: let the thread end.  Ended while
        Ray's processes were still stopping, its parent-death signal SIGKILLed the raylet
        mid-stop, and a worker it had not stopped yet lived on (and re-created the temp dir)."""
        self._closed.set()
        self._thread.join()


class _NotMainThread(logging.Filter):
    """Ray's warning that ``ray.init`` off the main thread sets no SIGTERM handler: the run
    installs its own (``runtime/stops.py``) once Ray is up, so the line says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, log_level: str = "warning"):
    """Yield an initialised Ray; start a private loopback instance unless ``address``.

    Workers' output still reaches the driver (``log_to_driver``: a worker's warning or
    traceback is seen); Ray's own logging is at ``log_level`` (``run.worker_log_level``)."""
    with _session(address, num_cpus, log_level, background=False) as ray:
        yield ray


@contextmanager
def ray_session_started(address: str | None = None, num_cpus: int | None = None, log_level: str = "warning"):
    """:func:`ray_session` whose ``ray.init`` runs in the background: yields a :class:`RayStart`.

    On leaving, the start is waited for, then Ray is shut down as ``ray_session`` does, so
    an error in the caller's block (bad data found while Ray starts) leaves nothing behind."""
    with _session(address, num_cpus, log_level, background=True) as start:
        yield start


@contextmanager
def _in_foreground(init):
    """``init()`` now; Ray shut down on leaving."""
    import ray

    init()
    try:
        yield ray
    finally:
        ray.shutdown()


@contextmanager
def _in_background(init):
    """``init()`` on a :class:`RayStart` thread; on leaving, the start is waited for and Ray's
    processes end (``wait_for_processes``) before the thread they are tied to does."""
    import ray

    quiet, logger = _NotMainThread(), logging.getLogger("ray._private.worker")
    logger.addFilter(quiet)
    start = RayStart(init)
    try:
        yield start
    finally:
        start.wait()
        logger.removeFilter(quiet)
        try:
            if ray.is_initialized():
                ray.shutdown(wait_for_processes=True)
        finally:
            start.close()


def _keep_driver_signals() -> None:
    """No C++ failure-signal handler in this process (the driver) when Ray connects it.

    Ray's core worker installs one (absl's) for SIGTERM among others, over whatever handler
    the process had: a SIGTERM to the driver then printed a C++ stack dump before anything
    else could run (seen 4 s into a run).  The driver has its own handlers
    (``runtime/exits.py``, ``runtime/stops.py``); Ray reads this switch when it connects, so
    its workers, which import Ray afresh, keep theirs."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


@contextmanager
def _session(address: str | None, num_cpus: int | None, log_level: str, background: bool):
    for k, v in LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    if address:  # a driver other nodes must reach: Ray's cluster mode, not loopback-only
        os.environ[CLUSTER_MODE_VAR] = "1"
    import ray

    _keep_driver_signals()
    if ray.is_initialized():  # a Ray this process already runs: used as it is, never shut down here
        if not background:
            yield ray
            return
        start = RayStart(lambda: None)
        try:
            yield start
        finally:
            start.close()
        return
    started = _in_background if background else _in_foreground
    level = getattr(logging, log_level.upper())
    if address:
        with started(lambda: ray.init(address=address, log_to_driver=True, logging_level=level)) as handle:
            yield handle
        return
    # Short path: Ray's unix socket names must stay under ~107 characters.  Ray makes its
    # temp dir world-writable (chmod 0777); it goes one level inside ours, which mkdtemp
    # makes 0700, so no other user can reach the sockets, logs or spilled objects in it.
    # The directory (runtime/leftovers.py) is the workers' TMPDIR too, records its owner,
    # and goes on leaving, with the sockets, logs, spilled objects and vLLM's files.
    with private_dir() as tmp, private_token():
        with started(lambda: ray.init(num_cpus=num_cpus, include_dashboard=False,
                                      _temp_dir=os.path.join(tmp, "r"), _node_ip_address="127.0.0.1",
                                      log_to_driver=True, configure_logging=False,
                                      logging_level=level, _system_config=NO_IDLE_WORKERS)) as handle:
            yield handle
