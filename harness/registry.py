"""Name -> object registries for the plugins: decoding methods, quality scorers, the folders that hold suite
definitions and the ``draftbench data`` commands that build a method's corpus structure (training objectives have
theirs in :mod:`harness.train.objectives`, built on :class:`Registry`).

A plugin module registers itself when it is imported::

    @register_method("eagle2")
    class Eagle2(SpeculativeMethod): ...

    @register_scorer("gsm8k_exact_match")
    def gsm8k_exact_match(question, answer_text) -> float: ...

    register_suite_dir(Path(__file__).parent)     # a folder of suite YAML files

    @register_data_command("datastore")
    def add_datastore_parser(subparsers): ...     # adds ``draftbench data datastore``

The core never imports a plugin by name: :func:`load_plugins` imports the built-in plugin packages (``methods``,
``suites``) and every module declared in the ``draftbench.methods`` / ``draftbench.suites`` entry-point groups of
installed packages, once, the first time a registry is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Generic, TypeVar

from harness.engine.method import Method
from harness.schema import did_you_mean

T = TypeVar("T")

BUILTIN_PLUGINS = ("methods", "suites")
ENTRY_POINT_GROUPS = ("draftbench.methods", "draftbench.suites")
ENTRY_POINT_GROUP = ENTRY_POINT_GROUPS[0]



class UnknownNameError(KeyError):
    """Raised for a name that no registry entry has; the message lists close matches and all known names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


class Registry(Generic[T]):
    """A dict of registered objects with duplicate checks and "did you mean" errors.

    Reading it (:meth:`get`, :meth:`names`, ``in``) first loads the plugins (:func:`load_plugins`).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            if not name or not name.replace("_", "").isalnum():
                raise ValueError(f"{self.kind} name {name!r} must be non-empty letters, digits and underscores")
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {_qualname(self._entries[name])}; "
                    f"{_qualname(obj)} cannot take the same name"
                )
            self._entries[name] = obj
            try:
                obj.name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return decorate

    def get(self, name: str) -> T:
        load_plugins()
        if name not in self._entries:
            known = sorted(self._entries)
            raise UnknownNameError(f"unknown {self.kind} {name!r}.{did_you_mean(name, known, cutoff=0.5)} "
                                   f"Known: {', '.join(known) or '(none)'}")
        return self._entries[name]

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._entries


def _qualname(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


METHODS: Registry = Registry("method")
SCORERS: Registry = Registry("scorer")
DATA_COMMANDS: Registry = Registry("data command")
_SUITE_DIRS: list[Path] = []


def register_method(name: str):
    """Class decorator: make a :class:`harness.engine.method.Method` subclass available under ``name``."""

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise TypeError(f"method {name!r} ({cls!r}) must subclass harness.engine.method.Method")
        return METHODS.register(name)(cls)

    return decorate


def register_scorer(name: str):
    """Function decorator: ``fn(question, answer_text) -> float in [0, 1]`` becomes the scorer ``name`` that a
    suite definition can name in its ``scorer`` field."""
    return SCORERS.register(name)


def register_data_command(name: str):
    """Function decorator: ``add_parser(subparsers)`` adds a plugin's own subcommand to ``draftbench data`` (a
    structure its method reads, built once from a corpus, e.g. REST's datastore), so that the command line builds it
    without importing the plugin; ``draftbench data`` adds every registered one, in name order."""
    return DATA_COMMANDS.register(name)


def register_suite_dir(folder: str | Path) -> None:
    """Add a folder of suite definitions (``<name>.yaml``, see :mod:`harness.run.suites`)."""
    folder = Path(folder).resolve()
    if folder not in _SUITE_DIRS:
        _SUITE_DIRS.append(folder)


def suite_dirs() -> list[Path]:
    """The registered folders of suite definitions, in registration order (built-in first)."""
    load_plugins()
    return list(_SUITE_DIRS)


_loaded = False


def load_plugins() -> None:
    """Import the built-in plugin packages and every entry-point plugin module once, so that they register."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: plugin modules read the registries while they are being imported
    try:
        for package in BUILTIN_PLUGINS:
            importlib.import_module(package)
        for group in ENTRY_POINT_GROUPS:
            for ep in metadata.entry_points(group=group):
                importlib.import_module(ep.value.split(":")[0])
    except BaseException:
        _loaded = False  # a broken plugin fails again, with its own error, on the next read
        raise


def get_method(name: str):
    return METHODS.get(name)


def method_names() -> list[str]:
    return METHODS.names()
