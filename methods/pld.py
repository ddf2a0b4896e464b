"""Prompt lookup decoding (PLD): a model-free draft copied from earlier in the context.

The last n tokens of prompt + generated text (the pending root included) are looked up earlier in that same
sequence; the tokens that followed the most recent earlier occurrence are proposed as a chain. n goes from
``max_ngram`` down to ``min_ngram``; the first n with a match wins; no match gives an empty tree (the step is then
a plain target forward). The proposal is a deterministic function of the context, so verification is lossless.

Worked example (max_ngram 3, min_ngram 1, num_draft_tokens 3): context [1, 2, 3, 4, 9, 2, 3, 5, 2, 3]. The last
3-gram [5, 2, 3] occurs nowhere earlier; the last 2-gram [2, 3] occurs at positions 1 and 5; the most recent one
(position 5) was followed by [5, 2, 3] -> draft [5, 2, 3].

Differences from the reference implementations: transformers' ``prompt_lookup_num_tokens`` and the original PLD
take the *earliest* match; this one takes the most recent, which tracks the current passage in long contexts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.engine.hostio import upload
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, chain_tree
from harness.registry import register_method


@dataclass
class PldOptions:
    max_ngram: int = 3
    min_ngram: int = 1
    num_draft_tokens: int = 10

    def __post_init__(self):
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram ({self.max_ngram}) must be >= min_ngram ({self.min_ngram})")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")


def lookup_draft(context: list[int], max_ngram: int, min_ngram: int, num_draft_tokens: int) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the context's last n-gram (longest n first).

    An occurrence must end before the last token (so that at least one token follows it). Example: context
    [1, 2, 3, 1, 2], n=2 -> [1, 2] occurs at position 0, followed by [3, 1, 2] -> with num_draft_tokens 2: [3, 1].
    Runs on the host (numpy): the context is host data, and a device lookup would cost a round trip per step.
    """
    seq = np.asarray(context, dtype=np.int64)  # [L]
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq, n)[: length - n]  # [L-n, n]: n-grams with a successor
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start: start + num_draft_tokens]
    return []


@register_method("pld")
class PromptLookup(SpeculativeMethod):
    Options = PldOptions

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.context: list[int] = prompt_ids[0].tolist()

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        o = self.options
        draft = lookup_draft(self.context + [root], o.max_ngram, o.min_ngram, o.num_draft_tokens)
        device = self.target.device if self.target is not None else "cpu"  # model-free use (tests)
        return chain_tree(upload(draft, device))

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.context.extend(tokens)
