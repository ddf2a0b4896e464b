"""Draft trees: the one data structure every speculative method hands to the engine, and the pure maths on it.

A draft tree hangs below the *root*, the pending token that has been emitted but not yet run through the target.
Nodes are numbered ``0..N-1`` in ``DraftTree.tokens``; the target forward runs over ``N + 1`` *slots*: slot 0 is the
root and slot ``i + 1`` is node ``i``. ``parents[i]`` is the node index of node i's parent, ``-1`` for the root.
Parents come before children (``parents[i] < i``) and siblings are listed in preference order (rank 0 first), which
is the order verification tries them in.

Example (used in the tests)::

    root ── a(0) ── c(2) ── d(3)        tokens  = [a, b, c, d, e]
        │       └── e(4)                parents = [-1, -1, 0, 2, 0]
        └── b(1)                        depths  = [1, 1, 2, 3, 2]

Static trees are written as *choices*, the rank path of every node (Medusa/EAGLE-1 style): ``[0]`` is the best
level-1 candidate, ``[0, 1]`` the second-best child of ``[0]``. :func:`tree_from_choices` turns them into
``parents`` and ``ranks``. EAGLE-2's dynamic trees come from :func:`select_dynamic_tree`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A proposal: ``tokens [N]`` (long) below the root, ``parents [N]`` (long, -1 = root, topological order).

    ``draft_probs [N+1, V]`` is set for proposals drawn at random (``proposal = "sampled"``): row 0 is the
    distribution the root's children were drawn from *without replacement* (in rank order), row ``i + 1`` that of
    node i's children. Deterministic proposals (top-k, lookups, static trees) leave it ``None``. The sampled
    children of a node must be the first draws of that sequence: pruning a middle sibling breaks losslessness.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def chain_tree(tokens: torch.Tensor | list[int], draft_probs: torch.Tensor | None = None) -> DraftTree:
    """A linear draft ``t0 -> t1 -> ...`` below the root: parents ``[-1, 0, 1, ...]``."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    parents = torch.arange(tokens.shape[0], dtype=torch.long, device=tokens.device) - 1  # [N]
    return DraftTree(tokens=tokens, parents=parents, draft_probs=draft_probs)


def check_tree(tree: DraftTree, vocab_size: int | None = None, values: bool = True) -> None:
    """Raise ``ValueError`` naming the field when ``tree`` breaks the :class:`DraftTree` contract.

    ``values=False`` checks only shapes and dtypes (no host read of the tensors: the engine checks parents and
    token ids on the device with :func:`tree_flags`)."""
    tokens, parents = tree.tokens, tree.parents
    if tokens.dim() != 1 or parents.dim() != 1 or tokens.shape != parents.shape:
        raise ValueError(f"DraftTree.tokens and .parents must both be 1-D of the same length, got shapes "
                         f"{tuple(tokens.shape)} and {tuple(parents.shape)}")
    if tokens.dtype != torch.long or parents.dtype != torch.long:
        raise ValueError(f"DraftTree.tokens/.parents must be torch.long, got {tokens.dtype}/{parents.dtype}")
    n = tokens.shape[0]
    if values:
        par = parents.tolist()
        bad = [i for i, p in enumerate(par) if not -1 <= p < i]
        if bad:
            raise ValueError(f"DraftTree.parents must satisfy -1 <= parents[i] < i (topological order); "
                             f"node {bad[0]} has parent {par[bad[0]]}")
        if vocab_size is not None and n and not (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size):
            raise ValueError(f"DraftTree.tokens must be ids in [0, {vocab_size}), got min {int(tokens.min())} "
                             f"max {int(tokens.max())}")
    if tree.draft_probs is not None:
        shape = tuple(tree.draft_probs.shape)
        if len(shape) != 2 or shape[0] != n + 1 or (vocab_size is not None and shape[1] != vocab_size):
            raise ValueError(f"DraftTree.draft_probs must be [N+1, V] = [{n + 1}, {vocab_size or 'V'}], got {shape}")


def children_lists(parents: torch.Tensor | list[int]) -> list[list[int]]:
    """For every slot (0 = root, i + 1 = node i), the node indices of its children in rank order.

    Example: parents [-1, -1, 0, 2, 0] -> [[0, 1], [2, 4], [], [3], [], []].
    """
    par = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    out: list[list[int]] = [[] for _ in range(len(par) + 1)]
    for i, p in enumerate(par):
        out[p + 1].append(i)
    return out


def depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node, ``[N]`` long; the root's children have depth 1.

    Example: parents [-1, -1, 0, 2, 0] -> [1, 1, 2, 3, 2].
    """
    par = parents.tolist()
    d: list[int] = []
    for p in par:
        d.append(1 if p < 0 else d[p] + 1)
    return torch.tensor(d, dtype=torch.long, device=parents.device)


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """``[N+1, N+1]`` bool over slots: ``mask[r, c]`` is True when slot c is slot r itself or one of its ancestors.

    Example: parents [-1, 0] (a chain) -> [[1,0,0],[1,1,0],[1,1,1]]; parents [-1, -1] -> [[1,0,0],[1,1,0],[1,0,1]].
    """
    par = parents.tolist()
    n = len(par)
    mask = torch.eye(n + 1, dtype=torch.bool)  # [N+1, N+1]
    mask[:, 0] = True
    for i, p in enumerate(par):  # parents come first, so the parent's row is complete
        mask[i + 1] |= mask[p + 1]
    return mask.to(parents.device)


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """:func:`tree_attention_mask` computed where ``parents`` lives, without reading a value on the host.

    Pointer jumping: after round k every slot's row holds its ancestors up to distance 2^k - 1 (and the root) and
    ``up`` points 2^k levels up, so ceil(log2(N + 1)) rounds close every path. A parent index outside
    ``[-1, i)`` is clamped (so the kernels stay in range); :func:`tree_flags` reports it.
    Example: parents [-1, 0] -> [[1,0,0],[1,1,0],[1,1,1]].
    """
    n = parents.shape[0]
    device = parents.device
    slots = torch.arange(n + 1, device=device)
    up = torch.cat([slots[:1], (parents + 1).clamp(min=0)])  # [N+1] parent slot; the root points at itself
    up = torch.minimum(up, (slots - 1).clamp(min=0))          # a parent at or after its child is cut to the root side
    mask = torch.eye(n + 1, dtype=torch.bool, device=device)  # [N+1, N+1]
    mask[:, 0] = True
    for _ in range(math.ceil(math.log2(n + 1))):
        mask = mask | mask[up]
        up = up[up]
    return mask


def slot_depths(ancestors: torch.Tensor) -> torch.Tensor:
    """Depth of every slot ``[N+1]`` (root 0) from :func:`ancestor_matrix`: the number of proper ancestors."""
    return ancestors.sum(-1) - 1


def tree_flags(tree: DraftTree, vocab_size: int) -> torch.Tensor:
    """``[2]`` long on the tree's device: (some parent breaks ``-1 <= parents[i] < i``, some token is outside
    ``[0, vocab_size)``), computed without a host read; the engine reads it with the step's one transfer and then
    lets :func:`check_tree` name the field."""
    n = tree.parents.shape[0]
    order = torch.arange(n, device=tree.parents.device)
    bad_parent = ((tree.parents < -1) | (tree.parents >= order)).any()
    bad_token = ((tree.tokens < 0) | (tree.tokens >= vocab_size)).any().to(tree.parents.device)
    return torch.stack([bad_parent, bad_token]).long()


def windowed_tree_mask(ancestors: torch.Tensor, depth: torch.Tensor, committed: int, kept: int,
                       window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[1, 1, N+1, kept + N+1]`` of one attention layer type for the verification forward.

    Columns: the last ``kept`` committed positions the layer's cache holds (positions ``committed - kept ..
    committed - 1``), then the ``N + 1`` tree slots. Slot r sits at position ``committed + depth[r]``. Without a
    window (``None``) it sees every cached position and its ancestors-or-self; with a sliding window W it sees a
    key at position q only when ``q > position - W`` (transformers' ``sliding_window_overlay``), for committed
    keys and in-tree ancestors alike. Built on the device of ``ancestors``; 0 = attend, dtype min = blocked.

    Example: committed 3, kept 3, window 2, parents [-1] (root + one child, depths [0, 1]) ->
    root row sees positions 2 (committed) and 3 (itself); the child (position 4) sees only itself and the root.
    """
    device = ancestors.device
    slots = ancestors.shape[0]
    blocked = torch.finfo(dtype).min
    if window is None:
        prefix = torch.ones(slots, kept, dtype=torch.bool, device=device)  # [N+1, kept]
        inside = ancestors
    else:
        key_pos = torch.arange(committed - kept, committed, device=device)      # [kept]
        query_pos = depth + committed                                           # [N+1]
        prefix = key_pos[None, :] > (query_pos[:, None] - window)              # [N+1, kept]
        inside = ancestors & ((depth[:, None] - depth[None, :]) < window)       # [N+1, N+1]
    allowed = torch.cat([prefix, inside], dim=1)  # [N+1, kept + N+1]
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.full((), blocked, dtype=dtype, device=device))[None, None]


def tree_from_choices(choices: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Static tree from rank paths: ``(parents [N], ranks [N])`` with nodes sorted by ``(len(path), path)``.

    The sort is the one Medusa and EAGLE-1 use, so node i here is their tree slot i + 1, and siblings come out in
    rank order. Every proper prefix of a path must itself be a path.

    Example: [[1], [0], [0, 0]] -> sorted [[0], [1], [0, 0]] -> parents [-1, -1, 0], ranks [0, 1, 0].
    """
    paths = [tuple(int(r) for r in c) for c in choices]
    if any(len(p) == 0 or min(p) < 0 for p in paths):
        raise ValueError("tree choices must be non-empty lists of non-negative ranks")
    if len(set(paths)) != len(paths):
        raise ValueError("tree choices contain a duplicate path")
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    parents, ranks = [], []
    for p in ordered:
        if len(p) > 1 and p[:-1] not in index:
            raise ValueError(f"tree choice {list(p)} has no parent {list(p[:-1])} in the choices")
        parents.append(index[p[:-1]] if len(p) > 1 else -1)
        ranks.append(p[-1])
    return torch.tensor(parents, dtype=torch.long), torch.tensor(ranks, dtype=torch.long)


def rank_candidates(cand_scores: torch.Tensor, cand_parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's ranking of candidates: ``(order [M], effective [M])``, ``order`` best first by effective score.

    ``cand_scores [M]`` (cumulative log-probs), ``cand_parents [M]`` (-1 = root, else an earlier candidate index).
    A candidate's effective score is the minimum score on its path (equal to its own score whenever scores do not
    increase down the tree, as cumulative log-probs never do); ties go to the lower candidate index, so a parent
    always ranks before its children and every prefix of ``order`` is ancestor-closed.

    Example: scores [-1, -2, -1, -0.5], parents [-1, -1, 0, 1] -> effective [-1, -2, -1, -2], order [0, 2, 1, 3].
    """
    m = cand_scores.shape[0]
    if cand_parents.shape != (m,):
        raise ValueError(f"cand_scores and cand_parents must both be [M]; got {tuple(cand_scores.shape)}, "
                         f"{tuple(cand_parents.shape)}")
    # effective score = min over the path, by pointer jumping: after j rounds `anc` is the 2^j-th ancestor
    eff = cand_scores.float().clone()  # [M]
    anc = cand_parents.clone()  # [M]
    for _ in range(max(1, math.ceil(math.log2(m + 1)))):
        has = anc >= 0
        safe = anc.clamp(min=0)
        eff = torch.where(has, torch.minimum(eff, eff[safe]), eff)
        anc = torch.where(has, anc[safe], anc)
    order = torch.sort(-eff, stable=True).indices  # best first, ties by candidate index
    return order, eff


def select_dynamic_tree(cand_tokens: torch.Tensor, cand_scores: torch.Tensor, cand_parents: torch.Tensor,
                        total_tokens: int, order: torch.Tensor | None = None) -> DraftTree:
    """EAGLE-2's re-ranking: keep the ``total_tokens`` best candidates (:func:`rank_candidates`), in candidate order.

    ``cand_tokens [M]``, ``cand_scores [M]`` (cumulative log-probs), ``cand_parents [M]`` (-1 = root, else an
    earlier candidate index); ``order``: the ranking when the caller has it already. The result is always
    ancestor-closed.

    Example: tokens [7, 8, 9, 5], scores [-1, -2, -1, -0.5], parents [-1, -1, 0, 1], total 3: effective scores
    [-1, -2, -1, -2] -> keep candidates {0, 2, 1} -> tokens [7, 8, 9], parents [-1, -1, 0] (candidate 3, whose
    own score is the best, is dropped because its parent ranks last).
    """
    m = cand_tokens.shape[0]
    if not (cand_scores.shape == cand_parents.shape == (m,)):
        raise ValueError(f"cand_tokens, cand_scores and cand_parents must all be [M]; got {tuple(cand_tokens.shape)}, "
                         f"{tuple(cand_scores.shape)}, {tuple(cand_parents.shape)}")
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")
    k = min(total_tokens, m)
    device = cand_tokens.device
    if order is None:
        order, _ = rank_candidates(cand_scores, cand_parents)
    keep = torch.sort(order[:k]).values  # [k] back into candidate order
    new_index = torch.full((m,), -1, dtype=torch.long, device=device)
    new_index[keep] = torch.arange(k, device=device)
    par = cand_parents[keep]
    parents = torch.where(par >= 0, new_index[par.clamp(min=0)], par)  # [k]
    return DraftTree(tokens=cand_tokens[keep], parents=parents)


def _child(tokens: list[int], parents: list[int], node: int, token: int) -> int | None:
    """The index of ``node``'s child (-1 = the root) that carries ``token``, or None."""
    return next((j for j, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == token), None)


def graft_chain(tokens: list[int], parents: list[int], chain: list[int]) -> tuple[list[int], list[int]]:
    """The tree (host lists ``tokens [N]``, ``parents [N]``, -1 = root) with the path ``chain`` from the root added:
    the chain follows the existing nodes that already spell its prefix, and its remaining tokens are appended as new
    nodes (topological order kept, existing nodes unchanged). Deterministic trees only: a sampled proposal's
    children must be its first draws (:class:`DraftTree`).

    Example: tokens [7, 8, 9], parents [-1, -1, 0] (root -> 7 -> 9, root -> 8), chain [7, 5, 6] -> 7 is node 0,
    5 is not among its children -> tokens [7, 8, 9, 5, 6], parents [-1, -1, 0, 0, 3]. Returns (tokens, parents) of
    N + (appended) nodes.
    """
    tokens, parents = list(tokens), list(parents)
    node = -1
    for i, token in enumerate(chain):
        child = _child(tokens, parents, node, token)
        if child is None:
            for token in chain[i:]:
                tokens.append(token)
                parents.append(node)
                node = len(tokens) - 1
            break
        node = child
    return tokens, parents


def join_side(tree: DraftTree, side: DraftTree) -> DraftTree:
    """The tree one verification forward runs on: ``tree``'s N nodes, then ``side``'s M nodes (a second tree below
    the same root, :meth:`harness.engine.speculative.SpeculativeMethod.side_branch`) with their parents shifted past
    the draft: ``tokens [N+M]``, ``parents [N+M]``. No draft node is an ancestor of a side node or the reverse, so
    the ancestor matrix of the first N+1 slots is ``tree``'s own.

    Example: tree tokens [7, 8], parents [-1, 0]; side tokens [5, 6], parents [-1, 0] -> tokens [7, 8, 5, 6],
    parents [-1, 0, -1, 2].
    """
    n = tree.parents.shape[0]
    side_parents = side.parents.to(tree.parents.device)
    shifted = torch.where(side_parents >= 0, side_parents + n, side_parents)  # [M]
    return DraftTree(tokens=torch.cat([tree.tokens, side.tokens.to(tree.tokens.device)]),
                     parents=torch.cat([tree.parents, shifted]))


def path_length(tokens: list[int], parents: list[int], path: list[int]) -> int:
    """How many leading tokens of ``path`` spell a path from the root in the tree (host lists ``tokens [N]``,
    ``parents [N]``, -1 = root): the drafts of an accepted sequence that this tree proposed.

    Example: tokens [7, 8, 9], parents [-1, -1, 0]; path [7, 9, 4] -> 2; path [8, 9] -> 1; path [5] -> 0.
    """
    node, count = -1, 0
    for token in path:
        node = _child(tokens, parents, node, token)
        if node is None:
            break
        count += 1
    return count


# ---- published static trees -------------------------------------------------------------------------------------
# EAGLE-1 `eagle/model/choices.py` (SafeAILab/EAGLE, branch v1): 25 nodes, levels [4, 8, 8, 3, 2].
EAGLE_MC_SIM_7B_63 = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]

# Medusa `medusa/model/medusa_choices.py` (FasterDecoding/Medusa): 63 nodes, levels [10, 28, 23, 2].
MEDUSA_MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1],
    [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0],
    [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6],
    [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
    [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
    [1, 6], [0, 7, 0],
]

# Medusa `medusa_choices.py` `vicuna_7b_stage2` (same list in xformers' tree-attention tests and lmdeploy's Medusa):
# 63 nodes, levels [10, 23, 23, 7].
MEDUSA_VICUNA_7B_STAGE2 = [
    [0], [0, 0], [1], [0, 1], [0, 0, 0], [1, 0], [2], [0, 2], [0, 0, 1], [0, 3], [3], [0, 1, 0], [2, 0], [4],
    [0, 0, 2], [0, 4], [1, 1], [1, 0, 0], [0, 0, 0, 0], [5], [0, 0, 3], [0, 5], [0, 2, 0], [3, 0], [0, 1, 1],
    [0, 6], [6], [0, 7], [0, 0, 4], [4, 0], [1, 2], [0, 8], [7], [0, 3, 0], [0, 0, 0, 1], [0, 0, 5], [2, 1],
    [0, 0, 6], [1, 0, 1], [0, 0, 1, 0], [2, 0, 0], [5, 0], [0, 9], [0, 1, 2], [8], [0, 4, 0], [0, 2, 1], [1, 3],
    [0, 0, 7], [0, 0, 0, 2], [0, 0, 8], [1, 1, 0], [0, 1, 0, 0], [6, 0], [9], [0, 1, 3], [0, 0, 0, 3], [1, 0, 2],
    [0, 5, 0], [3, 1], [0, 0, 2, 0], [7, 0], [1, 4],
]

# Token Recycling `model/recycling/tree_template_.py` version "2.2.2" (Luowaterbi/TokenRecycling; arXiv:2408.08696
# Sec. 3, top-k 8): 80 nodes, levels [8, 21, 25, 15, 8, 3].
TOKEN_RECYCLING_80 = [
    [0], [1], [2], [3], [4], [5], [6], [7],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0], [2, 1],
    [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0], [0, 1, 1],
    [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0], [1, 0, 0], [1, 0, 1],
    [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0],
    [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
    [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
]

STATIC_TREES: dict[str, list[list[int]]] = {
    "eagle_mc_sim_7b_63": EAGLE_MC_SIM_7B_63,
    "medusa_mc_sim_7b_63": MEDUSA_MC_SIM_7B_63,
    "medusa_vicuna_7b_stage2": MEDUSA_VICUNA_7B_STAGE2,
    "token_recycling_80": TOKEN_RECYCLING_80,
}


# SWIFT's confidence-shaped tree (Xia et al., arXiv:2410.06916, Sec. 4.2 "Confidence-aware inference acceleration";
# hemingkx/SWIFT@88caed7, model/swift/utils.py ``get_choices_list``): the candidates below the chain node of each
# depth, by the chain token's draft probability above 0.95 / 0.8 / 0.5 / otherwise.
CONFIDENCE_BANDS = (0.95, 0.8, 0.5)
CONFIDENCE_WIDTHS = {"greedy": (3, 5, 8, 10), "sampled": (1, 3, 5, 10)}


def confidence_widths(confidences: list[float], widths: tuple[int, int, int, int]) -> list[int]:
    """Per depth, how many ranked candidates hang below the chain node above it: ``widths[j]`` for the first band
    ``CONFIDENCE_BANDS[j]`` the chain token's confidence is above (strictly), else ``widths[3]``.
    Example: ([0.99, 0.9, 0.8, 0.3], (3, 5, 8, 10)) -> [3, 5, 8, 10]."""
    return [next((w for band, w in zip(CONFIDENCE_BANDS, widths) if c > band), widths[-1]) for c in confidences]


def sibling_tree(ranked: list[list[int]], widths: list[int]) -> tuple[list[int], list[int], list[int]]:
    """A chain with ranked siblings: ``ranked[d]`` are the candidates of depth d + 1 best first (``ranked[d][0]``
    the chain's token), ``widths[d]`` of them children of the chain node of depth d. ``(tokens [N], parents [N],
    chain [n])``, the nodes in :func:`tree_from_choices` order (SWIFT's: by depth, then rank) and ``chain`` the
    chain nodes' indices. Example: ([[5, 6], [7, 8]], [2, 1]) -> ([5, 6, 7], [-1, -1, 0], [0, 2])."""
    choices = [[0] * d + [r] for d, w in enumerate(widths) for r in range(w)]
    parents, ranks = tree_from_choices(choices)
    depth, chain, tokens = 0, [], []
    for i, r in enumerate(ranks.tolist()):
        if r == 0:  # the chain node of the next depth (only the chain nodes have children)
            depth += 1
            chain.append(i)
        tokens.append(ranked[depth - 1][r])
    return tokens, parents.tolist(), chain
