"""Per-micro-batch probe (diagnostic only): where a micro-batch's wall time goes.

Enabled by BIDIRL_PROBE_DIR in a snapshot made by ``snapshot.py`` (the hook is not in
``src/``); writes one JSON line per micro-batch to DIR/mb-PID.jsonl: wall, thread CPU,
run-queue wait (``/proc/thread-self/schedstat``), switches, migrations, minor faults, GC,
the other threads' CPU in the process, both cores' busy jiffies, and the padded size.
"""
import gc
import json
import os
import resource
import threading
import time

DIR = os.environ.get("BIDIRL_PROBE_DIR")
_gc = {"t": 0.0, "n": 0, "t0": 0.0}


def _gc_cb(phase, info):
    if threading.get_ident() != _main_tid[0]:
        return
    if phase == "start":
        _gc["t0"] = time.perf_counter()
    else:
        _gc["t"] += time.perf_counter() - _gc["t0"]
        _gc["n"] += 1


_main_tid = [None]


def _tasks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = map(int, f.read().split())
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, run, wait)
        except OSError:
            pass
    return out


def _cpus():
    with open("/proc/stat") as f:
        rows = [r.split() for r in f if r.startswith("cpu") and r[3].isdigit()]
    # busy (user nice system irq softirq), idle, steal: jiffies
    return [(int(r[1]) + int(r[2]) + int(r[3]) + int(r[6]) + int(r[7]), int(r[4]), int(r[8])) for r in rows]


def _sched():
    d = {}
    with open("/proc/thread-self/sched") as f:
        for line in f:
            if ":" in line:
                k, v = line.split(":", 1)
                k = k.strip()
                if k in ("se.nr_migrations", "nr_voluntary_switches", "nr_involuntary_switches"):
                    d[k] = int(float(v.strip()))
    with open("/proc/thread-self/schedstat") as f:
        d["run"], d["wait"], _ = map(int, f.read().split())
    with open("/proc/thread-self/stat") as f:
        d["cpu"] = int(f.read().rsplit(")", 1)[1].split()[36])
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    d["minflt"], d["utime"], d["stime"] = ru.ru_minflt, ru.ru_utime, ru.ru_stime
    return d


class Probe:
    def __init__(self, role: str, tokens: int, lens=()):
        self.role, self.tokens, self.lens = role, tokens, list(lens)

    def __enter__(self):
        if _main_tid[0] is None:
            _main_tid[0] = threading.get_ident()
            gc.callbacks.append(_gc_cb)
        _main_tid[0] = threading.get_ident()
        self.g0 = dict(_gc)
        self.tasks0, self.cpus0, self.s0 = _tasks(), _cpus(), _sched()
        self.tt0, self.w0 = time.thread_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        wall, tt = time.perf_counter() - self.w0, time.thread_time() - self.tt0
        s1, cpus1, tasks1 = _sched(), _cpus(), _tasks()
        me = threading.get_native_id()
        others = []
        for tid, (name, run, _wait) in tasks1.items():
            if tid == me or tid not in self.tasks0:
                continue
            d = run - self.tasks0[tid][1]
            if d > 0:
                others.append((d / 1e9, name, tid))
        others.sort(reverse=True)
        import torch

        rec = {"t": time.time(), "pid": os.getpid(), "tid": me, "role": self.role, "tokens": self.tokens,
               "lens": self.lens,
               "padded": len(self.lens) * max(self.lens, default=0),
               "wall": wall, "thread_time": tt, "torch_threads": torch.get_num_threads(),
               "run": (s1["run"] - self.s0["run"]) / 1e9, "wait": (s1["wait"] - self.s0["wait"]) / 1e9,
               "utime": s1["utime"] - self.s0["utime"], "stime": s1["stime"] - self.s0["stime"],
               "minflt": s1["minflt"] - self.s0["minflt"],
               "migr": s1["se.nr_migrations"] - self.s0["se.nr_migrations"],
               "vol": s1["nr_voluntary_switches"] - self.s0["nr_voluntary_switches"],
               "invol": s1["nr_involuntary_switches"] - self.s0["nr_involuntary_switches"],
               "cpu0": self.s0["cpu"], "cpu1": s1["cpu"],
               "others_s": sum(o[0] for o in others), "top_others": others[:4],
               "sys": [[a[i] - b[i] for i in range(3)] for a, b in zip(cpus1, self.cpus0)],
               "gc_s": _gc["t"] - self.g0["t"], "gc_n": _gc["n"] - self.g0["n"],
               "affinity": sorted(os.sched_getaffinity(0))}
        with open(os.path.join(DIR, f"mb-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        return False
