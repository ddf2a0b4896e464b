"""The contract every decoding method implements, and what a generation returns.

A method is constructed once per (target, options) and then asked to ``generate`` one turn at a time. The
harness reads capability flags (``lossless``, ``needs_hidden_states``), never a method's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from harness.engine.runtime import TargetRunner, target_runner
from harness.engine.sampling import SamplingParams
from harness.models import Target
from harness.schema import InputError, check, field_types, unknown_keys


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
    speculation_off: None, or when a speculative method stopped speculating for the rest of the turn
        (:class:`harness.engine.speculationstop.SpeculationStop`): ``{"step": i, "reason": r, "context": c}``, forward i
        (an index of ``accept_lengths``) the first plain one, r the option that stopped it (``max_spec_context`` or
        ``stop_unprofitable``), c the context in tokens (prompt and emitted) before it.
    method_notes: None, or what a speculative method chose during the turn, in its own JSON-able terms
        (:meth:`harness.engine.speculative.SpeculativeMethod.turn_notes`; layer skipping's searched layer sets).
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
    speculation_off: dict[str, Any] | None = None
    method_notes: dict[str, Any] | None = None

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


class OptionsError(InputError):
    """A method or config option that does not exist or has a bad value; the message names the field."""


@dataclass
class NoOptions:
    pass


def build_options(options_cls: type, values: dict[str, Any] | None, where: str):
    """Instantiate a dataclass of options from a dict, naming the bad field on error.

    Every value is first checked against its field's annotation (:func:`harness.schema.check`; a ``str`` option
    takes any YAML scalar, as ``on``/``off`` arrive as booleans and the option itself decides; a ``float`` option
    must be finite), so a wrong type is
    named with the type expected, e.g. ``method 'eagle2': option top_k: expected an integer, got 'abc'``, rather
    than failing somewhere inside the method.
    """
    values = dict(values or {})
    types = field_types(options_cls)
    unknown_keys(values, sorted(types), where, "option", OptionsError, list_valid=True)
    for name, value in values.items():
        check(value, types[name], f"{where}: option {name}", OptionsError, scalar_str=True, finite=True)
    try:
        return options_cls(**values)
    except (TypeError, ValueError) as e:
        raise OptionsError(f"{where}: {e}") from e


def recorded_options(options) -> dict[str, Any]:
    """A method's options as the manifest and every record show them (``method_options``): the dataclass's fields,
    in the order its ``recorded()`` gives where it has one (EAGLE-2's options, head and tree shape first).
    Example: PldOptions() -> {"num_draft_tokens": 10, "min_ngram": 1, "max_ngram": 3, ...}."""
    recorded = getattr(options, "recorded", None)
    return recorded() if callable(recorded) else dataclasses.asdict(options)


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
    runtime: str = "eager"  # how the target's forward runs (harness.engine.runtime.RUNTIMES); the run sets it

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

    @classmethod
    def lossless_with(cls, options) -> bool:
        """Whether the method with ``options`` is lossless (the instance's :attr:`lossless`), known without building
        it (an entry another engine runs never builds the method, :mod:`harness.run.entries`). A method whose
        options can break losslessness overrides this."""
        return True

    @property
    def lossless(self) -> bool:
        return self.lossless_with(self.options)

    @property
    def target_runner(self) -> TargetRunner:
        """The seam every target forward goes through: eager or compiled, per :attr:`runtime` (shared by the methods
        of one runtime on this target)."""
        return target_runner(self.target, self.runtime)

    def forget(self) -> None:
        """Drop whatever the method learned from text it has seen, for a method whose state outlives a turn (Token
        Recycling's matrix, SuffixDecoding's global tree). The runner calls it after the warm-up, so that no
        measured question is answered with the warm-up's answers in the method's memory (the warm-up question is
        also the first measured one). Stateless methods have nothing to drop."""

    def draft_kv_bytes(self, positions: int) -> int | None:
        """Bytes of the method's own draft KV cache when the context holds ``positions`` tokens
        (:func:`harness.measure.metrics.draft_kv_bytes`); None for a method that keeps none (the default). The runner
        records it beside the target's KV cache for a long-context prompt."""
        return None

    def describe(self) -> dict[str, Any]:
        """What goes into the manifest and every table row: the options, the lossless flag and the runtime."""
        return {"method": self.name, "lossless": self.lossless, "options": recorded_options(self.options),
                "runtime": self.runtime}

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        """Continue ``prompt_ids [1, P]`` by at most ``max_new_tokens`` tokens (stopping after EOS)."""
        raise NotImplementedError(f"method {self.name!r} ({type(self).__qualname__}) does not implement generate(); "
                                  "implement it, or subclass harness.engine.speculative.SpeculativeMethod and "
                                  "implement begin/propose/accept")
