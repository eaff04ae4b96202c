"""A multi-node Ray cluster on one Linux machine, each node in a network namespace of its own.

For the multi-node tests and benchmarks: node ``k`` runs ``ray start`` (the head for
``k = 0``) inside namespace ``<prefix>-<k>``, reachable only over a veth link to the
head's namespace with an address of a private /24 (``10.213.<net>.0/24``).  Nothing is
routed out of the namespaces: every byte of the cluster's traffic stays between them.
The nodes offer ``devices`` bidirl devices each (the ``bidirl_devices`` resource, see
``runtime/placement.py``) and use Ray's token authentication with a token drawn here.

Everything the cluster makes (namespaces, veth pairs, Ray processes, its temp dir) is
removed by :meth:`NetnsCluster.close`, which is safe to call after a failure half way
through :meth:`NetnsCluster.start`; :meth:`NetnsCluster.leftovers` says what is still there
(the tests assert it is nothing).  A node is *lost* by :meth:`NetnsCluster.kill_node`:
SIGKILL to every process in its namespace, what a machine that dies does to them.

Needs root (namespaces and links) and the ``ip`` tool; :func:`unavailable` says why not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bidirl.runtime.cluster import NO_IDLE_WORKERS

RAY_PORT = 6380
DEVICE_RESOURCE = "bidirl_devices"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def ray_cli() -> str | None:
    """The ``ray`` command of this Python's environment (or on PATH)."""
    own = Path(sys.executable).with_name("ray")
    return str(own) if own.is_file() else shutil.which("ray")


def unavailable() -> str | None:
    """Why a namespace cluster cannot be built here (None: it can)."""
    if ray_cli() is None:
        return "no ray command beside this Python or on PATH"
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network namespaces and veth links need root"
    if shutil.which("ip") is None:
        return "the ip tool (iproute2) is not installed"
    name = f"bidirl-probe-{os.getpid()}"
    out = _ip("netns", "add", name, check=False)
    if out.returncode != 0:
        return f"ip netns add failed: {out.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class NetnsCluster:
    """``nodes`` Ray nodes in namespaces linked to the head's (see the module docstring)."""

    def __init__(self, nodes: int = 2, devices: int = 1, cpus: int | None = None, prefix: str | None = None,
                 net: int | None = None, ray_bin: str | None = None, env: dict | None = None) -> None:
        if nodes not in (1, 2):
            raise ValueError(f"nodes: 1 or 2 (one veth pair links the namespaces), got {nodes}")
        self.n, self.devices, self.cpus = nodes, devices, cpus if cpus is not None else devices
        self.prefix = prefix or f"bdr{os.getpid() % 100000}"
        self.net = net if net is not None else 100 + os.getpid() % 150
        self.ray_bin = ray_bin or ray_cli()
        self.token = secrets.token_hex(32)
        self.tmp = Path(tempfile.mkdtemp(prefix="bidirl-nsray-", dir="/tmp"))  # 0700
        self.extra_env = dict(env or {})
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.procs: dict[int, subprocess.Popen] = {}

    # -- names ------------------------------------------------------------------------
    def ns(self, k: int) -> str:
        return f"{self.prefix}-{k}"

    def ip_of(self, k: int) -> str:
        """Node k's address: 10.213.<net>.(k + 1)."""
        return f"10.213.{self.net}.{k + 1}"

    def link(self, k: int) -> str:
        """Node k's end of the link (its only interface besides loopback)."""
        return f"{self.prefix}{'ab'[k]}"

    @property
    def address(self) -> str:
        return f"{self.ip_of(0)}:{RAY_PORT}"

    def env(self) -> dict:
        """The environment of the cluster's processes and of a driver joining it."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return {**keep, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_DEDUP_LOGS": "0",
                # a dead node is noticed in seconds, not the default half a minute
                "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "10",
                "RAY_health_check_timeout_ms": "3000", **self.extra_env}

    def exec_cmd(self, k: int, *cmd: str) -> list[str]:
        """``cmd`` run inside node ``k``'s namespace."""
        return ["ip", "netns", "exec", self.ns(k), *cmd]

    # -- start ------------------------------------------------------------------------
    def start(self, timeout_s: float = 120) -> NetnsCluster:
        """Namespaces, links and Ray nodes; returns once every node has joined."""
        try:
            self._network()
            for k in range(self.n):
                self._ray_node(k)
                self._wait(lambda k=k: "Ray runtime started" in self.log(k), timeout_s, f"ray node {k}")
            self._wait(lambda: self._nodes_alive() >= self.n, timeout_s, f"{self.n} nodes")
        except BaseException:
            self.close()
            raise
        return self

    def _network(self) -> None:
        for k in range(self.n):
            _ip("netns", "add", self.ns(k))
            self.namespaces.append(self.ns(k))
            _ip("-n", self.ns(k), "link", "set", "lo", "up")
        if self.n == 2:  # a veth pair, one end in each namespace, a /24 of their own
            ends = (self.link(0), self.link(1))
            _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
            self.links += ends
        else:  # one node still gets its address, on a dummy link
            ends = (self.link(0),)
            _ip("link", "add", ends[0], "type", "dummy")
            self.links.append(ends[0])
        for k, end in enumerate(ends):
            _ip("link", "set", end, "netns", self.ns(k))
            _ip("-n", self.ns(k), "addr", "add", f"{self.ip_of(k)}/24", "dev", end)
            _ip("-n", self.ns(k), "link", "set", end, "up")

    def _ray_node(self, k: int) -> None:
        res = json.dumps({DEVICE_RESOURCE: self.devices})
        cmd = [self.ray_bin, "start", "--block", "--node-ip-address", self.ip_of(k), "--num-cpus", str(self.cpus),
               "--resources", res, "--temp-dir", str(self.tmp / f"n{k}"), "--disable-usage-stats"]
        if k == 0:
            cmd += ["--head", "--port", str(RAY_PORT), "--include-dashboard", "false",
                    "--system-config", json.dumps(NO_IDLE_WORKERS)]  # as a local run (runtime/cluster.py)
        else:
            cmd += ["--address", self.address]
        log = open(self.tmp / f"node{k}.log", "w")
        # torch.distributed (gloo) finds its interface by the host name, which names no
        # interface of a namespace: tell it which one (what a real cluster sets too)
        env = {**self.env(), "GLOO_SOCKET_IFNAME": self.link(k), "PYTHONUNBUFFERED": "1"}  # the log says when it is up
        self.procs[k] = subprocess.Popen(self.exec_cmd(k, "nice", "-n", "19", *cmd), env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _nodes_alive(self) -> int:
        code = ("import ray,sys\nray.init(address=sys.argv[1], logging_level='error')\n"
                "print('ALIVE', sum(1 for n in ray.nodes() if n['Alive']))")
        out = subprocess.run(self.exec_cmd(0, sys.executable, "-c", code, self.address), env=self.env(),
                             capture_output=True, text=True, timeout=120)
        for line in out.stdout.splitlines():
            if line.startswith("ALIVE "):
                return int(line.split()[1])
        return 0

    def _wait(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for k, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"ray node {k} exited ({p.returncode}): {self.log(k)[-2000:]}")
            if cond():
                return
            time.sleep(1.0)
        raise TimeoutError(f"{what} did not come up in {timeout_s:.0f} s: {self.log(0)[-2000:]}")

    def log(self, k: int) -> str:
        p = self.tmp / f"node{k}.log"
        return p.read_text(errors="replace") if p.is_file() else ""

    # -- faults and teardown ------------------------------------------------------------
    def pids(self, k: int) -> list[int]:
        """Every process in node ``k``'s namespace (Ray's daemons and workers, a driver)."""
        if self.ns(k) not in self.namespaces:
            return []
        out = _ip("netns", "pids", self.ns(k), check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_node(self, k: int, sig: int = signal.SIGKILL) -> list[int]:
        """Every process of node ``k`` gets ``sig``: the node is gone.  Returns the pids."""
        pids = self.pids(k)
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        return pids

    def close(self, grace_s: float = 2.0) -> None:
        """Stop every process in the namespaces (SIGTERM, then SIGKILL after ``grace_s``),
        delete the namespaces (their veth ends go with them) and the temp dir."""
        for k in range(self.n):
            self.kill_node(k, signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(self.pids(k) for k in range(self.n)):
            time.sleep(0.2)
        for _ in range(50):
            left = [p for k in range(self.n) for p in self.kill_node(k, signal.SIGKILL)]
            if not left:
                break
            time.sleep(0.2)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in list(self.namespaces):
            _ip("netns", "del", name, check=False)
            self.namespaces.remove(name)
        for link in self.links:  # normally gone with its namespace; a half-made pair may not be
            _ip("link", "del", link, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the cluster is still on the machine (empty after ``close``)."""
        left = []
        names = set(_ip("netns", "list", check=False).stdout.split())
        left += [f"namespace {self.ns(k)}" for k in range(self.n) if self.ns(k) in names]
        links = _ip("-o", "link", check=False).stdout
        left += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if self.prefix in line]
        left += [f"process {p.pid} (node {k})" for k, p in self.procs.items() if p.poll() is None]
        ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        left += [f"process {line.strip()[:120]}" for line in ps.splitlines() if str(self.tmp) in line]
        if self.tmp.exists():
            left.append(f"directory {self.tmp}")
        return left

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
