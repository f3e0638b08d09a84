"""The package's architecture, checked: relbench is layered by stage of the pipeline, and no module
imports from a layer above its own (eager, lazy and type-checking imports alike); the module graph
has no cycle; no module is named like a standard-library module; and a module imports no private
(underscore) name of another. docs/architecture.md describes the layers."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "relbench"

# bottom to top: a module may import from its own layer and those below it
LAYERS: list[tuple[str, ...]] = [
    ("relbench", "relbench.errors", "relbench.stats", "relbench.comparisons", "relbench.tasks", "relbench.presets",
     "relbench.panels"),   # leaves
    ("relbench.config",),
    ("relbench.positions",),
    ("relbench.attention",),
    ("relbench.model",),
    ("relbench.contract",),      # what a scheme must keep (relbench check, the registry-wide tests)
    ("relbench.runs",),          # run directories, checkpoints, processes, tracking
    ("relbench.data",),
    ("relbench.cost",),          # memory, resident, profiling, inspection
    ("relbench.training",),
    ("relbench.evaluation",),
    ("relbench.reporting",),
    ("relbench.cli", "relbench.__main__"),
]


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Every relbench module `path` imports anywhere in its body ("from relbench.x import y" counts
    as relbench.x.y when that is a module, else relbench.x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "relbench"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] == "relbench":
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    found.add(full if full in known else source)
    return found - {name}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    return {name: imports_of(path, name, set(paths)) for name, path in paths.items()}


def layer_of(name: str) -> int:
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise AssertionError(f"{name} belongs to no layer: add it to LAYERS in tests/test_layers.py")
    return best[0]


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
                  for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_from_a_layer_above_it():
    assert upward_imports(graph()) == []


def test_the_module_graph_has_no_cycle():
    assert cycles(graph()) == []


def test_the_checks_catch_a_deliberate_break(tmp_path):
    """A package in which the config imports the reporting layer, and two position modules import
    each other: both checks name exactly those imports."""
    root = tmp_path / "relbench"
    for rel, text in {"__init__.py": "", "config.py": "from relbench.reporting import report\n",
                      "positions/__init__.py": "", "positions/base.py": "from relbench.positions import forms\n",
                      "positions/forms.py": "def f():\n    from relbench.positions.base import x\n",
                      "reporting/__init__.py": "", "reporting/report.py": "import relbench.config\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    edges = graph(root)
    assert upward_imports(edges) == ["relbench.config (layer 1) imports relbench.reporting.report (layer 11)"]
    assert sorted(map(tuple, cycles(edges))) == [("relbench.config", "relbench.reporting.report"),
                                                   ("relbench.positions.base", "relbench.positions.forms")]


def test_no_module_is_named_like_the_standard_library():
    clashes = [name for name in graph() if name.rpartition(".")[2] in sys.stdlib_module_names and name != "relbench"]
    assert clashes == []


@pytest.mark.parametrize("folder", ["relbench", "tests", "benchmarks"])
def test_no_private_name_is_imported_from_another_module(folder):
    found = []
    for path in sorted((PACKAGE.parent / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "relbench":
                found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


@pytest.mark.parametrize("folder", ["results", "benchmarks"])
def test_scripts_outside_the_package_import_names_that_exist(folder):
    """The scripts in results/ (carry_over.py, ...) and benchmarks/ are not run by the
    tests: a renamed or moved relbench name would break them silently. Every relbench name they
    import must exist."""
    import importlib
    import importlib.util

    missing = []
    for path in sorted((PACKAGE.parent / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "relbench":
                module = importlib.import_module(node.module)
                missing += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{a.name}"
                            for a in node.names if not hasattr(module, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert missing == []


def private_attributes(path: Path) -> list[str]:
    """`module._name` uses in a file, where `module` is a relbench module it imported (from relbench.x
    import y, import relbench.x as y): a private name reached through the module instead of imported."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    tree = ast.parse(path.read_text())
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "relbench" and not node.level:
            aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name.split(".")[0] == "relbench"}
    return sorted(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
            and node.attr.startswith("_") and not node.attr.startswith("__"))


@pytest.mark.parametrize("folder", ["relbench", "benchmarks"])
def test_no_private_name_is_reached_through_another_module(folder):
    found = [hit for path in sorted((PACKAGE.parent / folder).rglob("*.py")) for hit in private_attributes(path)]
    assert found == []


def test_the_private_attribute_check_catches_one(tmp_path):
    path = tmp_path / "user.py"
    path.write_text("from relbench.cost import memory\nfrom relbench import stats as s\nmemory._hidden()\ns._T975\n"
                    "memory.public()\n")
    assert private_attributes(path) == ["user.py:3 memory._hidden", "user.py:4 s._T975"]
