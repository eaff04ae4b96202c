"""The docs name only modules that exist.

Scans ``docs/*.md`` and ``README.md`` for backticked paths and checks that each file is
there, so a module that moves or goes cannot leave a page pointing at nothing.  A path is
checked when it starts with a source package (``runtime/train.py``, resolved under
``src/bidirl/``) or a folder of the repository (``src/``, ``bench/``, ``audit/``, ``tests/``,
``scripts/``, ``docs/``) and names a ``.py``, ``.md`` or ``.sh`` file, a folder (a trailing
``/``), or a module's member (``runtime/prepare.fit_prompts``: the file part,
``prepare.py``).  What follows a colon (``mod.py:func``) is not checked.  Other backticked
text with a slash (metric names such as ``perf/throughput``, a data file a command writes)
is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bidirl"
REPO_DIRS = ("src", "bench", "audit", "tests", "scripts", "docs")
PACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")))

CODE = re.compile(r"`([^`\n]+)`")
ROOTS = "|".join(REPO_DIRS + PACKAGES)
PATH = re.compile(rf"(?<![\w./-])((?:{ROOTS})/[\w./-]*)")
CHECKED = (".py", ".md", ".sh", "/")
DATA = {"json", "jsonl", "yaml", "yml", "png", "txt", "csv", "parquet", "toml"}


def doc_files() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def file_part(path: str) -> str | None:
    """The file or folder ``path`` names, or None when it names none (a metric, an output)."""
    if path.endswith(CHECKED):
        return path
    head, dot, member = path.partition(".")
    if dot and member and "/" not in member and member.split(".")[0] not in DATA:  # pkg/mod.member
        return head + ".py"
    return None


def resolve(path: str) -> Path:
    base = ROOT if path.split("/", 1)[0] in REPO_DIRS else PACKAGE
    return base / path


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) of every checkable path in ``text``'s backticked spans."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for span in CODE.findall(line):
            for m in PATH.finditer(span):
                part = file_part(m.group(1).rstrip("."))
                if part is not None:
                    out.append((n, part))
    return out


def test_the_docs_name_only_files_that_exist():
    missing = [f"{doc.relative_to(ROOT)}:{n}: {path}"
               for doc in doc_files() for n, path in named_paths(doc.read_text())
               if not resolve(path).exists()]
    assert missing == [], "docs name files that do not exist:\n" + "\n".join(missing)


def test_the_scan_sees_each_form_of_path():
    text = ("`runtime/train.py:main` and `src/bidirl/sim/run.py`, `bench/measure.py`, "
            "`runtime/prepare.fit_prompts`, `sim/`, `perf/throughput`, `bench/results/x.json`\n"
            "`algo/gone.py` (`models/tiny.encode_prompt`)")
    assert named_paths(text) == [(1, "runtime/train.py"), (1, "src/bidirl/sim/run.py"), (1, "bench/measure.py"),
                                 (1, "runtime/prepare.py"), (1, "sim/"), (2, "algo/gone.py"), (2, "models/tiny.py")]
    assert [resolve(p).exists() for _, p in named_paths(text)] == [True] * 5 + [False, True]
