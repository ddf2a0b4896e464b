"""Prompt lookup: the tokens that followed the most recent (or, as an option, the earliest) earlier occurrence of the
context's last n-gram.

The model-free draft of the method ``pld`` (Saxena 2023, "Prompt Lookup Decoding"), and the chain that the
dynamic-tree methods graft onto their trees with option ``lookup`` (:class:`methods.eagle.treepolicies.LookupGraft`,
:func:`harness.engine.tree.graft_chain`). A deterministic function of the context, so a tree that carries it is
verified with the deterministic-proposal rule.
"""

from __future__ import annotations

import numpy as np


def lookup_draft(context: list[int], max_ngram: int, min_ngram: int, num_draft_tokens: int,
                 earliest: bool = False) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the context's last n-gram (longest n first);
    with ``earliest``, the earliest occurrence's (the original PLD's, transformers' ``prompt_lookup_num_tokens`` and
    vLLM 0.32's ``ngram`` rule, ``_find_longest_matched_ngram_and_propose_tokens``).

    An occurrence must end before the last token (so that at least one token follows it). Example: context
    [1, 2, 3, 1, 2], n=2 -> [1, 2] occurs at position 0, followed by [3, 1, 2] -> with num_draft_tokens 2: [3, 1].
    Runs on the host (numpy): the context is host data, and a device lookup would cost a round trip per step.
    """
    return lookup_match(context, max_ngram, min_ngram, num_draft_tokens, earliest)[1]


def lookup_match(context: list[int], max_ngram: int, min_ngram: int, num_draft_tokens: int,
                 earliest: bool = False) -> tuple[int, list[int]]:
    """:func:`lookup_draft` with the length n of the n-gram that matched: (n, draft); (0, []) without a match.
    Example: context [1, 2, 3, 1, 2], max 3, min 1 -> (2, [3, 1, 2]) with num_draft_tokens 3; context
    [1, 2, 3, 4, 9, 2, 3, 5, 2, 3], max 3, min 1, 3 tokens -> (2, [5, 2, 3]), with ``earliest`` (2, [4, 9, 2])."""
    seq = np.asarray(context, dtype=np.int64)  # [L]
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq, n)[: length - n]  # [L-n, n]: n-grams with a successor
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[0] if earliest else hits[-1]) + n
            return n, context[start: start + num_draft_tokens]
    return 0, []
