"""Per-step policies a tree-drafting method can hold: :class:`LookupGraft` (a prompt-lookup chain grafted onto every
step's tree), :class:`AdaptiveSizer` (each step's tree sized from measured costs and calibrated confidence) and
:class:`SpeculationStop` (speculation off for the rest of a turn once it no longer pays).

Each is a small object with its own state; a method builds one from its options and calls it from its three verbs
(``begin``, ``propose``, ``accept``). They live in the engine, not beside one method family, because they use only
what the method contract hands every tree method (the committed tokens, a :class:`~harness.engine.tree.DraftTree`,
the target and the turn's ``counters``) and the engine's pure maths (:mod:`harness.engine.lookup`,
:mod:`harness.engine.tree`, :mod:`harness.engine.autotune`): a method in any package (``methods/`` is the plugin
layer above the harness) can hold them. Neither is published: EAGLE-2 (arXiv:2406.16858 Sec. 4) fixes the tree
size, and prompt lookup (Saxena 2023) drafts alone. :class:`SpeculationStop` is asked by the engine's loop itself
(:attr:`harness.engine.speculative.SpeculativeMethod.speculation_stop`), since a step without speculation is the
engine's, not the method's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from harness.engine import autotune
from harness.engine.hostio import fetch, upload
from harness.engine.lookup import lookup_match
from harness.engine.tree import DraftTree, chain_tree, graft_chain, path_length
from harness.models import Target

LOOKUP_MAX_NGRAM = 3  # the longest n-gram option ``lookup`` matches (prompt lookup's default, method ``pld``)


def _count(counters: dict[str, int], name: str, n: int) -> None:
    counters[name] = counters.get(name, 0) + n


class LookupGraft:
    """Option ``lookup``: every step's tree also carries the prompt-lookup chain of up to ``length`` tokens (the
    continuation of the context's last n-gram, n from :data:`LOOKUP_MAX_NGRAM` down to ``min_ngram``, at its most
    recent earlier occurrence; :func:`harness.engine.lookup.lookup_match`), grafted onto the draft's tree
    (:func:`harness.engine.tree.graft_chain`), so a step accepts the longer of the two. ``alone`` > 0: a step whose
    chain comes from an n-gram match of at least ``alone`` tokens verifies the chain alone and skips drafting.

    State: the committed tokens (host), the draft's own tree of the last step (host; what the draft alone proposed,
    for a calibration of the draft) and whether the last step drafted. Counters: ``lookup_slots`` (grafted or
    alone chain tokens), ``lookup_alone_steps``.
    """

    def __init__(self, length: int, min_ngram: int = 1, alone: int = 0):
        self.length, self.min_ngram, self.alone = length, min_ngram, alone
        self.context: list[int] = []                            # the committed token ids
        self.own: tuple[list[int], list[int]] = ([], [])        # the draft's own tree of the last step: tokens, parents
        self.drafted = True                                     # whether the last step drafted

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """A new turn: ``prompt_ids [P]`` are committed (one host read)."""
        self.context = fetch(prompt_ids)

    def accept(self, tokens: list[int]) -> None:
        self.context.extend(tokens)

    def propose(self, root: int, draft: Callable[[], DraftTree], counters: dict[str, int],
                device: torch.device) -> DraftTree:
        """The step's tree below ``root``: the chain alone on ``device`` (a long enough match, ``draft`` not
        called), else ``draft()`` with the chain grafted on (:meth:`graft`)."""
        n, chain = lookup_match(self.context + [root], LOOKUP_MAX_NGRAM, self.min_ngram, self.length)
        self.drafted = not (chain and self.alone and n >= self.alone)
        if not self.drafted:
            _count(counters, "lookup_alone_steps", 1)
            _count(counters, "lookup_slots", len(chain))
            return chain_tree(upload(chain, device))
        return self.graft(draft(), chain, counters)

    def graft(self, tree: DraftTree, chain: list[int], counters: dict[str, int]) -> DraftTree:
        """``tree`` with ``chain`` grafted on (one host read of the tree, kept as :attr:`own`).
        Example: tree tokens [5, 6] parents [-1, 0], chain [5, 7] -> tokens [5, 6, 7] parents [-1, 0, 0]."""
        own = tuple(fetch(torch.stack([tree.tokens, tree.parents])))  # one round trip: ([N] tokens, [N] parents)
        self.own = own
        if not chain:
            return tree
        tokens, parents = graft_chain(*own, chain)
        if len(tokens) > len(own[0]):
            _count(counters, "lookup_slots", len(tokens) - len(own[0]))
        device = tree.tokens.device
        return DraftTree(tokens=upload(tokens, device), parents=upload(parents, device))

    def own_accepted(self, accepted: list[int]) -> int:
        """How many of the ``accepted`` drafts the draft's own tree (without the chain) held, as a path from the root.
        Example: own tokens [5, 6] parents [-1, 0], accepted [5, 6, 9] -> 2; accepted [7] -> 0."""
        return path_length(*self.own, accepted)


class AdaptiveSizer:
    """Option ``adaptive``: every step verifies only the best n <= ``cap`` slots (root included) that maximise the
    expected tokens per second, from measured verification costs (timed once per method,
    :func:`harness.engine.autotune.time_tree_sizes`), a running mean of the drafting time and the draft's
    confidence calibrated on what was accepted (:class:`harness.engine.autotune.AcceptanceCalibration`); and
    drafting may stop before its last level when one more level cannot pay for its forward
    (:func:`harness.engine.autotune.worth_another_level`). Counter: ``adaptive_slots`` (the chosen sizes, summed).
    """

    def __init__(self, cap: int):
        self.cap = cap
        self.verify_s: dict[int, float] | None = None  # measured verification seconds per size
        self.draft_s: float | None = None              # running mean of drafting seconds per step
        self.level_s: float | None = None              # running mean of seconds per draft forward
        self.rate: float | None = None                 # expected tokens per second of the last step
        self.predicted = 0.0                           # expected accepted drafts of the last tree (uncalibrated)
        self.calibration = autotune.AcceptanceCalibration()

    def begin(self, target: Target, runtime: str) -> None:
        """Time the verification sizes once per method (the first turn is a warm-up in a run)."""
        if self.verify_s is None:
            self.verify_s = autotune.time_tree_sizes(target, autotune.adaptive_sizes(self.cap), runtime=runtime)

    def another_level(self, frontier_probs: float) -> bool:
        """Is one more draft level worth its forward, given the summed probabilities of the frontier's nodes?"""
        return autotune.worth_another_level(frontier_probs, self.level_s, self.rate, self.calibration.factor)

    def size(self, probs: list[float], elapsed: float, forwards: int, counters: dict[str, int]) -> int:
        """The step's tree size (root included) from ``probs`` (the best candidates' path probabilities, best
        first; at least ``cap - 1`` of them or all there are) after ``elapsed`` seconds of drafting in ``forwards``
        draft forwards; updates the running costs and the prediction that :meth:`accept` calibrates."""
        self.draft_s = elapsed if self.draft_s is None else 0.9 * self.draft_s + 0.1 * elapsed
        per_forward = elapsed / max(1, forwards)
        self.level_s = per_forward if self.level_s is None else 0.9 * self.level_s + 0.1 * per_forward
        factor = self.calibration.factor
        size = autotune.best_tree_size(probs, self.verify_s, self.draft_s, factor)
        self.rate = autotune.expected_rate(probs, size, self.verify_s[size], self.draft_s, factor)
        self.predicted = float(sum(probs[: size - 1]))
        _count(counters, "adaptive_slots", size)
        return size

    def accept(self, accepted: int) -> None:
        """The last sized tree had ``accepted`` of its drafts accepted: calibrate the draft's confidence."""
        self.calibration.update(self.predicted, accepted)

    def verify_cost(self, slots: int) -> float:
        """The measured seconds of a verification forward over ``slots`` slots (root included): the smallest timed
        size that holds them (a grafted lookup chain may add slots to a sized tree), else the largest.
        Example: timed {1: 1.0, 4: 1.5, 8: 2.0}: 3 slots -> 1.5; 9 slots -> 2.0."""
        sizes = sorted(self.verify_s)
        return self.verify_s[next((n for n in sizes if n >= slots), sizes[-1])]


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

    def __init__(self, max_context: int = 0, last_steps: int = 0, sizer: AdaptiveSizer | None = None):
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
