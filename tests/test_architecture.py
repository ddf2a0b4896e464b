"""The import rule of the README's architecture section, checked over the whole import graph (every ``import`` and
``from ... import`` statement, at module level or inside a function, read with :mod:`ast`).

1. The core (``harness``) never imports a plugin (``methods``, ``suites``): plugins are found by the registries.
2. Inside ``harness`` a module imports only from its own layer or a lower one (``LAYERS``, lowest first).
3. No import cycles between modules.
4. No module imports another module's private (``_``-prefixed) name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "methods", "suites")
PLUGINS = ("methods", "suites")
# harness layers, lowest first: a module may import from its own layer and any layer before it
LAYERS = [
    ("harness.sandbox", "harness.schema", "harness.yamlsafe"),
    ("harness.measure",),
    ("harness.report",),
    ("harness.gate",),
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


# ------------------------------------------------------------------------------------ the docs agree with the tree


def layer_order() -> str:
    """LAYERS as the README writes it: each layer's top-level harness modules, comma-joined, layers joined by " < "
    (entry points below a package and the bare ``harness`` package left out). Example: [("harness.sandbox",
    "harness.schema"), ("harness.measure",)] -> "sandbox, schema < measure"."""
    return " < ".join(", ".join(p.split(".")[1] for p in group if p.count(".") == 1) for group in LAYERS)


def readme_architecture(readme: str) -> str:
    """The code block under the README's ``## Architecture`` heading."""
    section = readme.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def undocumented(root: Path = REPO) -> list[str]:
    """What the docs miss or contradict: a harness subpackage (``name/``) or top-level module (``name.py``) absent
    from the README's architecture block, a README import order other than :func:`layer_order`, and every module
    or subpackage of a subpackage (``harness/engine/``, ``methods/eagle/``, ...; the top-level packages are the
    README's) that its ``__init__`` docstring does not name as ````name```` or ``:mod:`...name```."""
    out = []
    readme = (root / "README.md").read_text()
    block = " ".join(readme_architecture(readme).split())
    for path in sorted((root / "harness").iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        name = f"{path.name}/" if (path / "__init__.py").exists() else path.name if path.suffix == ".py" else None
        if name and name not in block:
            out.append(f"README architecture: harness/{name} missing")
    if f": {layer_order()} " not in block:
        out.append(f"README architecture: the import order is not '{layer_order()}'")
    for init in sorted(p for package in PACKAGES for p in (root / package).rglob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        folder = init.parent
        members = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        members += [p.name for p in folder.iterdir() if (p / "__init__.py").exists()]
        for member in sorted(members):
            if f"``{member}``" not in doc and not re.search(rf":mod:`[\w.]*\b{re.escape(member)}`", doc):
                out.append(f"{folder.relative_to(root)}/__init__.py docstring: {member} missing")
    return out


def test_readme_and_package_docstrings_name_every_module():
    """A reader finds every room from the README's architecture block and every module from its package's
    docstring, and the README's import order is the one this file enforces: a module added, moved or renamed
    without its docs fails here."""
    assert undocumented() == []


def test_the_docs_check_catches_a_missing_module(tmp_path):
    """Negative controls: a package docstring that omits a module, a README block that omits a subpackage, and a
    README import order that differs from LAYERS are each reported."""
    order = layer_order()
    readme = f"# x\n\n## Architecture\n\n```\nharness/  imports: {order} (checked)\n  engine/ registry.py\n```\n"
    tree = {"README.md": readme, "harness/__init__.py": "", "harness/registry.py": "",
            "harness/engine/__init__.py": '"""The engine: ``tree``."""\n', "harness/engine/tree.py": "",
            "harness/engine/kv.py": "", "harness/run/__init__.py": '"""Runs: :mod:`harness.run.runner`."""\n',
            "harness/run/runner.py": "", "methods/__init__.py": "", "suites/__init__.py": ""}
    write_tree(tmp_path, tree)
    assert undocumented(tmp_path) == ["README architecture: harness/run/ missing",
                                      "harness/engine/__init__.py docstring: kv missing"]
    write_tree(tmp_path, {"README.md": readme.replace(" < engine <", " < registry < engine <", 1)})
    assert any(line.startswith("README architecture: the import order is not") for line in undocumented(tmp_path))
