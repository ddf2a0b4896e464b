"""Plain data (YAML, JSON, command-line values) checked against dataclass annotations: one validator, one error type.

Every input the harness reads from a person (method options, run configurations, published tables, suite files)
is checked here before it is used, and a bad value raises :class:`InputError` (or a subclass naming the input:
``OptionsError``, ``ConfigError``, ``TableError``, ``DataError``) with the path of the bad field, e.g.
``run.max_new_tokens: expected an integer, got 'many'``. The command line catches :class:`InputError` and prints
its message as one line. A check specific to one field (a range, a choice of names) stays with its dataclass
(``__post_init__``) and raises the same type.

Annotations understood by :func:`type_error`: int (not bool), float (int or float, finite), bool, str, None, Any,
list / tuple / dict (bare or parametrised: ``list[X]`` and ``tuple[X, ...]`` element-wise, ``dict[K, V]`` key- and
value-wise), ``Literal[...]`` and unions (``X | None``, ``Optional[X]``). Standard library only: every layer may
import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any


class InputError(ValueError):
    """A value read from a configuration, option, table or data file that is missing, unknown or of the wrong type
    or range; the message names the input and the field."""


def did_you_mean(name: object, names: list[str], n: int = 3, cutoff: float = 0.6) -> str:
    """The hint of an "unknown name" error: `` Did you mean 'a', 'b'?`` for the (at most ``n``) names close to
    ``name``, nothing when none is. Example: did_you_mean("dem", ["demo", "paper"]) -> " Did you mean 'demo'?"."""
    close = difflib.get_close_matches(str(name), names, n, cutoff)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def unknown_keys(keys, allowed, where: str, noun: str = "field", error: type[InputError] = InputError,
                 list_valid: bool = False) -> None:
    """Raise ``error`` naming every key of ``keys`` not in ``allowed``, each with its closest allowed name (and,
    with ``list_valid``, every allowed name, in the order given).

    Example: (["tempratures"], ["temperatures", "top_p"], "run") -> ``run: unknown field 'tempratures' (did you mean
    'temperatures'?)``; with list_valid: ``...; valid: temperatures, top_p``.
    """
    allowed = list(allowed)
    unknown = sorted(set(keys) - set(allowed), key=str)
    if unknown:
        close = {u: difflib.get_close_matches(str(u), allowed, 1) for u in unknown}
        hints = [repr(u) + (f" (did you mean {close[u][0]!r}?)" if close[u] else "") for u in unknown]
        valid = f"; valid: {', '.join(allowed) or '(none)'}" if list_valid else ""
        raise error(f"{where}: unknown {noun} {', '.join(hints)}{valid}")


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null",
             list: "a list", tuple: "a list", dict: "a mapping"}


def type_error(value: Any, annotation: Any, scalar_str: bool = False, finite: bool = False) -> str | None:
    """What ``annotation`` expects, when ``value`` does not fit it; None when it fits (or the annotation is Any or a
    type not listed in the module docstring, which its dataclass checks itself).

    ``scalar_str``: a ``str`` field also takes a YAML boolean or number (``mode: off`` arrives as False; the field's
    own check decides). ``finite``: a ``float`` field refuses NaN and the infinities (where no range check of the
    field's own would). Examples: ("abc", int) -> "an integer"; (True, int) -> "an integer"; (3, float) -> None;
    (nan, float, finite=True) -> "a finite number"; (None, int | None) -> None; ([1, "a"], list[int]) -> "a list
    of integers"; ("c", Literal["a", "b"]) -> "one of 'a', 'b'"; ({"a": "x"}, dict[str, int]) -> "a mapping to
    integers".
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        errors = [type_error(value, a, scalar_str, finite) for a in options]
        return None if any(e is None for e in errors) else " or ".join(errors)
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        return None if value in choices else "one of " + ", ".join(map(repr, choices))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return "a list"
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(set(args)) == 1 and any(type_error(v, args[0], scalar_str, finite) for v in value):
            return f"a list of {_plural(type_error(object(), args[0], scalar_str))}"
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return "a mapping"
        key, item = (typing.get_args(annotation) + (Any, Any))[:2]
        if any(type_error(k, key, scalar_str, finite) for k in value):
            return f"a mapping with {_plural(type_error(object(), key, scalar_str))} as keys"
        if any(type_error(v, item, scalar_str, finite) for v in value.values()):
            return f"a mapping to {_plural(type_error(object(), item, scalar_str))}"
        return None
    if finite and annotation is float and isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if annotation not in _EXPECTED:
        return None
    return None if _fits(value, annotation, scalar_str) else _EXPECTED[annotation]


def _fits(value: Any, annotation: type, scalar_str: bool) -> bool:
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, (str, bool, int, float)) if scalar_str else isinstance(value, str)
    if annotation is type(None):
        return value is None
    if annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, annotation)


def _plural(expected: str | None) -> str:
    """"an integer" -> "integers"; "a number" -> "numbers"."""
    words = (expected or "values").split(" ", 1)
    text = words[1] if words[0] in ("a", "an") and len(words) > 1 else " ".join(words)
    return text if text.endswith("s") else text + "s"


def check(value: Any, annotation: Any, where: str, error: type[InputError] = InputError,
          scalar_str: bool = False, finite: bool = False) -> Any:
    """``value`` when it fits ``annotation``; else raise ``error``: ``<where>: expected <what>, got <value>``, where
    ``where`` names the bad element itself (``where[i]`` in a list, ``where.key`` in a mapping) when the container
    fits and one element does not.

    Examples: check("x", int, "eagle2.total_tokens") raises ``eagle2.total_tokens: expected an integer, got 'x'``;
    check([0, "x"], list[float] | None, "run.temperatures") raises ``run.temperatures[1]: expected a number, got
    'x'``.
    """
    inner = _element_annotations(value, annotation)
    if inner is not None:
        items = enumerate(value) if isinstance(value, (list, tuple)) else value.items()
        brackets = isinstance(value, (list, tuple))
        for key, item in items:
            check(item, inner, f"{where}[{key}]" if brackets else f"{where}.{key}", error, scalar_str, finite)
    expected = type_error(value, annotation, scalar_str, finite)
    if expected:
        raise error(f"{where}: expected {expected}, got {value!r}")
    return value


def _element_annotations(value: Any, annotation: Any) -> Any:
    """The annotation every element of ``value`` must fit, when ``value`` is the list or mapping that ``annotation``
    (or the one container in its union) asks for; None otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        containers = [a for a in typing.get_args(annotation) if typing.get_origin(a) in (list, tuple, dict)]
        if len(containers) != 1:
            return None
        annotation = containers[0]
    origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if origin in (list, tuple) and isinstance(value, (list, tuple)) and len(set(args)) == 1:
        return args[0]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return args[1]
    return None


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of dataclass ``cls``'s fields (Any for one that does not resolve)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: leave the checks to the class
        hints = {}
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}
