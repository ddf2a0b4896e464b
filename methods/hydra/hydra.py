"""The method ``hydra``: Hydra heads fill Medusa's static tree level by level, each node's children drafted by the
next head on that node's own path (arXiv:2402.05109 Sec. 3), verified losslessly by the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from harness.engine.checkpoints import check_head_option, resolve_head_folder
from harness.engine.draftvocab import check_draft_vocab, draft_lm_head
from harness.engine.method import OptionsError, build_options, seeded
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, depths
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.hydra.checkpoint import load_hydra_heads
from methods.hydra.head import HydraHeads, check_head_arch, prefix_config
from methods.medusa.medusa import head_tree, medusa_tree


@dataclass
class HydraOptions:
    """``head``: a checkpoint folder (default: the head shipped for the target). ``tree``: a name in
    ``harness.engine.tree.STATIC_TREES`` or explicit rank paths (Medusa's trees); its depth must not exceed the
    number of heads; unset, Medusa's default tree cut to the checkpoint's heads
    (:func:`methods.medusa.medusa.head_tree`). ``draft_vocab``: 0 = heads score the full vocabulary; N > 0 = only
    the N most frequent tokens of the training data (:mod:`harness.engine.draftvocab`; heads that share the
    target's lm_head only)."""

    head: str | None = None
    tree: str | list | None = None
    draft_vocab: int = 0

    def __post_init__(self):
        check_draft_vocab(self.draft_vocab)
        check_head_option(self.head)
        medusa_tree(self.tree, "tree")


def level_layout(parents: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
    """Per tree level (1, 2, ...): ``(start, end, rows)``: its nodes are ``start..end-1`` (nodes sorted by depth, as
    :func:`harness.engine.tree.tree_from_choices` makes them) and ``rows [end-start]`` is each node's parent's index
    within the level above (0 for the root's children: the root is the one row of level 0).

    Example: parents [-1, -1, 0, 1, 1] -> [(0, 2, [0, 0]), (2, 5, [0, 1, 1])].
    """
    d = depths(parents)
    out, start = [], 0
    for level in range(1, int(d.max()) + 1):
        end = start + int((d == level).sum())
        if not bool((d[start:end] == level).all()):
            raise ValueError("tree nodes must be sorted by depth")
        prev_start = out[-1][0] if out else 0
        rows = parents[start:end] - prev_start if level > 1 else torch.zeros(end - start, dtype=torch.long)
        out.append((start, end, rows))
        start = end
    return out


def fill_hydra_tree(run_head: Callable[[int, torch.Tensor], torch.Tensor],
                    embed: Callable[[torch.Tensor], torch.Tensor], root_input: torch.Tensor, ranks: torch.Tensor,
                    layout: list[tuple[int, int, torch.Tensor]],
                    widths: list[int]) -> torch.Tensor:
    """Node tokens ``[N]`` of a static tree filled by sequentially dependent heads.

    root_input [2H] = [h, E(root)]. Level L's nodes take rank ``ranks[node]`` of head L-1's top-``widths[L-1]`` list
    computed on their parent's path input ``[h, E(root), E(path tokens)]``; each node's own input (for its children)
    is its parent's input followed by its token's embedding. ``run_head(i, x [n, (i+2)H]) -> logits [n, V]``,
    ``embed(tokens [n]) -> [n, H]``.

    Example (a chain of two): head 0 picks 7 after [h, E(root)], head 1 picks 9 after [h, E(root), E(7)] -> [7, 9].
    """
    tokens = torch.empty(ranks.shape[0], dtype=torch.long, device=ranks.device)
    x = root_input[None]  # [1, 2H]: the inputs of level 0's only row
    for i, ((start, end, rows), width) in enumerate(zip(layout, widths, strict=True)):
        top = torch.topk(run_head(i, x), width, dim=-1).indices  # [rows above, width]
        level_tokens = top[rows, ranks[start:end]]                # [n_L]
        tokens[start:end] = level_tokens
        if i + 1 < len(layout):
            x = torch.cat([x[rows], embed(level_tokens).to(x.dtype)], dim=-1)  # [n_L, (i+3)H]
    return tokens


@register_method("hydra")
class Hydra(SpeculativeMethod):
    """Hydra (arXiv:2402.05109): sequentially dependent heads fill a static tree, each node's children from its path.

    Head i drafts tree level i+1 from the target's feature at the last committed position and the embeddings of the
    tokens on the node's own candidate path (root included), so siblings' children differ, unlike Medusa's Cartesian
    product. One head call per tree level, counted as one draft forward each.

    Hydra++ heads (``hydra_head_arch: prefix-mlp``, :class:`methods.hydra.head.HydraPrefix`) read the prefix
    layer's output at the last committed position instead of the feature itself. As in the released code (its
    prefix KV is kept at the committed length after each verification), the prefix runs once over the prompt's
    features at ``begin`` and then over each step's committed features at ``accept`` (one draft forward each), so
    its KV (a :class:`harness.engine.draftcache.DraftKV`) only ever holds committed positions: a rejected draft never
    enters it and there is nothing to compact.
    The proposal is deterministic given the context, so the engine's verification keeps the target distribution
    exactly."""

    Options = HydraOptions
    needs_hidden_states = True

    def __init__(self, target: Target, options=None, heads: HydraHeads | None = None):
        super().__init__(target, options)
        folder = None
        if heads is None:
            folder = resolve_head_folder(self.options.head, target, "hydra", SHIPPED_HEADS)
            heads = load_hydra_heads(folder, target)
        self.heads = heads
        tree, parents, ranks = head_tree(self.options.tree, heads.num_heads, "hydra")
        self.options = replace(self.options, tree=tree)
        if self.options.draft_vocab and not heads.share_lm_head:
            raise OptionsError("method 'hydra': option draft_vocab needs heads that share the target's lm_head "
                               "(these have their own lm_heads)")
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), self.options.draft_vocab, folder, "hydra")
        self.embed = target.model.get_input_embeddings()
        device = self.feature_device
        self.layout = [(s, e, rows.to(device)) for s, e, rows in level_layout(parents)]
        self.widths = [int(ranks[s:e].max()) + 1 for s, e, _ in self.layout]
        self.parents, self.ranks = parents.to(device), ranks.to(device)
        self.feature: torch.Tensor | None = None
        self.prefix_kv = None  # prefix-mlp heads: the prefix layer's KV over the committed positions

    @classmethod
    def example(cls, target: Target, seed: int = 0, head_arch: str = "mlp", **options) -> Hydra:
        """The method on randomly initialised heads (seeded, Hydra's initialisation), one per level of the tree,
        ending in the target's lm_head; no checkpoint is read. ``head_arch`` "prefix-mlp": Hydra++ heads."""
        try:
            check_head_arch(head_arch)
        except ValueError as e:
            raise OptionsError(f"method 'hydra': {e}") from None
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        parents, _ = medusa_tree(opts.tree, "tree")
        vocab, hidden = target.model.get_output_embeddings().weight.shape
        if target.model.get_input_embeddings().weight.shape[1] != hidden:
            raise OptionsError(f"method 'hydra': the target's input embeddings are not {hidden} wide like its lm_head")
        with seeded(seed):
            heads = HydraHeads(hidden, vocab, num_heads=int(depths(parents).max()), share_lm_head=True,
                               prefix=prefix_config(target) if head_arch == "prefix-mlp" else None)
        heads = heads.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)
        return cls(target, opts, heads=heads)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.prefix_kv = None
        self.feature = self._context(hidden)  # [H] at the last prompt token

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.feature = self._context(hidden)  # [H] at the last accepted token

    def _context(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the heads read after the committed positions with features ``hidden [n, H]``: the last feature
        (mlp), or the prefix layer's output there, its KV extended by these n positions (prefix-mlp)."""
        if self.heads.prefix_embeding_layer is None:
            return hidden[-1]
        out, self.prefix_kv = self.heads.context(hidden[None], self.prefix_kv)  # [1, n, H]
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return out[0, -1]

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        device = self.parents.device
        feature = self.feature.to(device, self.target.dtype)
        root_t = torch.full((1,), root, dtype=torch.long, device=self.embed.weight.device)  # a fill, not a copy
        root_embed = self.embed(root_t)[0].to(device, feature.dtype)
        tokens = fill_hydra_tree(lambda i, x: self.heads(i, x, self.lm_head),
                                 lambda t: self.embed(t.to(self.embed.weight.device)).to(device),
                                 torch.cat([feature, root_embed]), self.ranks, self.layout, self.widths)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + len(self.layout)
        return DraftTree(tokens=tokens, parents=self.parents)
