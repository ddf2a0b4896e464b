"""Prompt lookup decoding (PLD): a model-free draft copied from earlier in the context.

The last n tokens of prompt + generated text (the pending root included) are looked up earlier in that same
sequence; the tokens that followed the most recent earlier occurrence are proposed as a chain. n goes from
``max_ngram`` down to ``min_ngram``; the first n with a match wins; no match gives an empty tree (the step is then
a plain target forward). The proposal is a deterministic function of the context, so verification is lossless.

Worked example (max_ngram 3, min_ngram 1, num_draft_tokens 3): context [1, 2, 3, 4, 9, 2, 3, 5, 2, 3]. The last
3-gram [5, 2, 3] occurs nowhere earlier; the last 2-gram [2, 3] occurs at positions 1 and 5; the most recent one
(position 5) was followed by [5, 2, 3] -> draft [5, 2, 3].

Differences from the reference implementations: transformers' ``prompt_lookup_num_tokens``, the original PLD and
vLLM's ``ngram`` take the *earliest* match; this one takes the most recent by default, which tracks the current
passage in long contexts. ``occurrence=earliest`` drafts as they do (so that a vLLM ``ngram`` entry has a harness twin
of its own rule to be refereed against).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.hostio import upload
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, chain_tree
from harness.registry import register_method
from methods.pld.lookup import lookup_draft


@dataclass
class PldOptions:
    max_ngram: int = 3
    min_ngram: int = 1
    num_draft_tokens: int = 10
    occurrence: str = "recent"  # which earlier occurrence of the n-gram to copy after: recent or earliest

    def __post_init__(self):
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram ({self.max_ngram}) must be >= min_ngram ({self.min_ngram})")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.occurrence not in ("recent", "earliest"):
            raise ValueError(f"occurrence must be 'recent' or 'earliest', got {self.occurrence!r}")


@register_method("pld")
class PromptLookup(SpeculativeMethod):
    Options = PldOptions

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.context: list[int] = prompt_ids[0].tolist()

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        o = self.options
        draft = lookup_draft(self.context + [root], o.max_ngram, o.min_ngram, o.num_draft_tokens,
                             o.occurrence == "earliest")
        device = self.target.device if self.target is not None else "cpu"  # model-free use (tests)
        return chain_tree(upload(draft, device))

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.context.extend(tokens)
