"""Oracle drafter, not deployable: drafts the target's own greedy continuation, a bound for drafters of its budget.

The continuation of a turn comes from a greedy pass of the target over the same prompt (:class:`methods.vanilla.
Vanilla`, the same runtime) that the runner makes *before* the timed turn (:meth:`Oracle.prepare_turn`, outside
the tracker, so it is not in ``wall_time_s``); a turn called without it (a test calling ``generate`` directly)
makes the pass itself, inside whatever times the call. Each step then proposes the next ``k`` tokens of that
continuation after the pending root as a chain, and ``slots`` > ``k`` pads the tree with children of the root that
carry other tokens (never accepted), so that a step verifies as many draft slots as the compared method's tree:
the oracle has that method's tree budget and a perfect, free drafter. Its speed-up over the baseline is the
**oracle bound** S* of the report's headroom ledger (:func:`harness.measure.headroom.oracle_bound`; arXiv:2601.11580
measures such a bound on vLLM). Option ``pair``: the label of the entry whose budget it mirrors (set ``k`` to that
method's draft depth and ``slots`` to its tree size); the report holds that entry against this oracle.

Verification is the engine's own, so the output is the target's greedy output (lossless). Temperature > 0: the
greedy continuation is not what the target samples, so drafts are soon rejected; once the committed text leaves
the continuation (a rejection, or a near tie that one-token decoding and the tree forward break differently) the
oracle drafts nothing for the rest of the turn and its ``method_notes`` say at which step. The report gives no
S* at T > 0. ``deployable = False``: the manifest, every record (``deployable: false``) and every table say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.engine.hostio import upload
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, chain_tree
from harness.registry import register_method
from methods.vanilla import Vanilla


@dataclass
class OracleOptions:
    k: int = 5          # chain length: the greedy tokens drafted after the root each step
    slots: int = 0      # draft slots verified per step (0 = k); more pads the tree with rejected children of the root
    pair: str = ""      # the label whose tree budget this oracle mirrors (the report pairs them); "" = none

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.slots and self.slots < self.k:
            raise ValueError(f"slots must be 0 (= k) or >= k = {self.k}, got {self.slots}")
        if max(self.k, self.slots) > SpeculativeMethod.max_tree_slots - 1:
            raise ValueError(f"k and slots must be at most {SpeculativeMethod.max_tree_slots - 1} (the verification "
                             f"forward's room beside the root), got k {self.k}, slots {self.slots}")


def oracle_tree(future: list[int], slots: int, vocab: int, device: torch.device | str = "cpu") -> DraftTree:
    """One oracle proposal: ``future`` (the greedy tokens after the root) as a chain, then children of the root up
    to ``slots`` nodes in all whose tokens follow the chain's first token (so that none of them is the greedy one and
    greedy verification takes the chain); on ``device`` with one upload. Example: future [7, 8], slots 4, vocab 10
    -> tokens [7, 8, 8, 9], parents [-1, 0, -1, -1]; future [] -> the empty tree."""
    pad = max(slots - len(future), 0) if future else 0
    if pad >= vocab:
        raise ValueError(f"slots: {slots} slots need {pad} padding tokens other than the greedy one, but the "
                         f"vocabulary has {vocab}")
    tree = chain_tree(upload(list(future) + [(future[0] + i) % vocab for i in range(1, pad + 1)], device))
    if pad:
        tree.parents[len(future):] = -1  # the padding hangs off the root
    return tree


@register_method("oracle")
class Oracle(SpeculativeMethod):
    """Oracle drafter: the target's own greedy continuation as the draft (a bound, not deployable)."""

    Options = OracleOptions
    deployable: ClassVar[bool] = False

    def __init__(self, target, options=None):
        super().__init__(target, options)
        # (the prompt tensor the runner will pass, budget, continuation): matched by identity, so that the timed turn
        # does not read the prompt back to compare it
        self._prepared: tuple[torch.Tensor, int, list[int]] | None = None
        self.continuation: list[int] = []
        self.lost_at: int | None = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "deployable": False}

    def _greedy(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
        vanilla = Vanilla(self.target)
        vanilla.runtime = self.runtime
        return vanilla.generate(prompt_ids, max_new_tokens, SamplingParams()).token_ids

    def prepare_turn(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        """The greedy pass of a turn, made by the runner before the timed turn (outside its wall time)."""
        self._prepared = (prompt_ids, max_new_tokens, self._greedy(prompt_ids, max_new_tokens))

    def generate(self, prompt_ids, max_new_tokens, sampling, generator=None):
        prepared = self._prepared
        if prepared is not None and (prepared[0] is not prompt_ids or prepared[1] != max_new_tokens):
            prepared = None  # prepared for another turn: make the pass here
        self._prepared = None
        self.continuation = prepared[2] if prepared else self._greedy(prompt_ids, max_new_tokens)
        return super().generate(prompt_ids, max_new_tokens, sampling, generator)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.at, self.step, self.lost_at = 0, 0, None  # at: the index of the pending root in the continuation

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self.step += 1
        if self.lost_at is None and (self.at >= len(self.continuation) or root != self.continuation[self.at]):
            self.lost_at = self.step
        future = [] if self.lost_at is not None else self.continuation[self.at + 1: self.at + 1 + self.options.k]
        return oracle_tree(future, self.options.slots, self.target.model.config.vocab_size, self.target.device)

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.at += len(tokens)

    def turn_notes(self) -> dict[str, Any] | None:
        """``{"lost_at_step": i}`` when the committed text left the greedy continuation at verification step i (from
        then on nothing was drafted); None when the oracle drafted the whole turn."""
        return None if self.lost_at is None else {"lost_at_step": self.lost_at}
