"""The method ``sam``: SAM-Decoding (Hu et al., arXiv:2411.10666 Sec. 3), a suffix automaton over the prompt and the
generated text, with its published fallback to a head-based drafter (here EAGLE-2 on the shipped head) when the match
is short.

Each turn the automaton (:class:`methods.sam.automaton.SuffixAutomaton`) is built over the prompt and extended by
every committed token. Each step finds the longest suffix of the context + the pending root that occurs earlier and
drafts, as a chain, up to ``draft_tokens`` tokens that followed its first occurrence
(:meth:`~methods.sam.automaton.SuffixAutomaton.draft`). A match of at least ``threshold`` tokens (the root included)
verifies that chain; a shorter one falls back to ``fallback``: ``eagle2`` = EAGLE-2's dynamic tree (arXiv:2406.16858
Sec. 4; options ``head``, ``total_tokens``, ``depth``, ``top_k`` as for method ``eagle2``; its draft KV follows every
committed token, so it catches up on the steps the chain took), ``none`` = no draft (a plain target step). Both
proposals are deterministic, so verification is lossless at every temperature.

The dynamic automaton lives for one turn (prompt + its output; a chat's later turn has the earlier turns in its
prompt), so results do not depend on the order of questions. Against the reference code (hyx1999/SAM-Decoding
18c41f0, ``samd/sam/dyn_sam.py``, ``samd/draft.py``; docs/reference.md): the same match length and the same chain at
every step of a replay, the threshold held against the longest match as there, also when the chain climbs to a
shorter suffix with an earlier first occurrence; the match state is recomputed from the whole text's state at every
step rather than carried along; the reference's ``to_anc`` also climbs when exactly ``draft_tokens`` tokens follow
the first occurrence (it compares with ``n_predicts``, the draft plus the root), and pads a short chain with token 0
to its fixed length, where this chain ends with the text. Counters: ``sam_steps`` (chain steps), ``fallback_steps``.

Option ``static`` adds the paper's second, static automaton over a corpus built once (Sec. 3;
:class:`methods.sam.automaton.StaticAutomaton`, ``draftbench data static-sam`` over REST's ShareGPT datastore,
``samd/sam/static_sam.py`` there): a cursor follows the prompt and every committed token through it, each step
drafts what followed the first occurrence in the corpus of the longest suffix of context + root, and
:func:`methods.sam.automaton.choose_automaton` picks as the reference's ``DraftModel.lookup``: the static match
length less ``len_bias`` against the dynamic one, the dynamic on a tie, the fallback when neither reaches
``threshold``. Counter ``static_steps``. The corpus is fixed, so results still do not depend on the order of
questions. Against the reference: its corpus joins documents with EOS and its drafts may run on past it into the next
document (padding a short draft with token 0), where this one stops at the document's end; it also adds every
vocabulary id as a one-token document (a static match of at least 1 token, which drafts only where
``threshold + len_bias`` is 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.engine.checkpoints import check_head_option
from harness.engine.hostio import fetch, upload
from harness.engine.method import build_options
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, chain_tree
from harness.models import Target, cache_dir
from harness.registry import register_method
from methods.eagle.eagle2 import Eagle2, Eagle2Options
from methods.rest.datastore import concatenate, tokenizer_identity
from methods.rest.rest import example_documents
from methods.sam.automaton import (
    StaticAutomaton,
    SuffixAutomaton,
    choose_automaton,
    default_static_dir,
    load_static_automaton,
)

FALLBACKS = ("eagle2", "none")


@dataclass
class SamOptions:
    """``threshold``: the shortest match (root included) whose chain is verified; ``draft_tokens``: the chain's
    length (the defaults 4 and 10 are the reference code's at v0.4.1, hyx1999/SAM-Decoding 0be73fd; since then its
    ``len_threshold`` 5 and ``n_predicts`` 40, i.e. 39 drafted tokens); ``fallback``: ``eagle2`` or ``none``;
    ``head``, ``total_tokens``, ``depth``, ``top_k``: the EAGLE-2 fallback's options (ignored with ``none``);
    ``static``: the static automaton, a folder or ``sharegpt`` (the target's in the user cache,
    :func:`methods.sam.automaton.default_static_dir`), off by default; ``len_bias``: subtracted from the static
    match length before the choice (4, the reference's default at v0.4.1 beside threshold 4; 5 at 18c41f0 beside
    ``len_threshold`` 5)."""

    threshold: int = 4
    draft_tokens: int = 10
    fallback: str = "eagle2"
    head: str | None = None
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    static: str | None = None
    len_bias: int = 4

    def __post_init__(self):
        if isinstance(self.len_bias, bool) or not isinstance(self.len_bias, int) or self.len_bias < 0:
            raise ValueError(f"len_bias must be an integer >= 0, got {self.len_bias!r}")
        if self.static is not None and (not isinstance(self.static, str) or not self.static):
            raise ValueError(f"static must be a folder or 'sharegpt', got {self.static!r}")
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
    """SAM-Decoding (arXiv:2411.10666 Sec. 3): suffix-automaton chains (+ a static corpus), EAGLE-2 below a threshold.

    ``fallback`` (an :class:`methods.eagle.eagle2.Eagle2`) may be passed directly; otherwise it is built from the
    options (the shipped head by default). It shares this method's counters and runtime. ``static`` (a
    :class:`methods.sam.automaton.StaticAutomaton`) likewise; otherwise it is loaded when the option names one, and a
    missing one, or one built for another tokenizer, is refused here in one line.
    """

    Options = SamOptions
    needs_hidden_states = True  # for the EAGLE-2 fallback; False on instances with fallback none

    def __init__(self, target: Target, options=None, fallback: Eagle2 | None = None,
                 static: StaticAutomaton | None = None):
        super().__init__(target, options)
        o = self.options
        if static is None and o.static is not None:
            identity = tokenizer_identity(target.tokenizer, target.name)
            folder = default_static_dir(cache_dir(), identity) if o.static == "sharegpt" else o.static
            static = load_static_automaton(Path(folder).expanduser(), identity)
        self.static = static
        self.cursor = (0, 0)  # the static automaton's (state, match length) after the context
        if o.fallback == "eagle2" and fallback is None:
            fallback = Eagle2(target, o.eagle2_options())
        self.fallback = fallback if o.fallback == "eagle2" else None
        self.needs_hidden_states = self.fallback is not None
        self.automaton = SuffixAutomaton()

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> SamDecoding:
        """The method with a randomly initialised EAGLE-2 head (:meth:`methods.eagle.draft.EagleMethodBase.example`)
        when the fallback is ``eagle2``; with any ``static``, a static automaton in memory over
        :func:`methods.rest.rest.example_documents` (the target's greedy continuations)."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        fallback = static = None
        if opts.fallback == "eagle2":
            fallback = Eagle2.example(target, seed, total_tokens=opts.total_tokens, depth=opts.depth, top_k=opts.top_k)
        if opts.static is not None:
            static = StaticAutomaton.build(concatenate(example_documents(target, seed)), source="example")
        return cls(target, opts, fallback=fallback, static=static)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        if self.fallback is not None:
            described["fallback"] = self.fallback.describe()
        if self.static is not None:
            keep = ("path", "source", "documents", "tokens", "states", "tokenizer")
            described["static_automaton"] = {k: self.static.manifest[k] for k in keep if k in self.static.manifest}
        return described

    def draft_kv_bytes(self, positions: int) -> int | None:
        """The EAGLE-2 fallback's own draft KV at ``positions`` context tokens
        (:meth:`methods.eagle.draft.EagleMethodBase.draft_kv_bytes`): it follows every committed token, chain steps
        included, so it holds the whole context. None with fallback ``none``: the suffix automaton holds token ids and
        states over them, no KV cache."""
        return self.fallback.draft_kv_bytes(positions) if self.fallback is not None else None

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        prompt = fetch(prompt_ids[0])
        self.automaton = SuffixAutomaton(prompt)
        if self.static is not None:
            self.cursor = self.static.follow(0, 0, prompt)
        if self.fallback is not None:
            self.fallback.counters, self.fallback.runtime = self.counters, self.runtime
            self.fallback.begin(prompt_ids, hidden)

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        o = self.options
        length, chain = self.automaton.draft(root, o.draft_tokens)
        static_length, static_chain = (0, []) if self.static is None else self.static.draft(*self.cursor, root,
                                                                                            o.draft_tokens)
        choice = choose_automaton(length, static_length, o.len_bias, o.threshold)
        chain = {"dynamic": chain, "static": static_chain}.get(choice)
        if chain:
            counter = "sam_steps" if choice == "dynamic" else "static_steps"
            self.counters[counter] = self.counters.get(counter, 0) + 1
            return chain_tree(upload(chain, self.target.output_device))
        self.counters["fallback_steps"] = self.counters.get("fallback_steps", 0) + 1
        if self.fallback is None:
            return chain_tree(upload([], self.target.output_device))
        return self.fallback.propose(root, sampling, generator)

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        for token in tokens:
            self.automaton.extend(token)
        if self.static is not None:
            self.cursor = self.static.follow(*self.cursor, tokens)
        if self.fallback is not None:
            self.fallback.accept(tokens, hidden, next_root)
