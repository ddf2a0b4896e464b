"""The contract every decoding method implements, and what a generation returns.

A method is constructed once per (target, options) and then asked to ``generate`` one turn at a time. The
harness reads capability flags (``lossless``, ``needs_hidden_states``), never a method's name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

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


def cut_at_stop(new: list[int], produced: int, max_new_tokens: int, eos_ids: frozenset[int]) -> tuple[list[int], str | None]:
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
    """Instantiate a dataclass of options from a dict, naming the bad field on error."""
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        import difflib

        hints = [f"{u!r} (did you mean {difflib.get_close_matches(u, names, 1)[0]!r}?)"
                 if difflib.get_close_matches(u, names, 1) else repr(u) for u in unknown]
        raise OptionsError(f"{where}: unknown option {', '.join(hints)}; valid: {', '.join(sorted(names)) or '(none)'}")
    try:
        return options_cls(**values)
    except (TypeError, ValueError) as e:
        raise OptionsError(f"{where}: {e}") from e


class Method:
    """Base class of a decoding method.

    Subclasses set ``Options`` (a dataclass validated in ``__post_init__``) and implement :meth:`generate`.
    ``lossless``: at temperature 0 the output equals vanilla greedy and at temperature > 0 the target's
    distribution is preserved; a method or option that breaks this must say so (the tables label it).
    """

    name: ClassVar[str] = "?"
    Options: ClassVar[type] = NoOptions
    needs_hidden_states: ClassVar[bool] = False

    def __init__(self, target: Target, options=None):
        self.target = target
        self.options = options if options is not None else self.Options()

    @classmethod
    def create(cls, target: Target, options: dict[str, Any] | None = None) -> Method:
        return cls(target, build_options(cls.Options, options, f"method {cls.name!r}"))

    @property
    def lossless(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        """What goes into the manifest and every table row: the options and the lossless flag."""
        return {"method": self.name, "lossless": self.lossless, "options": dataclasses.asdict(self.options)}

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        """Continue ``prompt_ids [1, P]`` by at most ``max_new_tokens`` tokens (stopping after EOS)."""
        raise NotImplementedError
