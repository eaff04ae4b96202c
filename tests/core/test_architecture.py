"""The inner ring stays pure: no torch, ray, vllm (nor simpy) behind the scheduling brain."""

import importlib.util
import json
import subprocess
import sys

FORBIDDEN = ("torch", "ray", "vllm", "simpy")


def test_inner_ring_imports_no_heavy_stack():
    modules = ["bidirl.core.ledger", "bidirl.core.staleness", "bidirl.core.timeline",
               "bidirl.perf.stage_models", "bidirl.perf.switch_costs", "bidirl.controller",
               "bidirl.policy", "bidirl.policy.bidirl", "bidirl.policy.sync"]
    if importlib.util.find_spec("bidirl.planner") is not None:
        modules += ["bidirl.planner", "bidirl.planner.plan", "bidirl.planner.cold_start"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from bidirl.policy import policy_names; policy_names()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
