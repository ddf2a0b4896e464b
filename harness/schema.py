"""Plain data (YAML, JSON, command-line values) checked against dataclass annotations: one validator, one error type.

Every input the harness reads from a person (method options, run configurations, published tables, suite files)
is checked here before it is used, and a bad value raises :class:`InputError` (or a subclass naming the input:
``OptionsError``, ``ConfigError``, ``TableError``, ``DataError``) with the path of the bad field, e.g.
``run.max_new_tokens: expected an integer, got 'many'``. The command line catches :class:`InputError` and prints
its message as one line. A check specific to one field (a range, a choice of names) stays with its dataclass
(``__post_init__``) and raises the same type.

Annotations understood by :func:`type_error`: int (not bool), float (int or float, finite), bool, str, None, Any,
list / tuple / dict (bare or parametrised: ``list[X]`` and ``tuple[X, ...]`` element-wise, ``dict[K, V]`` key- and
value-wise), ``Literal[...]``, unions (``X | None``, ``Optional[X]``) and ``Annotated[X, rule...]`` with the rules
:class:`Bound` (a number's range) and :class:`NonEmpty` (plain data checked without a dataclass, such as the
records of a run, :func:`harness.measure.records.record_problem`). Standard library only: every layer may import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
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
_EXPECTED_PLURAL = {int: "integers", float: "numbers", bool: "true or false", str: "strings", type(None): "nulls",
                    list: "lists", tuple: "lists", dict: "mappings"}


@dataclass(frozen=True)
class Bound:
    """Rule of ``Annotated[int | float, Bound(low)]``: a number >= ``low`` (> ``low`` when ``strict``; NaN never is).
    Example: ``Annotated[float, Bound(0, strict=True)]`` expects "a number > 0"."""

    low: float
    strict: bool = False

    def holds(self, value: Any) -> bool:
        return value > self.low if self.strict else value >= self.low

    def phrase(self, expected: str) -> str:
        return f"{expected} {'>' if self.strict else '>='} {self.low:g}"


@dataclass(frozen=True)
class NonEmpty:
    """Rule of ``Annotated[str | list, NonEmpty()]``: at least one character or element ("a non-empty string")."""

    def holds(self, value: Any) -> bool:
        return len(value) > 0

    def phrase(self, expected: str) -> str:
        article, _, rest = expected.partition(" ")
        return f"{article} non-empty {rest}" if article in ("a", "an") else f"non-empty {expected}"


def expected(annotation: Any, plural: bool = False) -> str:
    """What ``annotation`` expects, in words (the phrase of :func:`type_error`'s messages); ``plural`` for the
    elements of a container. Examples: int -> "an integer"; str | int -> "a string or an integer";
    list[Annotated[int, Bound(0)]] -> "a list of integers >= 0"; (float, plural) -> "numbers"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(expected(a, plural) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is typing.Annotated:
        words = expected(args[0], plural)
        for rule in args[1:]:
            if isinstance(rule, (Bound, NonEmpty)):
                words = rule.phrase(words)
        return words
    items = [a for a in args if a is not Ellipsis]
    if origin in (list, tuple):
        inner = f" of {expected(items[0], True)}" if len(set(items)) == 1 else ""
        return ("lists" if plural else "a list") + inner
    if origin is dict:
        return "mappings" if plural else "a mapping"
    names = _EXPECTED_PLURAL if plural else _EXPECTED
    return names.get(annotation, "values" if plural else "a value")


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
        return None if value in choices else expected(annotation)
    if origin is typing.Annotated:
        base, *rules = typing.get_args(annotation)
        rules = [r for r in rules if isinstance(r, (Bound, NonEmpty))]
        fits = type_error(value, base, scalar_str, finite) is None and all(r.holds(value) for r in rules)
        return None if fits else expected(annotation)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return "a list"
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(set(args)) == 1 and any(type_error(v, args[0], scalar_str, finite) for v in value):
            return f"a list of {expected(args[0], plural=True)}"
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return "a mapping"
        key, item = (typing.get_args(annotation) + (Any, Any))[:2]
        if any(type_error(k, key, scalar_str, finite) for k in value):
            return f"a mapping with {expected(key, plural=True)} as keys"
        if any(type_error(v, item, scalar_str, finite) for v in value.values()):
            return f"a mapping to {expected(item, plural=True)}"
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


def json_lines(text: str, path: object, error: type[InputError] = InputError) -> Iterator[tuple[str, Any]]:
    """(``"path:line"``, value) for every non-blank line of JSON Lines ``text`` read from ``path``, in order; a line
    that is not JSON raises ``error`` naming it. Example: ``'{"a": 1}\n\n[2]\n'`` from ``q.jsonl`` gives
    ``("q.jsonl:1", {"a": 1})``, ``("q.jsonl:3", [2])``; ``'{"a":'`` raises ``q.jsonl:1: malformed JSON (Expecting
    value at column 6)``."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
        yield f"{path}:{lineno}", value
