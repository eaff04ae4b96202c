"""The package keeps a shape a newcomer can walk, and this test keeps it.

Four rules over ``src/bidirl``, read from the source (imports inside functions count):

1. **No import circle** between modules.
2. **No arrow back up**: packages sit in layers (``LAYERS``, lowest first) and a module
   imports only from its own layer or below. Packages in one layer do not import each other.
3. **No module over ``MAX_MODULE_LINES`` lines, no class over ``MAX_CLASS_ATTRIBUTES``
   attributes** (attributes assigned on ``self`` anywhere in the class; frozen dataclasses
   and NamedTuples, which are records, are excepted).
4. **Project imports at module top**, unless the import line (or the comment line just
   above it) says why it waits, for example ``# lazy: pulls in torch``.

Each rule is also checked against a small planted violation, so the scan cannot go blind.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bidirl

MAX_MODULE_LINES = 400
MAX_CLASS_ATTRIBUTES = 20

# Lowest first. A package may import its own layer's modules only within itself.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("perf",),
    ("controller",),
    ("policy",),
    ("planner",),
    ("frame", "obs", "algo"),
    ("engines",),
    ("models",),
    ("sim",),
    ("runtime",),
    ("cli", "__init__", "__main__"),
)
LAYER_OF = {pkg: depth for depth, names in enumerate(LAYERS) for pkg in names}


@dataclass(frozen=True)
class Import:
    source: str      # importing module, dotted
    target: str      # imported project module, dotted
    line: int
    nested: bool     # inside a function or method
    explained: bool  # a comment on its line or the line above


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(source: str, module: str, is_package: bool,
                    known: set[str]) -> Iterator[Import]:
    """Every project module ``source`` imports, at any depth, resolved to a known module."""
    tree = ast.parse(source)
    lines = source.splitlines()
    nested_ids = {id(node) for fn in ast.walk(tree)
                  if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn)}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from mod import name``, the module
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
        explained = "#" in here or above.startswith("#")
        seen = set()
        for name in names:
            if not name.startswith("bidirl"):
                continue
            while name not in known and "." in name:
                name = name.rpartition(".")[0]
            if name in known and name != module and name not in seen:
                seen.add(name)
                yield Import(module, name, node.lineno, id(node) in nested_ids, explained)


def scan(root: Path) -> tuple[dict[str, Path], list[Import]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    imports = [imp for name, path in files.items()
               for imp in project_imports(path.read_text(), name, path.name == "__init__.py", known)]
    return files, imports


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def arrows_up(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        src, dst = package_of(imp.source), package_of(imp.target)
        if src == dst:
            continue
        if src not in LAYER_OF or dst not in LAYER_OF:
            bad.append(f"{imp.source}:{imp.line} -> {imp.target}: package not in LAYERS")
        elif LAYER_OF[dst] >= LAYER_OF[src]:
            bad.append(f"{imp.source}:{imp.line} -> {imp.target} ({src} is not above {dst})")
    return bad


def _is_record(cls: ast.ClassDef) -> bool:
    for deco in cls.decorator_list:
        if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("dataclass"):
            if any(k.arg == "frozen" and ast.unparse(k.value) == "True" for k in deco.keywords):
                return True
    return any(ast.unparse(base).endswith("NamedTuple") for base in cls.bases)


def wide_classes(source: str) -> list[tuple[str, int]]:
    out = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef) or _is_record(cls):
            continue
        attrs = {node.attr for node in ast.walk(cls)
                 if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                 and isinstance(node.value, ast.Name) and node.value.id == "self"}
        if len(attrs) > MAX_CLASS_ATTRIBUTES:
            out.append((cls.name, len(attrs)))
    return out


ROOT = Path(bidirl.__file__).parent
FILES, IMPORTS = scan(ROOT)


def test_no_import_circle():
    assert cycles(IMPORTS) == [], "import circles (break each one):\n" + "\n".join(
        " <-> ".join(c) for c in cycles(IMPORTS))


def test_no_arrow_back_up():
    bad = arrows_up(IMPORTS)
    assert bad == [], "imports from a higher layer (see LAYERS):\n" + "\n".join(bad)


def test_no_module_over_the_line_limit():
    long = [f"{path.relative_to(ROOT.parent)}: {n} lines"
            for path in FILES.values() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == [], f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_class_over_the_attribute_limit():
    wide = [f"{path.relative_to(ROOT.parent)}: {name} has {n} attributes"
            for path in FILES.values() for name, n in wide_classes(path.read_text())]
    assert wide == [], f"classes over {MAX_CLASS_ATTRIBUTES} attributes:\n" + "\n".join(wide)


def test_project_imports_wait_only_with_a_reason():
    hidden = [f"{imp.source}:{imp.line} -> {imp.target}"
              for imp in IMPORTS if imp.nested and not imp.explained]
    assert hidden == [], ("project imports inside functions without a comment saying why "
                          "(move them to the top, or say why they wait):\n" + "\n".join(hidden))


def test_every_package_has_a_layer():
    assert {package_of(m) for m in FILES} <= set(LAYER_OF)


# -- the scan itself sees what it must ------------------------------------------------------

PLANTED = {
    "bidirl.core.a": "from bidirl.core import b\n",
    "bidirl.core.b": "def f():\n    from . import a\n",
    "bidirl.policy.p": "def g():\n    import bidirl.runtime.r  # lazy: torch\n",
    "bidirl.runtime.r": "x = 1\n",
}


def _planted_imports() -> list[Import]:
    known = set(PLANTED) | {"bidirl", "bidirl.core", "bidirl.policy", "bidirl.runtime"}
    return [imp for name, src in PLANTED.items()
            for imp in project_imports(src, name, False, known)]


def test_the_scan_sees_a_circle_through_a_nested_relative_import():
    assert cycles(_planted_imports()) == [["bidirl.core.a", "bidirl.core.b"]]


def test_the_scan_sees_an_arrow_up_and_an_unexplained_nested_import():
    imports = _planted_imports()
    assert arrows_up(imports) == [
        "bidirl.policy.p:2 -> bidirl.runtime.r (policy is not above runtime)"]
    hidden = [(i.source, i.target) for i in imports if i.nested and not i.explained]
    assert hidden == [("bidirl.core.b", "bidirl.core.a")]


def test_the_scan_counts_attributes_and_excepts_records():
    many = "\n".join(f"        self.a{i} = {i}" for i in range(21))
    live = f"class Live:\n    def __init__(self):\n{many}\n"
    record = "from dataclasses import dataclass\n@dataclass(frozen=True)\n" + live.replace("Live", "Rec")
    assert wide_classes(live) == [("Live", 21)]
    assert wide_classes(record) == []
