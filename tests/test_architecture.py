"""The import rule of the README's architecture section, checked over the whole import graph (every ``import`` and
``from ... import`` statement, at module level or inside a function, read with :mod:`ast`).

1. The core (``harness``) never imports a plugin (``methods``, ``suites``): plugins are found by the registries.
2. Inside ``harness`` a module imports only from its own layer or a lower one (``LAYERS``, lowest first).
3. No import cycles between modules.
4. No module imports another module's private (``_``-prefixed) name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "methods", "suites")
PLUGINS = ("methods", "suites")
# harness layers, lowest first: a module may import from its own layer and any layer before it
LAYERS = [
    ("harness.sandbox", "harness.schema", "harness.yamlsafe"),
    ("harness.measure",),
    ("harness.models",),
    ("harness.engine",),
    ("harness.registry",),
    ("harness.backends",),
    ("harness.run",),
    ("harness.published",),
    ("harness.train",),
    ("harness.cli", "harness.gpucheck", "harness.train.__main__", "harness"),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the three packages: dotted name -> file."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            out[module_name(path, root)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``path`` that targets a known module.

    ``from a.b import c`` targets module ``a.b.c`` when that is a module, else module ``a.b`` with name ``c``.
    Relative imports are resolved against ``name``.
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.append((alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.append((sub, None, node.lineno))
                elif base in known:
                    out.append((base, alias.name, node.lineno))
    return out


def import_graph(root: Path = REPO) -> dict[str, list[tuple[str, str | None, int]]]:
    modules = source_modules(root)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    """The layer of ``module``: that of the longest prefix in LAYERS that names it or a package above it (so an entry
    point such as ``harness.train.__main__`` can sit in a higher layer than its package)."""
    found = [(len(prefix), i) for i, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or (prefix != "harness" and module.startswith(prefix + "."))]
    return max(found)[1] if found else None


def find_cycle(graph: dict[str, list[tuple[str, str | None, int]]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target, _, _ in graph.get(node, []):
            if target == node:
                continue
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def violations(graph) -> list[str]:
    """Every breach of rules 1, 2 and 4 (rule 3 is :func:`find_cycle`)."""
    bad = []
    for module, edges in sorted(graph.items()):
        for target, name, line in edges:
            where = f"{module} (line {line}) imports {target}{'.' + name if name else ''}"
            if module.split(".")[0] == "harness" and target.split(".")[0] in PLUGINS:
                bad.append(f"{where}: the core must not import a plugin")
            mine, theirs = layer_of(module), layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(f"{where}: layer {LAYERS[mine][0]} may not import the higher layer {LAYERS[theirs][0]}")
            if name and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{where}: a private name of another module")
    return bad


def test_every_harness_module_has_a_layer():
    """A new top-level harness module or subpackage must be placed in LAYERS (and in the README's diagram)."""
    missing = [m for m in source_modules() if m.startswith("harness") and layer_of(m) is None]
    assert missing == []


def test_the_import_rule_holds():
    """The core importing a plugin, a lower layer importing a higher one, or a private name crossing modules."""
    assert violations(import_graph()) == []


def test_there_are_no_import_cycles():
    """A cycle means two modules can only be understood (and imported) together."""
    assert find_cycle(import_graph()) is None


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


BASE = {"harness/__init__.py": "", "harness/registry.py": "", "harness/engine/__init__.py": "",
        "harness/engine/tree.py": "", "harness/run/__init__.py": "", "harness/run/runner.py": "",
        "methods/__init__.py": "", "methods/eagle.py": "from harness.engine import tree\n", "suites/__init__.py": ""}


@pytest.mark.parametrize("rel, text, expected", [
    ("harness/engine/tree.py", "def f():\n    from methods import eagle\n", "the core must not import a plugin"),
    ("harness/engine/tree.py", "import suites\n", "the core must not import a plugin"),
    ("harness/engine/tree.py", "from harness.run.runner import go\n", "may not import the higher layer harness.run"),
    ("harness/run/runner.py", "from harness.engine.tree import _private\n", "a private name of another module"),
])
def test_the_check_catches_a_breach(tmp_path, rel, text, expected):
    """Negative controls: each breach, planted in a small tree, is reported (else the checks above prove nothing)."""
    write_tree(tmp_path, {**BASE, rel: text})
    found = violations(import_graph(tmp_path))
    assert len(found) == 1 and expected in found[0], found


def test_the_check_catches_a_cycle(tmp_path):
    """Negative control for rule 3: run -> registry -> run is a cycle."""
    write_tree(tmp_path, {**BASE, "harness/run/runner.py": "from harness import registry\n",
                          "harness/registry.py": "def f():\n    import harness.run.runner\n"})
    assert find_cycle(import_graph(tmp_path)) == ["harness.registry", "harness.run.runner", "harness.registry"]
