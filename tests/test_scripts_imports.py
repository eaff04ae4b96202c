"""The shell scripts' embedded Python imports what exists (a script that runs only on a GPU
machine cannot wait for one to find a moved module): every ``from bidirl... import ...`` and
``python -m bench.X`` / ``-m bidirl.X`` in ``scripts/*.sh`` resolves here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FROM_IMPORT = re.compile(r"^\s*from (bidirl[\w.]*) import ([\w, ]+)$", re.M)
MODULE_RUN = re.compile(r"-m ((?:bidirl|bench)[\w.]*)")


def _references() -> list[tuple[str, str, list[str]]]:
    found = []
    for script in sorted((ROOT / "scripts").glob("*.sh")):
        text = script.read_text()
        found += [(script.name, m.group(1), [n.strip() for n in m.group(2).split(",")])
                  for m in FROM_IMPORT.finditer(text)]
        found += [(script.name, m.group(1), []) for m in MODULE_RUN.finditer(text)]
    return found


def test_the_scripts_name_modules_and_names_that_exist():
    refs = _references()
    assert any(name == "gpu_smoke.sh" for name, _, _ in refs), "the scan sees gpu_smoke.sh's imports"
    missing = []
    for script, module, names in refs:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{script}: {module} ({e})")
            continue
        missing += [f"{script}: {module}.{n}" for n in names if not hasattr(mod, n)]
    assert missing == [], "scripts name what does not exist:\n" + "\n".join(missing)
