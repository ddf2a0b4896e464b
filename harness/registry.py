"""Name -> class registries for decoding methods and suites.

A method module registers itself::

    @register_method("eagle2")
    class Eagle2(SpeculativeMethod): ...

Built-in methods live in ``methods/`` (imported by :func:`load_builtin_methods`); third-party packages declare a
module in the ``draftbench.methods`` entry-point group and that module registers its classes the same way.
"""

from __future__ import annotations

import difflib
import importlib
from importlib import metadata
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

ENTRY_POINT_GROUP = "draftbench.methods"


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry has; the message lists close matches and all known names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


class Registry(Generic[T]):
    """A dict of registered classes with duplicate checks and "did you mean" errors."""

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
        if name not in self._entries:
            known = sorted(self._entries)
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(known) or '(none)'}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def _qualname(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


METHODS: Registry = Registry("method")


def register_method(name: str):
    """Class decorator: make a :class:`harness.method.Method` subclass available under ``name``."""
    from harness.method import Method

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise TypeError(f"method {name!r} ({cls!r}) must subclass harness.method.Method")
        return METHODS.register(name)(cls)

    return decorate


_loaded = False


def load_builtin_methods() -> None:
    """Import ``methods/*`` and every ``draftbench.methods`` entry point once, so that they register."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module("methods")
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        importlib.import_module(ep.value.split(":")[0])


def get_method(name: str):
    load_builtin_methods()
    return METHODS.get(name)


def method_names() -> list[str]:
    load_builtin_methods()
    return METHODS.names()
