"""The method ``eagle1``: EAGLE-1's static tree (arXiv:2401.15077 Sec. 3.3) on an
:class:`methods.eagle.head.EagleHead` (:class:`methods.eagle.draft.EagleMethodBase`).

The tree is ``harness.engine.tree`` ``eagle_mc_sim_7b_63`` by default; T=0 top-k children, T>0 children sampled
without replacement with ``draft_probs`` (``proposal`` is then "sampled").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from harness.engine.checkpoints import check_head_option
from harness.engine.draftcache import DraftKV, check_draft_window
from harness.engine.draftvocab import check_draft_vocab
from harness.engine.hostio import upload
from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.tree import STATIC_TREES, DraftTree, children_lists, depths, tree_from_choices
from harness.models import Target
from harness.registry import register_method
from methods.eagle.draft import EagleMethodBase
from methods.eagle.head import EagleHead


@dataclass
class Eagle1Options:
    """``tree``: a name in ``harness.engine.tree.STATIC_TREES`` or explicit rank paths (``[[0], [1], [0, 0], ...]``);
    every node's children must have ranks 0..c-1 (sampled children are the first c draws). ``head``: checkpoint folder
    (default: the head shipped for the target). ``draft_vocab``: 0 = the draft scores the full vocabulary (as
    published); N > 0 = only the N most frequent tokens of the head's training data
    (:mod:`harness.engine.draftvocab`). ``draft_window``: 0 = the draft attends to the whole context (as published);
    W > 0 = the last W positions (:class:`harness.engine.draftcache.DraftCache`); not published."""

    head: str | None = None
    tree: str | list = "eagle_mc_sim_7b_63"
    draft_vocab: int = 0
    draft_window: int = 0

    def __post_init__(self):
        check_head_option(self.head)
        static_tree_choices(self.tree, "tree")
        check_draft_vocab(self.draft_vocab)
        check_draft_window(self.draft_window)


def static_tree_choices(tree: str | list, field: str) -> list[list[int]]:
    """The rank paths of option ``tree`` (a ``STATIC_TREES`` name or explicit paths), validated: children of every
    node have ranks 0..c-1. Example: [[0], [1], [0, 0]] is fine; [[0], [2]] is not (rank 1 is missing)."""
    if isinstance(tree, str):
        if tree not in STATIC_TREES:
            raise ValueError(f"{field}: unknown tree {tree!r}; known: {', '.join(sorted(STATIC_TREES))}")
        tree = STATIC_TREES[tree]
    if not isinstance(tree, list) or not tree or not all(isinstance(c, list) for c in tree):
        raise ValueError(f"{field}: expected a tree name or a non-empty list of rank paths, got {tree!r}")
    parents, ranks = tree_from_choices(tree)
    for slot, kids in enumerate(children_lists(parents)):
        got = sorted(ranks[kids].tolist())
        if got != list(range(len(kids))):
            raise ValueError(f"{field}: the children of {'the root' if slot == 0 else f'node {slot - 1}'} have ranks "
                             f"{got}; they must be 0..{len(kids) - 1}")
    return tree



@dataclass
class _Level:
    """One draft forward of :meth:`Eagle1.propose_greedy`: the nodes run (``batch [b]``), their mask over the
    temporary KV (``cols [b, columns]``), the row of each one's parent in the previous level's output
    (``parent_rows [b]``), and where their top-k go (``children``, ``child_rows``, ``child_ranks``, ``width``)."""

    batch: torch.Tensor
    cols: torch.Tensor
    parent_rows: torch.Tensor
    children: torch.Tensor
    child_rows: torch.Tensor
    child_ranks: torch.Tensor
    width: int


@dataclass
class GreedyPlan:
    """The root's children (as in :class:`_Level`), then one :class:`_Level` per draft forward, and the parents."""

    children: torch.Tensor
    child_rows: torch.Tensor
    child_ranks: torch.Tensor
    width: int
    levels: list[_Level]
    parents: torch.Tensor


@register_method("eagle1")
class Eagle1(EagleMethodBase):
    """EAGLE-1: a static tree (default ``mc_sim_7b_63``, 25 nodes, depth 5) filled level by level.

    At T=0 node c-th child = the c-th of the draft's top-k; at T>0 the children are drawn WITHOUT replacement from
    the draft distribution (``logits_to_probs`` of the draft logits with the run's sampling params), and the tree
    carries ``draft_probs`` so that verification can use the q-corrected rule (lossless). ``proposal`` is
    therefore "sampled" exactly when the last proposal was made at T>0. One draft forward runs per level that has
    non-leaf nodes (plus the stable-KV update): 5 per cycle for the default tree. A node whose draft distribution
    has fewer non-zero tokens than it has children (top-p / top-k sampling) loses its trailing children.
    """

    Options = Eagle1Options

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options, head, folder)
        self.parents, self.ranks = tree_from_choices(static_tree_choices(self.options.tree, "tree"))
        self.parent_list: list[int] = self.parents.tolist()  # host copies for the host-side loops
        self.children = children_lists(self.parent_list)
        self.node_depths = depths(self.parents).tolist()
        self._plans: dict[torch.device, GreedyPlan] = {}
        widest = max(len(kids) for kids in self.children)
        vocab = self.lm_head.size
        if widest > vocab:
            raise OptionsError(f"method {self.name!r}: option tree has a node with {widest} children, more than the "
                               f"draft vocabulary ({vocab})")
        self._proposal = "deterministic"

    @property
    def proposal(self) -> str:  # type: ignore[override]
        return self._proposal

    def pick_children(self, logits: torch.Tensor, count: int, sampling: SamplingParams,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``count`` child tokens from draft ``logits [V]``: top-k at T=0, else draws without replacement from
        q = logits_to_probs(logits) (fewer when q has fewer non-zero tokens). Returns (tokens [<=count], q or None)."""
        if sampling.greedy:
            return torch.topk(logits, count).indices, None
        q = logits_to_probs(logits, sampling)  # [V]
        count = min(count, int(torch.count_nonzero(q)))
        on = generator.device if generator is not None else q.device  # draw where the generator lives
        drawn = torch.multinomial(q.to(on), count, replacement=False, generator=generator)
        return drawn.to(q.device), q

    def level_batch(self, level: int, alive: list[bool]) -> list[int]:
        """Nodes at ``level`` that were filled and have children: the rows of that level's draft forward."""
        return [i for i, d in enumerate(self.node_depths) if d == level and alive[i] and self.children[i + 1]]

    def level_mask(self, batch: list[int], col_of: dict[int, int], device: torch.device) -> torch.Tensor:
        """Draft-side mask over the temporary KV continuation, bool ``[b, len(col_of) + b]``: row r sees the columns
        of ``batch[r]``'s ancestors (``col_of``: node -> column) and its own new column.

        Example: parents [-1, 0, 0], col_of {0: 0}, batch [1, 2] -> [[T, T, F], [T, F, T]].
        """
        cols = torch.zeros(len(batch), len(col_of) + len(batch), dtype=torch.bool)  # built on the host
        for r, i in enumerate(batch):
            a = self.parent_list[i]
            while a >= 0:
                cols[r, col_of[a]] = True
                a = self.parent_list[a]
            cols[r, len(col_of) + r] = True
        return cols.to(device, non_blocking=True)

    def greedy_plan(self, device: torch.device) -> GreedyPlan:
        """The level-by-level schedule of the full tree (every node filled, as at temperature 0), on ``device``
        once: the forwards then need no host read and no per-node write."""
        if device in self._plans:
            return self._plans[device]
        levels = []
        col_of: dict[int, int] = {}
        previous: list[int] = []
        for level in range(1, max(self.node_depths, default=0)):
            batch = self.level_batch(level, [True] * len(self.node_depths))
            if not batch:
                break
            cols = self.level_mask(batch, col_of, device)
            parent_rows = [previous.index(self.parent_list[i]) if level > 1 else 0 for i in batch]
            for i in batch:
                col_of[i] = len(col_of)
            levels.append(_Level(upload(batch, device), cols, upload(parent_rows, device),
                                 *self._child_slots(batch, device)))
            previous = batch
        plan = GreedyPlan(*self._child_slots([-1], device), levels, self.parents.to(device))
        self._plans[device] = plan
        return plan

    def _child_slots(self, rows: list[int],
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Children of the nodes ``rows`` (-1 = the root): (child node ids, the row of their parent, their rank,
        the widest row), so that ``tokens[children] = topk(logits, width)[parent_row, rank]`` fills them."""
        children, parent_rows, ranks = [], [], []
        for r, node in enumerate(rows):
            for rank, child in enumerate(self.children[node + 1]):
                children.append(child)
                parent_rows.append(r)
                ranks.append(rank)
        width = max((len(self.children[node + 1]) for node in rows), default=0)
        return upload(children, device), upload(parent_rows, device), upload(ranks, device), width

    def propose_greedy(self, root: int) -> DraftTree:
        """Temperature 0: every node is filled with its parent's top-k (the same tree :meth:`propose` builds), one
        batched draft forward and one scatter per level, no host read (:meth:`greedy_root` and
        :meth:`greedy_level` are the head-specific parts)."""
        device = self.target.output_device
        plan = self.greedy_plan(device)
        tokens = torch.zeros(len(self.node_depths), dtype=torch.long, device=device)  # [N]
        out, top = self.greedy_root(root, plan.width)  # [1, H], [1, width]
        stable_len = self.cache.length
        tokens[plan.children] = top[plan.child_rows, plan.child_ranks]
        kv = self.cache.kv
        for level, step in enumerate(plan.levels, start=1):
            feats = out[step.parent_rows]  # [b, H] each node's parent's predicted feature
            pos = torch.full((step.batch.shape[0],), stable_len + level - 1, dtype=torch.long, device=device)
            out, kv, top = self.greedy_level(feats, tokens[step.batch], pos, kv, step.cols, step.width)
            tokens[step.children] = top[step.child_rows, step.child_ranks]
        return DraftTree(tokens=tokens, parents=plan.parents)

    def greedy_root(self, root: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stable-KV update: the root's predicted feature ``[1, H]`` and its ``width`` best tokens
        ``[1, width]``."""
        h0 = self.extend_stable(root)[None]  # [1, H]
        return h0, torch.topk(self.lm_head(h0).float(), width, dim=-1).indices

    def greedy_level(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, kv: DraftKV,
                     cols: torch.Tensor, width: int) -> tuple[torch.Tensor, DraftKV, torch.Tensor]:
        """One level's draft forward: (predicted features [b, H], kv, each row's ``width`` best tokens [b, width])."""
        out, kv = self.tree_forward(feats, toks, pos, kv, cols)
        return out, kv, torch.topk(self.lm_head(out).float(), width, dim=-1).indices

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        if sampling.greedy:
            return self.propose_greedy(root)
        n = len(self.node_depths)
        device = self.target.output_device
        tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        alive = [False] * n
        rows: list[torch.Tensor | None] = [None] * (n + 1)  # q per slot (sampled only)
        h0 = self.extend_stable(root)  # [H]
        stable_len = self.cache.length

        def fill(slot: int, logits: torch.Tensor) -> None:
            kids = self.children[slot]
            if not kids:
                return
            chosen, q = self.pick_children(logits, len(kids), sampling, generator)
            rows[slot] = q
            for rank_pos, node in enumerate(kids):  # kids are in rank order with ranks 0..c-1
                if rank_pos < chosen.shape[0]:
                    tokens[node] = chosen[rank_pos]
                    alive[node] = True

        fill(0, self.lm_head(h0).float())

        def draft_level(feats, toks, pos, kv, cols):
            out, kv = self.tree_forward(feats, toks, pos, kv, cols)
            return out, self.lm_head(out).float(), kv  # [b, H], [b, V]

        self.expand_levels(h0, tokens, alive, fill, stable_len, draft_level)
        return self._compact(tokens, alive, rows)

    def expand_levels(self, root_feature: torch.Tensor, tokens: torch.Tensor, alive: list[bool], fill,
                      stable_len: int, draft_level) -> None:
        """Grow the static tree level by level: one draft forward per level over its filled nodes that have
        children, each fed its parent's predicted feature, on a temporary KV continuation of the stable cache.

        ``draft_level(feats [b, H], tokens [b], positions [b], kv, mask) -> (features [b, H], logits [b, ...], kv)``
        is the head-specific forward; ``fill(slot, logits)`` chooses the children of the node in ``slot``.
        """
        device = tokens.device
        out_of: dict[int, torch.Tensor] = {-1: root_feature}  # node -> its predicted feature (root = -1)
        col_of: dict[int, int] = {}                            # node -> its column in the temporary KV continuation
        kv = self.cache.kv
        for level in range(1, max(self.node_depths, default=0)):
            batch = self.level_batch(level, alive)
            if not batch:
                break
            cols = self.level_mask(batch, col_of, device)
            feats = torch.stack([out_of[self.parent_list[i]] for i in batch])  # [b, H]
            pos = torch.full((len(batch),), stable_len + level - 1, dtype=torch.long, device=device)
            out, logits, kv = draft_level(feats, tokens[batch], pos, kv, cols)
            for r, i in enumerate(batch):
                col_of[i] = len(col_of)
                out_of[i] = out[r]
                fill(i + 1, logits[r])

    def _compact(self, tokens: torch.Tensor, alive: list[bool], rows: list[torch.Tensor | None]) -> DraftTree:
        """The tree restricted to the nodes that got a token, with ``draft_probs`` rows (zero for leaves) if sampled."""
        ordered = [i for i, a in enumerate(alive) if a]  # a dead node is never expanded: its subtree is dead too
        new_index = {old: j for j, old in enumerate(ordered)}
        parents = torch.tensor([new_index.get(self.parent_list[i], -1) for i in ordered], dtype=torch.long)
        tree_tokens = tokens[ordered] if ordered else tokens[:0]
        probs = None
        if self._proposal == "sampled":
            V = self.lm_head.weight.shape[0]
            zero = torch.zeros(V, device=tokens.device)
            probs = torch.stack([rows[0] if rows[0] is not None else zero] +
                                [rows[i + 1] if rows[i + 1] is not None else zero for i in ordered])  # [N'+1, V]
        return DraftTree(tokens=tree_tokens, parents=parents.to(tokens.device), draft_probs=probs)
