"""Sample every process's CPU (jiffies) and the device workers' / driver's threads every PERIOD s.

python syssample.py OUT.jsonl [period]; stops on SIGTERM. Diagnostic only.
"""
import json
import os
import signal
import sys
import time

out, period = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
stop = [False]
signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__(0, True))
names: dict[int, str] = {}
me = os.getpid()


def cmd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


n_sample = 0
with open(out, "w") as fh:
    while not stop[0]:
        n_sample += 1
        t = time.time()
        procs, threads = {}, {}
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == me:
                continue
            pid = int(p)
            try:
                with open(f"/proc/{p}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            j = int(rest[11]) + int(rest[12])
            if j == 0 and pid not in names:
                continue
            procs[pid] = j
            if pid not in names or (n_sample % 4 == 0 and "DeviceWorker" not in names[pid]):
                c = cmd(pid)
                if c != names.get(pid):
                    names[pid] = c
                    fh.write(json.dumps({"name": pid, "cmd": c}) + "\n")
            if "DeviceWorker" in names[pid] or "bidirl.cli" in names[pid] or "raylet" in names[pid]:
                try:
                    for tid in os.listdir(f"/proc/{p}/task"):
                        with open(f"/proc/{p}/task/{tid}/stat") as f:
                            s = f.read()
                        comm = s[s.index("(") + 1:s.rindex(")")]
                        r = s.rsplit(")", 1)[1].split()
                        threads[f"{pid}/{tid}/{comm}"] = [int(r[11]) + int(r[12]), int(r[36])]
                except OSError:
                    pass
        with open("/proc/stat") as f:
            cpus = [r.split()[1:9] for r in f if r.startswith("cpu") and r[3].isdigit()]
        fh.write(json.dumps({"t": t, "procs": procs, "threads": threads, "cpus": cpus}) + "\n")
        fh.flush()
        time.sleep(period)
