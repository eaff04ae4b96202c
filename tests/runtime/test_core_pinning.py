"""Device workers of a local CPU cluster are pinned one to a core (``cluster.pin_cores``)."""

import subprocess
import sys
import textwrap

import pytest

from bidirl.runtime.config import load_config
from bidirl.runtime.placement import device_cores


def test_each_device_gets_its_own_core_in_the_order_the_process_may_use_them():
    cfg = load_config(None, [])  # 1 rollout + 1 training device
    assert device_cores(cfg, cores=[0, 1]) == {0: 0, 1: 1}
    assert device_cores(cfg, cores=[3, 5, 7]) == {0: 3, 1: 5}


@pytest.mark.parametrize("override", ["cluster.pin_cores=false", "cluster.device=cuda",
                                      "cluster.ray_address=127.0.0.1:6379"])
def test_no_pinning_when_off_on_gpus_or_across_nodes(override):
    assert device_cores(load_config(None, [override]), cores=[0, 1]) is None


def test_no_pinning_when_devices_must_share_cores():
    cfg = load_config(None, ["cluster.rollout_devices=2", "cluster.train_devices=2", "cluster.oversubscribe=true"])
    assert device_cores(cfg, cores=[0, 1]) is None
    assert device_cores(cfg, cores=[0, 1, 2, 3]) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_pinning_covers_threads_started_before_and_after():
    """Ray starts threads before the actor's ``__init__``; vLLM starts its own after: both
    end up on the core.  Run in a child process: affinity is the process's own."""
    code = textwrap.dedent("""
        import os, threading, time
        from bidirl.runtime.worker import pin_to_core
        stop = threading.Event()
        before = threading.Thread(target=stop.wait, daemon=True); before.start()
        core = sorted(os.sched_getaffinity(0))[-1]
        n = pin_to_core(core)
        after = threading.Thread(target=stop.wait, daemon=True); after.start()
        tasks = os.listdir("/proc/self/task")
        seen = {int(t): os.sched_getaffinity(int(t)) for t in tasks}
        stop.set()
        assert n >= 2, n
        assert len(seen) >= 3 and all(s == {core} for s in seen.values()), seen
        print("ok", core, len(seen))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")
