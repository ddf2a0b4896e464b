"""The method ``token_recycling``: Token Recycling (Luo et al., arXiv:2408.08696 Sec. 3), training-free.

An adjacency matrix ``[V, top_k]`` holds every token's top-k successor candidates, recycled from the target's own
verification forwards: after each one, the row of the token at every slot (accepted or not) becomes the top-k of the
target's logits at that slot (the engine hands them over, ``SpeculativeMethod.logit_topk`` / ``observe``). Each step
drafts a static tree (default: the paper's 80-node template, ``harness.engine.tree`` ``token_recycling_80``; option
``tree: token_recycling_23`` keeps 23 of its nodes for small targets on a CPU) by
breadth-first search from the root: node i carries the ``rank``-th candidate of its parent's token
(:mod:`methods.token_recycling.adjacency`; all on the device, no host read). The proposal is a deterministic function
of the matrix, so verification is lossless at every temperature.

Option ``persist`` (default true, as published): the matrix persists across turns and questions, so results depend on
the order of the questions (the manifest records ``state`` beside the options); false starts every turn from an
empty matrix (every row token 0). Rows never written hold token 0.

Against the authors' code (Luowaterbi/TokenRecycling, ``evaluation/inference_recycling.py``; docs/reference.md): the
same tree, fill and update forward for forward; that code roots a turn's first tree at the prompt's last token (its
prefill leaves it out), runs past ``max_new_tokens`` and never recycles a turn's last forward, where this one roots it
at the prefill's token, stops at the budget and recycles every verification forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.engine.hostio import upload
from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import TOKEN_RECYCLING_80, DraftTree, tree_from_choices
from harness.models import Target
from harness.registry import register_method
from methods.eagle.eagle1 import static_tree_choices
from methods.token_recycling.adjacency import recycle_candidates, tree_levels, tree_tokens_from_adjacency

# Not published: the nodes of the paper's tree whose ranks add up to at most 1 (23 nodes, levels [2, 3, 4, 5, 6, 3]),
# for a target whose verification cost grows fast with the tree's size (a small model on a CPU).
SMALL_TREES = {"token_recycling_23": [path for path in TOKEN_RECYCLING_80 if sum(path) <= 1]}


def tree_choices(tree: str | list) -> list[list[int]]:
    """The rank paths of option ``tree``: a name in :data:`SMALL_TREES` or as for EAGLE-1's option ``tree``."""
    return static_tree_choices(SMALL_TREES.get(tree, tree) if isinstance(tree, str) else tree, "tree")


@dataclass
class TokenRecyclingOptions:
    """``tree``: ``token_recycling_23`` (:data:`SMALL_TREES`), a name in ``harness.engine.tree.STATIC_TREES`` or
    explicit rank paths (every rank below ``top_k``); ``top_k``: candidates kept per token (the paper's 8);
    ``persist``: keep the matrix across turns and questions."""

    tree: str | list = "token_recycling_80"
    top_k: int = 8
    persist: bool = True

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not isinstance(self.persist, bool):
            raise ValueError(f"persist must be true or false, got {self.persist!r}")
        rank = max(max(path) for path in tree_choices(self.tree))
        if rank >= self.top_k:
            raise ValueError(f"tree: a node takes candidate rank {rank}, but top_k={self.top_k} keeps ranks "
                             f"0..{self.top_k - 1}")


@register_method("token_recycling")
class TokenRecycling(SpeculativeMethod):
    """Token Recycling: a static tree read by BFS from recycled top-k successors (arXiv:2408.08696 Sec. 3).

    State: ``adjacency [V, top_k]`` on the target's output device (None until the first turn). Counters: none beyond
    the engine's (no draft forwards).
    """

    Options = TokenRecyclingOptions

    def __init__(self, target: Target, options=None):
        super().__init__(target, options)
        o = self.options
        self.vocab = target.model.config.vocab_size
        if o.top_k > self.vocab:
            raise OptionsError(f"method {self.name!r}: option top_k={o.top_k} exceeds the vocabulary ({self.vocab})")
        self.logit_topk = o.top_k
        self.device = target.output_device
        parents, ranks = tree_from_choices(tree_choices(o.tree))
        self.parents, self.ranks = parents.to(self.device), ranks.to(self.device)  # [N], [N]
        self.levels = [torch.tensor(nodes, dtype=torch.long, device=self.device)
                       for nodes in tree_levels(parents.tolist())]  # node indices per depth
        self.adjacency: torch.Tensor | None = None

    def describe(self) -> dict[str, Any]:
        """The manifest entry, with ``state``: whether results depend on the order of turns and questions."""
        state = ("persists across turns and questions: results depend on their order" if self.options.persist
                 else "reset every turn")
        return {**super().describe(), "state": state}

    def forget(self) -> None:
        self.adjacency = None  # the next turn starts from an empty matrix

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        if self.adjacency is None or not self.options.persist:
            self.adjacency = torch.zeros(self.vocab, self.options.top_k, dtype=torch.long, device=self.device)

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        tokens = tree_tokens_from_adjacency(self.adjacency, upload([root], self.device), self.parents, self.ranks,
                                            self.levels)
        return DraftTree(tokens=tokens, parents=self.parents)

    def observe(self, slot_ids: torch.Tensor, top_ids: torch.Tensor) -> None:
        recycle_candidates(self.adjacency, slot_ids.to(self.device), top_ids.to(self.device))
