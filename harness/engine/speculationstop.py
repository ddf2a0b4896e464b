"""Speculation off for the rest of a turn once it no longer pays (:class:`SpeculationStop`), asked by the engine's
loop itself (:attr:`harness.engine.speculative.SpeculativeMethod.speculation_stop`), since a step without
speculation is the engine's, not the method's. Not published.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from harness.engine import autotune


class MeasuredCosts(Protocol):
    """What :class:`SpeculationStop` reads of a method's measured costs (a dynamic-tree method's adaptive sizer): the
    timed verification seconds per size (root included), the running mean of drafting seconds per step, and the
    verification cost of a number of slots."""

    verify_s: dict[int, float] | None
    draft_s: float | None

    def verify_cost(self, slots: int) -> float: ...


class SpeculationStop:
    """Options ``max_spec_context`` and ``stop_unprofitable``: speculation off for the rest of a turn once it no longer
    pays; the engine's loop asks :meth:`reason` before every step, and from the first step it names a reason on, runs
    plain one-token forwards (no draft, no tree; lossless by construction, the target emits every token).

    ``max_context`` > 0: off once the context (prompt and emitted tokens, the pending root included) exceeds it
    (long-context drafts accept less, vllm-project/speculators#684; vllm-project/vllm#47602 asks for this per request).
    ``last_steps`` = n > 0: off when the last n speculative steps, at the costs ``sizer`` measured (its timed
    verification sizes, its running drafting time), emitted tokens slower than a plain one-slot forward would have
    (:func:`harness.engine.autotune.speculation_pays`). The window restarts every turn. Neither is published.
    """

    CONTEXT, UNPROFITABLE = "max_spec_context", "stop_unprofitable"  # the reasons, named by their options

    def __init__(self, max_context: int = 0, last_steps: int = 0, sizer: MeasuredCosts | None = None):
        if last_steps and sizer is None:
            raise ValueError("SpeculationStop: last_steps needs the sizer whose measured costs it reads")
        self.max_context, self.last_steps, self.sizer = max_context, last_steps, sizer
        self.steps: deque[tuple[int, int]] = deque(maxlen=max(last_steps, 1))  # (slots, accepted drafts) per step

    def begin(self) -> None:
        """A new turn: the measured window starts empty."""
        self.steps.clear()

    def record(self, slots: int, accepted: int) -> None:
        """A speculative step verified ``slots`` slots (root included) and accepted ``accepted`` drafts."""
        self.steps.append((slots, accepted))

    def reason(self, context: int) -> str | None:
        """Why the step after ``context`` tokens should not speculate (:attr:`CONTEXT` or :attr:`UNPROFITABLE`), or
        None. Example: max_context 512 -> context 512: None, 513: "max_spec_context"."""
        if self.max_context and context > self.max_context:
            return self.CONTEXT
        sizer = self.sizer
        if self.last_steps and len(self.steps) == self.last_steps and sizer.draft_s is not None:
            slots, accepted = zip(*self.steps)
            verify_s = [sizer.verify_cost(n) for n in slots]
            if not autotune.speculation_pays(list(accepted), verify_s, sizer.draft_s, sizer.verify_s[1]):
                return self.UNPROFITABLE
        return None
