"""The method ``sam``: SAM-Decoding (Hu et al., arXiv:2411.10666 Sec. 3), a suffix automaton over the prompt and the
generated text, with its published fallback to a head-based drafter (here EAGLE-2 on the shipped head) when the match
is short.

Each turn the automaton (:class:`harness.engine.suffix.SuffixAutomaton`) is built over the prompt and extended by
every committed token. Each step finds the longest suffix of the context + the pending root that occurs earlier and
drafts, as a chain, up to ``draft_tokens`` tokens that followed its first occurrence
(:meth:`~harness.engine.suffix.SuffixAutomaton.draft`). A match of at least ``threshold`` tokens (the root included)
verifies that chain; a shorter one falls back to ``fallback``: ``eagle2`` = EAGLE-2's dynamic tree (arXiv:2406.16858
Sec. 4; options ``head``, ``total_tokens``, ``depth``, ``top_k`` as for method ``eagle2``; its draft KV follows every
committed token, so it catches up on the steps the chain took), ``none`` = no draft (a plain target step). Both
proposals are deterministic, so verification is lossless at every temperature. Not built: the paper's second, static
automaton over a text corpus. The automaton lives for one turn (prompt + its output; a chat's later turn has the
earlier turns in its prompt), so results do not depend on the order of questions. Against the reference code
(hyx1999/SAM-Decoding 18c41f0, ``samd/sam/dyn_sam.py``, ``samd/draft.py``; docs/reference.md): the same match
length and the same chain at every step of a replay, the threshold held against the longest match as there, also
when the chain climbs to a shorter suffix with an earlier first occurrence; the match state is recomputed from the
whole text's state at every step rather than carried along; the reference's ``to_anc`` also climbs when exactly
``draft_tokens`` tokens follow the first occurrence (it compares with ``n_predicts``, the draft plus the root), and
pads a short chain with token 0 to its fixed length, where this chain ends with the text. Counters: ``sam_steps``
(chain steps), ``fallback_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.engine.checkpoints import check_head_option
from harness.engine.hostio import fetch, upload
from harness.engine.method import build_options
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.suffix import SuffixAutomaton
from harness.engine.tree import DraftTree, chain_tree
from harness.models import Target
from harness.registry import register_method
from methods.eagle.eagle2 import Eagle2, Eagle2Options

FALLBACKS = ("eagle2", "none")


@dataclass
class SamOptions:
    """``threshold``: the shortest match (root included) whose chain is verified; ``draft_tokens``: the chain's
    length (the defaults 4 and 10 are the reference code's at v0.4.1, hyx1999/SAM-Decoding 0be73fd; since then its
    ``len_threshold`` 5 and ``n_predicts`` 40, i.e. 39 drafted tokens); ``fallback``: ``eagle2`` or ``none``;
    ``head``, ``total_tokens``, ``depth``, ``top_k``: the EAGLE-2 fallback's options (ignored with ``none``)."""

    threshold: int = 4
    draft_tokens: int = 10
    fallback: str = "eagle2"
    head: str | None = None
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10

    def __post_init__(self):
        if isinstance(self.threshold, bool) or self.threshold < 1:
            raise ValueError(f"threshold must be an integer >= 1, got {self.threshold!r}")
        if isinstance(self.draft_tokens, bool) or self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be an integer >= 1, got {self.draft_tokens!r}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        check_head_option(self.head)
        self.eagle2_options()  # the fallback's options are checked now, not at the first turn

    def eagle2_options(self) -> Eagle2Options:
        return Eagle2Options(head=self.head, total_tokens=self.total_tokens, depth=self.depth, top_k=self.top_k)


@register_method("sam")
class SamDecoding(SpeculativeMethod):
    """SAM-Decoding: suffix-automaton chains, EAGLE-2 below a match threshold (arXiv:2411.10666 Sec. 3).

    ``fallback`` (an :class:`methods.eagle.eagle2.Eagle2`) may be passed directly; otherwise it is built from the
    options (the shipped head by default). It shares this method's counters and runtime.
    """

    Options = SamOptions
    needs_hidden_states = True  # for the EAGLE-2 fallback; False on instances with fallback none

    def __init__(self, target: Target, options=None, fallback: Eagle2 | None = None):
        super().__init__(target, options)
        o = self.options
        if o.fallback == "eagle2" and fallback is None:
            fallback = Eagle2(target, o.eagle2_options())
        self.fallback = fallback if o.fallback == "eagle2" else None
        self.needs_hidden_states = self.fallback is not None
        self.automaton = SuffixAutomaton()

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> SamDecoding:
        """The method with a randomly initialised EAGLE-2 head (:meth:`methods.eagle.draft.EagleMethodBase.example`)
        when the fallback is ``eagle2``."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        fallback = None
        if opts.fallback == "eagle2":
            fallback = Eagle2.example(target, seed, total_tokens=opts.total_tokens, depth=opts.depth, top_k=opts.top_k)
        return cls(target, opts, fallback=fallback)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        if self.fallback is not None:
            described["fallback"] = self.fallback.describe()
        return described

    def draft_kv_bytes(self, positions: int) -> int | None:
        """The EAGLE-2 fallback's own draft KV at ``positions`` context tokens
        (:meth:`methods.eagle.draft.EagleMethodBase.draft_kv_bytes`): it follows every committed token, chain steps
        included, so it holds the whole context. None with fallback ``none``: the suffix automaton holds token ids and
        states over them, no KV cache."""
        return self.fallback.draft_kv_bytes(positions) if self.fallback is not None else None

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.automaton = SuffixAutomaton(fetch(prompt_ids[0]))
        if self.fallback is not None:
            self.fallback.counters, self.fallback.runtime = self.counters, self.runtime
            self.fallback.begin(prompt_ids, hidden)

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        length, chain = self.automaton.draft(root, self.options.draft_tokens)
        if chain and length >= self.options.threshold:
            self.counters["sam_steps"] = self.counters.get("sam_steps", 0) + 1
            return chain_tree(upload(chain, self.target.output_device))
        self.counters["fallback_steps"] = self.counters.get("fallback_steps", 0) + 1
        if self.fallback is None:
            return chain_tree(upload([], self.target.output_device))
        return self.fallback.propose(root, sampling, generator)

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        for token in tokens:
            self.automaton.extend(token)
        if self.fallback is not None:
            self.fallback.accept(tokens, hidden, next_root)
