"""YAML read with limits: the one loader of every YAML text a person hands draftbench (presets, ``--set`` / ``--opt``
/ ``--sweep`` values, suite definitions, published tables).

``yaml.safe_load`` constructs no objects, but it has no limits: a 50,000-deep nested list ends in RecursionError, an
alias inside its own anchor (``a: &a [*a]``) makes a structure that contains itself (every later walk of it recurses
for ever), and a 1 KB "billion laughs" text of nested aliases stands for 10^9 values that grow without end once
anything copies or serialises them. :func:`safe_load` refuses all three before any value is constructed, with a
:class:`YAMLLimitError` (a :class:`yaml.YAMLError`, so every caller's "invalid YAML" line reports it).
Example: ``safe_load("a: &a [*a]")`` -> YAMLLimitError("an alias refers to a node that contains it (a
self-reference)").
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 100  # nesting levels; a preset needs fewer than 10
MAX_NODES = 100_000  # values after every alias is expanded; a preset has fewer than 1,000


class YAMLLimitError(yaml.YAMLError):
    """A YAML text beyond :data:`MAX_DEPTH` or :data:`MAX_NODES`, or with a self-referencing alias; ``problem`` says
    which (as PyYAML's own errors do)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer stops at :data:`MAX_DEPTH` levels, before Python's recursion limit."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_size(root: yaml.Node) -> int:
    """How many values ``root`` stands for with every alias expanded (each shared node counted at every use, as a
    copy or a serialisation would make it); a :class:`YAMLLimitError` past :data:`MAX_NODES` or at an alias to a
    node that contains it. Each distinct node is visited once, so a billion laughs costs as much as its text."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes whose children are being counted: the path from the root
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        if counted:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[id(node)] > MAX_NODES:
                raise YAMLLimitError(f"more than {MAX_NODES:,} values once its aliases are expanded (an alias bomb?)")
            continue
        if id(node) in sizes:
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise YAMLLimitError("an alias refers to a node that contains it (a self-reference)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)`` within the limits of the module docstring (a YAMLError past them)."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
