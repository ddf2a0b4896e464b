"""Token Recycling's adjacency matrix (Luo et al., arXiv:2408.08696 Sec. 3): every token's top-k successor candidates,
recycled from the target's verification logits, and the static draft tree read from it by breadth-first search.

The matrix ``adjacency [V, k]`` (long) holds, in row x, the k tokens the target ranked highest the last time it ran
on a slot carrying token x (rank 0 first). After a verification forward over slots ``ids [S]`` with logits
``[S, V]``, row ``ids[s]`` becomes the top-k of the logits at slot s, for every slot, accepted or not
(:func:`recycle_candidates`; a token on several slots keeps its last slot's candidates). A static tree, given as
rank paths (``harness.engine.tree.tree_from_choices``: ``parents [N]``, ``ranks [N]``), is filled from the root
level by level: node i carries ``adjacency[token of its parent, ranks[i]]`` (:func:`tree_tokens_from_adjacency`).
Both run where the matrix lives, without a host read.
"""

from __future__ import annotations

import torch


def recycle_candidates(adjacency: torch.Tensor, ids: torch.Tensor, top_ids: torch.Tensor) -> None:
    """Write ``top_ids [S, k]`` (the top-k token ids of the target's logits at each slot, best first) into the rows
    ``ids [S]`` of ``adjacency [V, k]``, in place. Slots are written in order, so the last slot of a repeated token
    wins.

    Example: adjacency zeros [4, 2], ids [1, 3, 1], top_ids [[2, 0], [1, 2], [3, 2]] -> rows 1 = [3, 2] (the second
    slot of token 1 wins), 3 = [1, 2]; rows 0 and 2 unchanged.
    """
    if ids.dim() != 1 or top_ids.dim() != 2 or top_ids.shape != (ids.shape[0], adjacency.shape[1]):
        raise ValueError(f"recycle_candidates: expected ids [S] and top_ids [S, {adjacency.shape[1]}], got "
                         f"{tuple(ids.shape)} and {tuple(top_ids.shape)}")
    # a scatter with duplicate indices is not ordered on every device: every slot of a token writes the candidates
    # of that token's last slot (no value-dependent shapes, so no host read)
    order = torch.arange(ids.shape[0], device=ids.device)  # [S]
    same = ids[None, :] == ids[:, None]                     # [S, S] slot r and slot c carry the same token
    last = torch.where(same, order[None, :], -1).amax(dim=1)  # [S] the last slot of each slot's token
    adjacency[ids] = top_ids[last].to(adjacency.dtype)


def tree_tokens_from_adjacency(adjacency: torch.Tensor, root: torch.Tensor, parents: torch.Tensor,
                               ranks: torch.Tensor, levels: list[torch.Tensor]) -> torch.Tensor:
    """The tokens ``[N]`` of a static tree below ``root`` (``[1]`` long) read from ``adjacency [V, k]``: node i gets
    ``adjacency[token of parents[i] (the root for -1), ranks[i]]``. ``levels``: the node indices of each depth,
    shallowest first (parents of a level are all in earlier levels; :func:`tree_levels`).

    Example: adjacency rows 5 = [7, 8], 7 = [9, 5], 8 = [6, 6]; root 5; parents [-1, -1, 0, 1], ranks [0, 1, 0, 1]
    -> level 1: [7, 8]; level 2: adjacency[7, 0] = 9, adjacency[8, 1] = 6 -> [7, 8, 9, 6].
    """
    n = parents.shape[0]
    slots = torch.cat([root.to(adjacency.device), torch.zeros(n, dtype=torch.long, device=adjacency.device)])  # [N+1]
    for nodes in levels:
        slots[nodes + 1] = adjacency[slots[parents[nodes] + 1], ranks[nodes]]
    return slots[1:]


def tree_levels(parents: list[int]) -> list[list[int]]:
    """Node indices grouped by depth (depth 1 first), for :func:`tree_tokens_from_adjacency`.
    Example: parents [-1, -1, 0, 2, 0] -> [[0, 1], [2, 4], [3]]."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return [[i for i, d in enumerate(depth) if d == level] for level in range(1, max(depth, default=0) + 1)]
