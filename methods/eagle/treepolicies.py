"""Per-step policies a dynamic-tree method can hold: :class:`LookupGraft` (a prompt-lookup chain grafted onto every
step's tree), :class:`AdaptiveSizer` (each step's tree sized from measured costs and calibrated confidence) and
:class:`Backoff` (before each step, the head's tree, the lookup chain alone or no draft, whichever is expected to emit
tokens fastest).

Each is a small object with its own state; a method builds one from its options and calls it from its three verbs
(``begin``, ``propose``, ``accept``). They are drafting policies, held by EAGLE-2's dynamic tree
(:class:`methods.eagle.eagle2.DynamicTreeOptions`, and so by every method that extends it); they use only what the
method contract hands every tree method (the committed tokens, a :class:`~harness.engine.tree.DraftTree`, the target
and the turn's ``counters``), prompt lookup's matching (:mod:`methods.pld.lookup`) and the engine's pure maths
(:mod:`harness.engine.tree`, :mod:`harness.engine.autotune`), so a method in another package can hold them too.
Neither is published: EAGLE-2 (arXiv:2406.16858 Sec. 4) fixes the tree size, and prompt lookup (Saxena 2023) drafts
alone. The loop's own policy, speculation off for the rest of a turn, is the engine's
(:class:`harness.engine.speculationstop.SpeculationStop`), which reads the costs :class:`AdaptiveSizer` measured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.engine import autotune
from harness.engine.hostio import fetch, upload
from harness.engine.tree import DraftTree, chain_tree, graft_chain, path_length
from harness.models import Target
from methods.pld.lookup import lookup_match

LOOKUP_MAX_NGRAM = 3  # the longest n-gram option ``lookup`` matches (prompt lookup's default, method ``pld``)


def _count(counters: dict[str, int], name: str, n: int) -> None:
    counters[name] = counters.get(name, 0) + n


class LookupGraft:
    """Option ``lookup``: every step's tree also carries the prompt-lookup chain of up to ``length`` tokens (the
    continuation of the context's last n-gram, n from :data:`LOOKUP_MAX_NGRAM` down to ``min_ngram``, at its most
    recent earlier occurrence; :func:`methods.pld.lookup.lookup_match`), grafted onto the draft's tree
    (:func:`harness.engine.tree.graft_chain`), so a step accepts the longer of the two. ``alone`` > 0: a step whose
    chain comes from an n-gram match of at least ``alone`` tokens verifies the chain alone and skips drafting.

    With a :class:`Backoff` (option ``backoff``), a step the ``alone`` rule leaves to the draft asks it whether to
    draft (the chain grafted on), verify the chain alone or run a plain step.

    State: the committed tokens (host), the draft's own tree of the last step (host; what the draft alone proposed,
    for a calibration of the draft), whether the last step drafted and the chain it verified (empty when none).
    Counters: ``lookup_slots`` (grafted or alone chain tokens), ``lookup_alone_steps``.
    """

    def __init__(self, length: int, min_ngram: int = 1, alone: int = 0):
        self.length, self.min_ngram, self.alone = length, min_ngram, alone
        self.context: list[int] = []                            # the committed token ids
        self.own: tuple[list[int], list[int]] = ([], [])        # the draft's own tree of the last step: tokens, parents
        self.drafted = True                                     # whether the last step drafted
        self.verified: list[int] = []                           # the chain the last step verified (alone or grafted)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """A new turn: ``prompt_ids [P]`` are committed (one host read)."""
        self.context = fetch(prompt_ids)

    def accept(self, tokens: list[int]) -> None:
        self.context.extend(tokens)

    def propose(self, root: int, draft: Callable[[], DraftTree], counters: dict[str, int],
                device: torch.device, backoff: Backoff | None = None) -> DraftTree:
        """The step's tree below ``root``: the chain alone on ``device`` (a long enough match, ``draft`` not
        called), else ``draft()`` with the chain grafted on (:meth:`graft`), or what ``backoff`` chose instead."""
        n, chain = lookup_match(self.context + [root], LOOKUP_MAX_NGRAM, self.min_ngram, self.length)
        self.verified = chain
        if chain and self.alone and n >= self.alone:
            self.drafted = False
            _count(counters, "lookup_alone_steps", 1)
            _count(counters, "lookup_slots", len(chain))
            return chain_tree(upload(chain, device))
        if backoff is None:
            self.drafted = True
            return self.graft(draft(), chain, counters)
        tree = backoff.propose(chain, lambda: self.graft(draft(), chain, counters), counters, device)
        self.drafted = backoff.arm == Backoff.HEAD
        if backoff.arm == Backoff.CHAIN:
            _count(counters, "lookup_slots", len(chain))
        elif backoff.arm == Backoff.PLAIN:
            self.verified = []
        return tree

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

    def chain_accepted(self, accepted: list[int]) -> int | None:
        """How many of the ``accepted`` drafts the chain the last step verified held (what the chain alone would have
        had accepted, greedy), or None when it verified none. Example: chain [5, 7], accepted [5, 6] -> 1."""
        if not self.verified:
            return None
        return path_length(self.verified, list(range(-1, len(self.verified) - 1)), accepted)


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
        self.elapsed: float | None = None              # drafting seconds of the last step
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
        self.elapsed, self.draft_s = elapsed, autotune.decayed(self.draft_s, elapsed, 0.1)
        self.level_s = autotune.decayed(self.level_s, elapsed / max(1, forwards), 0.1)
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


class Backoff:
    """Option ``backoff`` = k > 0 (with ``adaptive``): before every step, choose what it runs: the head's tree
    (drafted and sized by ``sizer``, the lookup chain grafted on when ``lookup`` is on), the prompt-lookup chain alone
    (when ``lookup`` is on and the context has a match: no draft forward) or a plain step (the root alone: no draft
    forward, one token), whichever is expected to emit the most tokens per second (:func:`harness.engine.autotune.
    best_arm`). A step that does not draft leaves the head's pending positions to its next drafted step (the draft
    catches up then, as after a ``lookup_alone`` step). Every arm is verified by the target, so output stays the
    target's (lossless by construction; an empty tree is a plain one-token forward).

    The rule: the expected tokens and seconds of each arm, measured, never assumed. A plain step emits 1 token in
    the timed one-slot forward ``sizer.verify_s[1]``. The chain alone emits 1 + the decayed mean of the drafts a
    verified chain had accepted (every step that verified one, alone or grafted: :meth:`LookupGraft.chain_accepted`)
    in the timed forward over its slots. The head emits the decayed mean of ``1 + accepted drafts`` of its own steps
    in the decayed mean of their seconds (the step's drafting, timed as it ran, and its verification forward, at the
    timed cost of its slots), both kept apart for steps with and without a grafted chain; a head step that the sizer
    cut to the root alone counts as what it was, one token after a paid draft. The head's acceptance at a step is
    only known once its draft is paid (its probabilities, which :class:`AdaptiveSizer` calibrates); the decayed mean
    of what its steps accepted is what that calibrated acceptance predicts on average (the calibration is the ratio
    of the accepted drafts to the predicted ones), and costs nothing. The means weigh the newest step by
    :attr:`WEIGHT` (about the last 7 steps).

    Re-probing: a head that is not drafted is not measured, so a losing head would be locked out forever. The
    rule chosen is a forced probe: the head drafts at the first step of every turn (a new prompt may suit it),
    whenever k steps in a row ran without it, and while its steps of the kind at hand (with or without a chain on
    offer) have never been measured; a probe is a full head step whose outcome moves the head's means,
    so a head whose acceptance recovers is back after a few probes. A fixed period bounds what a losing head costs:
    one draft per k + 1 steps, where a decayed optimistic estimate would bound nothing. This is the explore step of a
    bandit with forced exploration, not a published rule; the closest published one is SmartSpec (arXiv:2406.14066),
    which picks each step's proposal length from 0 (no speculation) up by the goodput estimated from a
    moving average of past acceptance; DISCO (arXiv:2405.04304) and SpecDec++ (arXiv:2405.19715) decide
    while drafting, from the draft's own outputs, when to stop (here :meth:`AdaptiveSizer.another_level`), which
    cannot avoid the first draft forward that this rule skips.

    Counters: ``backoff_head``, ``backoff_chain``, ``backoff_plain`` (the steps that ran each arm),
    ``backoff_probes`` (head steps forced by the probe rule, included in ``backoff_head``). A step that the
    ``lookup_alone`` rule gives to the chain is not asked (counted as ``lookup_alone_steps``), but what its chain had
    accepted is recorded, and it counts as a step without the head.
    """

    PLAIN, CHAIN, HEAD = autotune.ARMS  # the arms best_arm names, cheapest first
    WEIGHT = 0.25  # the weight of the newest step in the decayed means

    def __init__(self, sizer: AdaptiveSizer, probe: int):
        if probe < 1:
            raise ValueError(f"Backoff: probe must be >= 1 step, got {probe}")
        self.sizer, self.probe = sizer, probe
        self.head: dict[bool, tuple[float, float]] = {}  # with a grafted chain? -> (tokens, seconds) per step
        self.chain: float | None = None                  # decayed mean of the drafts a verified chain had accepted
        self.idle = probe                                # steps in a row without the head
        self.arm: str | None = None                      # the last step's arm (None: not chosen here)
        self.grafted = False                             # whether the last step offered a chain
        self.slots = 1                                   # the last step's verified slots, root included

    def begin(self) -> None:
        """A new turn: its first step probes the head."""
        self.idle, self.arm = self.probe, None

    def choose(self, chain: int, counters: dict[str, int]) -> str:
        """The arm of the step, given a lookup chain of ``chain`` tokens on offer (0: none); counted."""
        sizer, self.grafted = self.sizer, chain > 0
        head = self.head.get(self.grafted)
        if self.idle >= self.probe or head is None:
            _count(counters, "backoff_probes", 1)
            arm = self.HEAD
        else:
            offer = None if not chain or self.chain is None else (1.0 + self.chain, sizer.verify_cost(chain + 1))
            arm = autotune.best_arm(sizer.verify_s[1], offer, head)
        _count(counters, f"backoff_{arm}", 1)
        self.arm = arm
        return arm

    def propose(self, chain: list[int], draft: Callable[[], DraftTree], counters: dict[str, int],
                device: torch.device) -> DraftTree:
        """The step's tree: ``draft()`` (the head), ``chain`` alone, or the root alone (an empty tree on ``device``),
        as :meth:`choose` decides."""
        arm = self.choose(len(chain), counters)
        tree = draft() if arm == self.HEAD else chain_tree(upload(chain if arm == self.CHAIN else [], device))
        self.slots = len(tree) + 1
        return tree

    def record(self, accepted: int, chain_accepted: int | None) -> None:
        """The last step accepted ``accepted`` drafts, of which its verified chain held ``chain_accepted`` (None: it
        verified no chain)."""
        w = self.WEIGHT
        if chain_accepted is not None:
            self.chain = autotune.decayed(self.chain, chain_accepted, w)
        if self.arm == self.HEAD:
            tokens, seconds = self.head.get(self.grafted, (None, None))
            step_s = self.sizer.elapsed + self.sizer.verify_cost(self.slots)
            self.head[self.grafted] = (autotune.decayed(tokens, 1 + accepted, w), autotune.decayed(seconds, step_s, w))
            self.idle = 0
        else:
            self.idle += 1
        self.arm = None
