"""The inner ring stays pure: no torch, ray, vllm (nor simpy) behind the scheduling brain.

Two checks: a fresh interpreter that imports the inner ring must not load a heavy stack,
and a scan of the inner ring's source must find no import of the outer ring (simulator,
runtime, engines, observability, algorithm) or of a heavy stack at any depth, so a lazy
import inside a function cannot hide.
"""

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bidirl

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


INNER_RING = ("core", "perf", "policy", "planner", "controller")
OUTER_PACKAGES = ("bidirl.sim", "bidirl.runtime", "bidirl.engines", "bidirl.obs", "bidirl.algo")
HEAVY = ("torch", "ray", "vllm", "transformers")


def _bad_import(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in OUTER_PACKAGES + HEAVY)


def _imports(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    """Every module an ``import`` names, at any depth (inside functions too), resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for alias in node.names:  # ``from bidirl import sim`` imports bidirl.sim
                yield node.lineno, f"{mod}.{alias.name}"


def test_inner_ring_source_never_imports_the_outer_ring():
    """An AST scan: catches function-level imports the fresh-interpreter check cannot see."""
    root = Path(bidirl.__file__).parent
    bad = []
    for pkg in INNER_RING:
        for path in sorted((root / pkg).rglob("*.py")):
            package = ".".join(("bidirl", *path.relative_to(root).parent.parts))
            tree = ast.parse(path.read_text(), filename=str(path))
            bad += [f"{path.relative_to(root.parent)}:{line}: {name}"
                    for line, name in _imports(tree, package) if _bad_import(name)]
    assert bad == [], "inner ring imports the outer ring or a heavy stack:\n" + "\n".join(bad)


def test_the_scan_sees_nested_and_relative_imports():
    src = "def f():\n    from bidirl.sim.scenario import Pools\n    import torch.nn\nfrom .. import obs\n"
    found = sorted(n for _, n in _imports(ast.parse(src), "bidirl.planner") if _bad_import(n))
    assert found == ["bidirl.obs", "bidirl.sim.scenario", "bidirl.sim.scenario.Pools", "torch.nn"]
