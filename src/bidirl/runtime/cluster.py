"""Start, join and stop Ray for a run, loopback-only by default.

A local run must not listen on the machine's external interface and must never kill
other users' Ray processes (so no ``ray stop``): we start a private instance with its own
temp dir, shut down only that one, and remove its temp dir when it ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager

LOCAL_ENV = {
    # Ray binds 127.0.0.1 instead of the external interface with this set.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
}


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, log_level: str = "warning"):
    """Yield an initialised Ray; start a private loopback instance unless ``address``.

    Workers' output still reaches the driver (``log_to_driver``: a worker's warning or
    traceback is seen); Ray's own logging is at ``log_level`` (``run.worker_log_level``)."""
    for k, v in LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        yield ray
        return
    tmp = None
    level = getattr(logging, log_level.upper())
    if address:
        ray.init(address=address, log_to_driver=True, logging_level=level)
    else:
        # Short path: Ray's unix socket names must stay under ~107 characters.
        tmp = tempfile.mkdtemp(prefix="bidirl-ray-", dir="/tmp")
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=tmp,
                 _node_ip_address="127.0.0.1", log_to_driver=True,
                 configure_logging=False, logging_level=level)
    try:
        yield ray
    finally:
        ray.shutdown()
        if tmp is not None:  # the private instance's sockets, logs and object spill go with it
            shutil.rmtree(tmp, ignore_errors=True)
