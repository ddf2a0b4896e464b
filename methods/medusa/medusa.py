"""The method ``medusa``: Medusa-1 heads fill a static tree below the pending token (arXiv:2401.10774 Sec. 2.1.2,
tree attention), verified losslessly by the engine or by Medusa's typical acceptance (Sec. 2.3.1, not lossless).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from harness.engine.checkpoints import check_head_option, resolve_head_folder
from harness.engine.draftvocab import check_draft_vocab, draft_lm_head
from harness.engine.method import OptionsError, build_options, seeded
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import STATIC_TREES, DraftTree, depths, tree_from_choices
from harness.engine.verify import verify_typical
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.medusa.checkpoint import load_medusa_heads
from methods.medusa.head import MedusaHeads

ACCEPTANCE_RULES = ("rejection", "typical")
DEFAULT_TREE = "medusa_mc_sim_7b_63"  # the tree option medusa and hydra run when none is given (4 levels: 4 heads)


@dataclass
class MedusaOptions:
    """``tree``: a name in ``harness.engine.tree.STATIC_TREES`` or explicit rank paths; its depth must not exceed the
    number of heads; unset, ``DEFAULT_TREE`` cut to the checkpoint's heads (:func:`head_tree`). ``acceptance``:
    "rejection" = the engine's lossless verification; "typical" = Medusa-1's typical acceptance with
    ``posterior_threshold`` (epsilon) and ``posterior_alpha`` (delta), NOT lossless at T>0.
    ``draft_vocab``: 0 = heads score the full vocabulary; N > 0 = only the N most frequent tokens of the training
    data (:mod:`harness.engine.draftvocab`; heads that share the target's lm_head only)."""

    head: str | None = None
    tree: str | list | None = None
    acceptance: str = "rejection"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    draft_vocab: int = 0

    def __post_init__(self):
        check_draft_vocab(self.draft_vocab)
        check_head_option(self.head)
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {self.acceptance!r}")
        if not 0 < self.posterior_threshold < 1:
            raise ValueError(f"posterior_threshold must be in (0, 1), got {self.posterior_threshold}")
        if not 0 < self.posterior_alpha <= 1:
            raise ValueError(f"posterior_alpha must be in (0, 1], got {self.posterior_alpha}")
        medusa_tree(self.tree, "tree")


def medusa_tree(tree: str | list | None, field: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(parents [N], ranks [N])`` of option ``tree`` (a ``STATIC_TREES`` name or explicit rank paths; None:
    ``DEFAULT_TREE`` whole)."""
    if tree is None:
        tree = DEFAULT_TREE
    if isinstance(tree, str):
        if tree not in STATIC_TREES:
            raise ValueError(f"{field}: unknown tree {tree!r}; known: {', '.join(sorted(STATIC_TREES))}")
        return tree_from_choices(STATIC_TREES[tree])
    if not isinstance(tree, list) or not tree or not all(isinstance(c, list) for c in tree):
        raise ValueError(f"{field}: expected a tree name or a non-empty list of rank paths, got {tree!r}")
    return tree_from_choices(tree)


def head_tree(tree: str | list | None, num_heads: int, method: str) -> tuple[str | list, torch.Tensor, torch.Tensor]:
    """The tree a method with one head per tree level (medusa, hydra) runs on a checkpoint of ``num_heads`` heads:
    ``(tree option, parents [N], ranks [N])``, the option being what its recorded options show and rebuild.

    ``tree`` None (not given): ``DEFAULT_TREE``, or, when the checkpoint has fewer heads than it has levels, its
    paths at most ``num_heads`` long (the option is then that list). A tree that was given and is deeper than
    ``num_heads``: :class:`OptionsError` in one line. Examples: (None, 4) -> "medusa_mc_sim_7b_63" (63 nodes, depth
    4); (None, 3) -> its 61 paths of length <= 3 (the SmolLM2-135M Hydra head has 3 heads); (None, 1) -> [[0], [1],
    ..., [9]]; ("medusa_mc_sim_7b_63", 3) -> OptionsError.
    """
    if tree is None:
        paths = STATIC_TREES[DEFAULT_TREE]
        tree = DEFAULT_TREE if max(map(len, paths)) <= num_heads else [p for p in paths if len(p) <= num_heads]
    parents, ranks = medusa_tree(tree, "tree")
    depth = int(depths(parents).max())
    if depth > num_heads:
        raise OptionsError(f"method {method!r}: option tree has depth {depth} but the checkpoint has only "
                           f"{num_heads} heads (one head per tree level)")
    return tree, parents, ranks


def fill_medusa_tree(head_logits: torch.Tensor, levels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """Node tokens ``[N]``: a node at level L takes rank ``ranks[node]`` of head L-1's top-k list, whoever its
    parent is (Medusa's Cartesian-product tree). head_logits [K, V], levels [N] (1-based), ranks [N].

    Example: head 0 top list [7, 3, ...], head 1 top list [9, 4, ...]; nodes (level, rank) = (1,0), (1,1), (2,1)
    -> tokens [7, 3, 4].
    """
    return fill_from_top(head_logits, levels, ranks, int(ranks.max()) + 1)


def fill_from_top(head_logits: torch.Tensor, levels: torch.Tensor, ranks: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`fill_medusa_tree` with the largest rank + 1 given (no host read of ``ranks``)."""
    top = torch.topk(head_logits, width, dim=-1).indices  # [K, width]
    return top[levels - 1, ranks]


@register_method("medusa")
class Medusa(SpeculativeMethod):
    """Medusa-1: head i's top-k at the last committed position fill level i+1 of a static tree below the root.

    The heads run once per cycle on the feature of the last committed token (the one whose target logits gave the
    root), counted as one draft forward. The proposal is deterministic given the context, so with
    ``acceptance="rejection"`` the engine's verification keeps the target distribution exactly. With
    ``acceptance="typical"`` :meth:`verify` uses :func:`harness.engine.verify.verify_typical` and ``lossless`` is False.
    """

    Options = MedusaOptions
    needs_hidden_states = True

    def __init__(self, target: Target, options=None, heads: MedusaHeads | None = None):
        super().__init__(target, options)
        folder = None
        if heads is None:
            folder = resolve_head_folder(self.options.head, target, "medusa", SHIPPED_HEADS)
            heads = load_medusa_heads(folder, target)
        self.heads = heads
        tree, self.parents, self.ranks = head_tree(self.options.tree, heads.num_heads, "medusa")
        self.options = replace(self.options, tree=tree)
        self.levels = depths(self.parents)  # [N]
        if self.options.draft_vocab and not self.heads.share_lm_head:
            raise OptionsError("method 'medusa': option draft_vocab needs heads that share the target's lm_head "
                               "(these have their own lm_heads)")
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), self.options.draft_vocab, folder, "medusa")
        self.feature: torch.Tensor | None = None
        # the static tree on the heads' device once (not copied every step)
        device = self.feature_device
        self.width = int(self.ranks.max()) + 1
        self._tree = (self.parents.to(device), self.levels.to(device), self.ranks.to(device))

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options) -> Medusa:
        """The method on randomly initialised heads (seeded, Medusa's initialisation: ResBlocks start as the
        identity plus SiLU of a random bias), one per level of the tree, ending in the target's lm_head (own V x H
        lm_heads would outweigh a small target); no checkpoint is read."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        parents, _ = medusa_tree(opts.tree, "tree")
        vocab, hidden = target.model.get_output_embeddings().weight.shape  # the lm_head's input width (OPT: not H)
        with seeded(seed):
            heads = MedusaHeads(hidden, vocab, num_heads=int(depths(parents).max()), share_lm_head=True)
        heads = heads.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)
        return cls(target, opts, heads=heads)

    @classmethod
    def lossless_with(cls, options) -> bool:
        return options.acceptance == "rejection"

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.feature = hidden[-1]  # [H] feature of the last prompt token

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.feature = hidden[-1]  # [H] feature of the last accepted token

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        logits = self.heads(self.feature[None].to(self.target.dtype), self.lm_head)[:, 0]  # [K, V]
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        parents, levels, ranks = self._tree
        return DraftTree(tokens=fill_from_top(logits, levels, ranks, self.width), parents=parents)

    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        if self.options.acceptance == "typical" and not sampling.greedy:  # at T=0 typical acceptance is greedy
            return verify_typical(tree, logits, sampling, self.options.posterior_threshold,
                                  self.options.posterior_alpha, generator)
        return super().verify(tree, logits, sampling, generator)
