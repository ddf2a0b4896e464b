"""The contract every decoding method implements, and what a generation returns.

A method is constructed once per (target, options) and then asked to ``generate`` one turn at a time. The
harness reads capability flags (``lossless``, ``needs_hidden_states``), never a method's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from harness.engine.runtime import TargetRunner, target_runner
from harness.engine.sampling import SamplingParams
from harness.models import Target


@dataclass
class Generation:
    """The tokens of one turn and the raw counters every metric is derived from (see :mod:`harness.measure.metrics`).

    accept_lengths[i]: tokens appended by target forward i. Forward 0 is the prefill (1 token); for vanilla every
        entry is 1; for a speculative step it is accepted drafts + 1 (the bonus token), cut at EOS or the token
        budget. ``sum(accept_lengths) == len(token_ids)`` and ``len(accept_lengths)`` is the number of target
        forwards.
    accepted_drafts[j]: for verification step j (prefill excluded), how many draft tokens verification accepted,
        before any cut at EOS/budget. Per-position acceptance comes from this.
    draft_depths[j]: the depth of the tree proposed at step j (the most tokens it could have accepted).
    logit_margins[k], logit_tops[k], logit_runner_ups[k] (greedy decoding only, else empty): the target's logits
        that chose token k: top-1 minus top-2, the top-1 value (float32 of the model's logits) and the top-2 token.
        A greedy method whose output differs from vanilla's is told apart from a near tie by these (see
        :func:`harness.measure.metrics.divergence`).
    timings_synchronised: whether ``timings`` were measured with a device synchronisation at every mark (None when
        the method has no timing split).
    """

    token_ids: list[int]
    accept_lengths: list[int]
    stop_reason: str
    prefill_time_s: float = 0.0
    accepted_drafts: list[int] = field(default_factory=list)
    draft_depths: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    logit_margins: list[float] = field(default_factory=list)
    logit_tops: list[float] = field(default_factory=list)
    logit_runner_ups: list[int] = field(default_factory=list)
    timings_synchronised: bool | None = None

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)


def cut_at_stop(new: list[int], produced: int, max_new_tokens: int,
                eos_ids: frozenset[int]) -> tuple[list[int], str | None]:
    """Keep the part of ``new`` that may be emitted after ``produced`` tokens; say why generation stops, if it does.

    Nothing past the first EOS (the EOS itself is kept) and nothing past ``max_new_tokens`` is ever emitted.
    Example: new=[5, 2, 7], eos={2}, produced=0, max=10 -> ([5, 2], "eos"); new=[5, 6], produced=9, max=10 ->
    ([5], "max_new_tokens").
    """
    room = max_new_tokens - produced
    kept = new[: max(room, 0)]
    for i, t in enumerate(kept):
        if t in eos_ids:
            return kept[: i + 1], "eos"
    if produced + len(kept) >= max_new_tokens:
        return kept, "max_new_tokens"
    return kept, None


class OptionsError(ValueError):
    """A method or config option that does not exist or has a bad value; the message names the field."""


@dataclass
class NoOptions:
    pass


def build_options(options_cls: type, values: dict[str, Any] | None, where: str):
    """Instantiate a dataclass of options from a dict, naming the bad field on error.

    Every value is first checked against its field's annotation (:func:`option_type_error`), so a wrong type is
    named with the type expected, e.g. ``method 'eagle2': option top_k expects an integer, got 'abc'``, rather than
    failing somewhere inside the method.
    """
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        import difflib

        hints = [f"{u!r} (did you mean {difflib.get_close_matches(u, names, 1)[0]!r}?)"
                 if difflib.get_close_matches(u, names, 1) else repr(u) for u in unknown]
        raise OptionsError(f"{where}: unknown option {', '.join(hints)}; valid: {', '.join(sorted(names)) or '(none)'}")
    try:
        hints = typing.get_type_hints(options_cls)
    except Exception:  # an annotation that does not resolve: leave the checks to the class
        hints = {}
    for name, value in values.items():
        expected = option_type_error(value, hints.get(name, Any))
        if expected:
            raise OptionsError(f"{where}: option {name} expects {expected}, got {value!r}")
    try:
        return options_cls(**values)
    except (TypeError, ValueError) as e:
        raise OptionsError(f"{where}: {e}") from e


_SIMPLE = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string",
           type(None): "null", list: "a list", dict: "a mapping", tuple: "a list"}


def option_type_error(value: Any, annotation: Any) -> str | None:
    """What ``annotation`` expects, when ``value`` does not fit it; None when it fits or the type is not one checked.

    Checked: int (not bool), float (int or float, finite), bool, str (any YAML scalar: on/off and true/false arrive
    as booleans and the option itself decides), None, list / tuple / dict, list[X] element-wise, and unions of these.
    Examples: (\"abc\", int) -> "an integer"; (3, float) -> None; (None, int | None) -> None;
    ([1, "a"], list[int]) -> "a list of integers".
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if any(option_type_error(value, a) is None for a in options):
            return None
        return " or ".join(option_type_error(value, a) or "?" for a in options)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return "a list"
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(set(args)) == 1 and any(option_type_error(v, args[0]) for v in value):
            return f"a list of {_plural(option_type_error(object(), args[0]))}"
        return None
    if origin is dict:
        return None if isinstance(value, dict) else "a mapping"
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is str:
        ok = isinstance(value, (str, bool, int, float))
    elif annotation is type(None):
        ok = value is None
    elif annotation in (list, tuple):
        ok = isinstance(value, (list, tuple))
    elif annotation is dict:
        ok = isinstance(value, dict)
    else:
        return None
    return None if ok else _SIMPLE[annotation]


def _plural(expected: str | None) -> str:
    """"an integer" -> "integers"; "a finite number" -> "finite numbers"."""
    words = (expected or "values").split(" ", 1)
    text = words[1] if words[0] in ("a", "an") and len(words) > 1 else " ".join(words)
    return text if text.endswith("s") else text + "s"


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with the CPU random generator seeded by ``seed`` and restore its state afterwards (random
    initialisation of example draft parts that neither depends on nor disturbs the caller's random state)."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


class Method:
    """Base class of a decoding method.

    Subclasses set ``Options`` (a dataclass validated in ``__post_init__``) and implement :meth:`generate`.
    ``lossless``: at temperature 0 the output equals vanilla greedy and at temperature > 0 the target's
    distribution is preserved; a method or option that breaks this must say so (the tables label it).
    """

    name: ClassVar[str] = "?"
    Options: ClassVar[type] = NoOptions
    needs_hidden_states: ClassVar[bool] = False
    runtime: str = "eager"  # how the target's forward runs (harness.engine.runtime.RUNTIMES); the harness sets it

    def __init__(self, target: Target, options=None):
        self.target = target
        self.options = options if options is not None else self.Options()

    @classmethod
    def create(cls, target: Target, options: dict[str, Any] | None = None) -> Method:
        return cls(target, build_options(cls.Options, options, f"method {cls.name!r}"))

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> Method:
        """An instance that needs no files, for tests and smoke runs: ``options`` as for :meth:`create` (the others
        keep their defaults) and every learned draft part randomly initialised from ``seed`` (see :func:`seeded`).

        The default is :meth:`create`, enough for a method without learned parts (vanilla, pld). A method that
        loads a checkpoint must override it: the losslessness tests build every registered method this way and
        fail, naming the method, when it cannot be built.
        """
        return cls.create(target, options)

    @property
    def lossless(self) -> bool:
        return True

    @property
    def target_runner(self) -> TargetRunner:
        """The seam every target forward goes through: eager or compiled, per :attr:`runtime` (shared by the methods
        of one runtime on this target)."""
        return target_runner(self.target, self.runtime)

    def describe(self) -> dict[str, Any]:
        """What goes into the manifest and every table row: the options, the lossless flag and the runtime."""
        return {"method": self.name, "lossless": self.lossless, "options": dataclasses.asdict(self.options),
                "runtime": self.runtime}

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        """Continue ``prompt_ids [1, P]`` by at most ``max_new_tokens`` tokens (stopping after EOS)."""
        raise NotImplementedError(f"method {self.name!r} ({type(self).__qualname__}) does not implement generate(); "
                                  "implement it, or subclass harness.engine.speculative.SpeculativeMethod and "
                                  "implement begin/propose/accept")
