"""Every benchmark in ``bench/`` is named in ``BENCHMARKS.md`` and says how it is run.

A script nobody can find on the results page, or one without its command, is how a bench
turns back into a lab notebook (issue 39).  Shared helpers (``measure.py``, ``schedules.py``, a
workload's reward ``difficulty_reward.py``) are named on the page too, but need no command.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"__init__.py", "measure.py", "schedules.py", "difficulty_reward.py"}


def _scripts() -> list[Path]:
    return sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


def test_every_bench_module_is_named_on_the_results_page():
    page = (ROOT / "BENCHMARKS.md").read_text()
    missing = [p.name for p in _scripts() if f"bench/{p.name}" not in page and f"bench.{p.stem}" not in page]
    assert missing == [], f"bench modules BENCHMARKS.md never names: {missing}"


def test_every_benchmark_docstring_gives_its_command():
    no_command = []
    for p in _scripts():
        if p.name in HELPERS:
            continue
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        if f"bench.{p.stem}" not in doc:
            no_command.append(p.name)
    assert no_command == [], f"bench modules whose docstring lacks `python -m bench.NAME`: {no_command}"
