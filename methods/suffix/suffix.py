"""SuffixDecoding (arXiv:2411.04975 Sec. 4): suffix trees over the prompt and over earlier outputs, frequency trees.

Two :class:`methods.suffix.suffixtree.SuffixTree` s: a per-request tree over the prompt and the tokens generated so
far, and a global tree over the outputs generated (by this method instance) in earlier turns and questions and this
turn's output so far. Every step matches the suffixes of the context (the pending root included) in each tree
and grows the paper's greedy speculation tree from each match (at most ``max_spec_factor`` * match length tokens,
``max_spec_tokens`` at most, nodes of estimated probability below ``min_token_prob`` pruned;
:func:`methods.suffix.suffixtree.speculate`); the tree with the highest score (expected accepted tokens) is proposed.
Training-free and a deterministic function of the text seen, so verification is lossless at every temperature.

``global_tree``: "persist" (default, as published: the global tree grows across turns and questions, so results
depend on the order in which questions run, their warm-up and any question run again; the manifest records
``order_dependent: true``) or "per_question" (cold start: the global tree is emptied when a turn's prompt does not
continue the previous turn's prompt, i.e. at every new question, warm-up included).

The pending root is generated text: it enters both trees (and the context) before the step's match, so the counts
that score the drafts include its occurrence, as in the authors' implementation (ArcticInference, driven by vLLM,
adds every sampled token before it speculates).

Differences from the paper: every match length is tried and the best-scoring tree kept (as the authors'
implementation in ArcticInference does; the paper's text describes the longest match); the global tree holds only
this run's outputs (the paper also seeds it from a log of earlier requests). Against ArcticInference 0.3.0 as vLLM
0.32 drives it (``tree=false``, docs/reference.md): the same drafts but where siblings of equal count are ordered
otherwise, and each answer's last token, which never becomes a root here, is not in the global tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.engine.hostio import fetch, upload
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree
from harness.registry import register_method
from methods.suffix.suffixtree import SuffixTree, speculate

GLOBAL_TREE_MODES = ("persist", "per_question")


@dataclass
class SuffixOptions:
    """``max_depth``: longest suffix the trees hold (64); ``max_spec_factor``: draft at most this many tokens per
    matched token (the paper's alpha, 1.0); ``min_token_prob``: prune nodes whose estimated probability is below
    this (0.1); ``max_spec_tokens``: at most this many draft tokens per step (32); ``global_tree``: persist or
    per_question; ``tree``: draft the paper's speculation tree (true) or its most likely path only (false: what
    ArcticInference drafts by default and vLLM's ``suffix`` method verifies, a chain)."""

    max_depth: int = 64
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    max_spec_tokens: int = 32
    global_tree: str = "persist"
    tree: bool = True

    def __post_init__(self):
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int) or self.max_depth < 2:
            raise ValueError(f"max_depth must be an integer >= 2, got {self.max_depth!r}")
        if not self.max_spec_factor > 0:
            raise ValueError(f"max_spec_factor must be > 0, got {self.max_spec_factor!r}")
        if not 0 <= self.min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob!r}")
        if isinstance(self.max_spec_tokens, bool) or not isinstance(self.max_spec_tokens, int) or not (
                1 <= self.max_spec_tokens <= SpeculativeMethod.max_tree_slots - 1):
            raise ValueError(f"max_spec_tokens must be an integer in 1..{SpeculativeMethod.max_tree_slots - 1}, "
                             f"got {self.max_spec_tokens!r}")
        if self.global_tree not in GLOBAL_TREE_MODES:
            raise ValueError(f"global_tree must be one of {', '.join(GLOBAL_TREE_MODES)}, got {self.global_tree!r}")
        if not isinstance(self.tree, bool):
            raise ValueError(f"tree must be true or false, got {self.tree!r}")


@register_method("suffix")
class SuffixDecoding(SpeculativeMethod):
    """SuffixDecoding (arXiv:2411.04975 Sec. 4): suffix trees of prompt and past outputs draft frequency trees."""

    Options = SuffixOptions

    def __init__(self, target, options=None):
        super().__init__(target, options)
        self.global_tree = SuffixTree(self.options.max_depth)
        self.prompt: list[int] | None = None  # the last turn's prompt (per_question: a new question starts cold)

    def forget(self) -> None:
        self.global_tree = SuffixTree(self.options.max_depth)
        self.prompt = None

    def describe(self) -> dict[str, Any]:
        """The options plus ``order_dependent``: whether the global tree carries text from one question to the next."""
        return {**super().describe(), "order_dependent": self.options.global_tree == "persist"}

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        prompt = fetch(prompt_ids[0])
        o = self.options
        continues = self.prompt is not None and prompt[: len(self.prompt)] == self.prompt
        if o.global_tree == "per_question" and not continues:
            self.global_tree = SuffixTree(o.max_depth)
        self.prompt = prompt
        self.context: list[int] = list(prompt)
        self.request_tree = SuffixTree(o.max_depth)
        self.request_tree.add(prompt)
        self.global_tree.start()  # this turn's output is a new sequence of the global tree
        self.pending = False  # whether the pending root is already in the context and the trees

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        o = self.options
        if not self.pending:  # the root is generated text: counted in both trees before matching (as ArcticInference)
            self.extend([root])
            self.pending = True
        query = self.context[-o.max_depth:]
        best = max((speculate(tree, query, o.max_spec_factor, o.min_token_prob, o.max_spec_tokens, o.tree)
                    for tree in (self.request_tree, self.global_tree)), key=lambda s: s.score)  # ties: the prompt's
        device = self.target.device if self.target is not None else "cpu"  # model-free use (tests)
        return DraftTree(tokens=upload(best.tokens, device), parents=upload(best.parents, device))

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.extend(tokens[1:] if self.pending else tokens)
        self.pending = False

    def extend(self, tokens: list[int]) -> None:
        self.context.extend(tokens)
        self.request_tree.extend(tokens)
        self.global_tree.extend(tokens)
