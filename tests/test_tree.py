"""Tree maths on literal trees. The running example (see harness/engine/tree.py):

    root -- a(0) -- c(2) -- d(3)        parents = [-1, -1, 0, 2, 0]
        |       `-- e(4)
        `-- b(1)
"""

import pytest
import torch

from harness.engine.tree import (
    EAGLE_MC_SIM_7B_63,
    MEDUSA_MC_SIM_7B_63,
    MEDUSA_VICUNA_7B_STAGE2,
    DraftTree,
    check_tree,
    children_lists,
    confidence_widths,
    depths,
    graft_chain,
    path_length,
    rank_candidates,
    select_dynamic_tree,
    sibling_tree,
    tree_attention_mask,
    tree_from_choices,
)

PARENTS = torch.tensor([-1, -1, 0, 2, 0])


def test_depths_counts_root_children_as_one():
    # a wrong base case (root children at 0) or a parent lookup off by one changes every entry
    assert depths(PARENTS).tolist() == [1, 1, 2, 3, 2]
    assert depths(torch.tensor([], dtype=torch.long)).tolist() == []


def test_children_lists_keep_rank_order():
    # siblings must stay in listing order: verification tries rank 0 first
    assert children_lists(PARENTS) == [[0, 1], [2, 4], [], [3], [], []]


def test_tree_attention_mask_is_ancestor_or_self_with_root():
    # row = query slot; a missing root column, a missing self entry, or a sibling leak (b seeing a) would show here
    expected = [
        [1, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0],  # a
        [1, 0, 1, 0, 0, 0],  # b: not a
        [1, 1, 0, 1, 0, 0],  # c: a
        [1, 1, 0, 1, 1, 0],  # d: a, c (grand-parent inherited)
        [1, 1, 0, 0, 0, 1],  # e: a only, not its sibling c
    ]
    assert tree_attention_mask(PARENTS).int().tolist() == expected


def test_tree_from_choices_sorts_by_length_then_path():
    # [[1], [0], [0, 0]] sorts to [[0], [1], [0, 0]]: node 2 hangs under node 0 with rank 0
    parents, ranks = tree_from_choices([[1], [0], [0, 0]])
    assert parents.tolist() == [-1, -1, 0]
    assert ranks.tolist() == [0, 1, 0]


def test_tree_from_choices_rejects_orphans_and_duplicates():
    # a node whose parent path is absent cannot be placed; a duplicate would create two identical slots
    with pytest.raises(ValueError, match=r"\[0, 1\] has no parent \[0\]"):
        tree_from_choices([[1], [0, 1]])
    with pytest.raises(ValueError, match="duplicate"):
        tree_from_choices([[0], [0]])


@pytest.mark.parametrize("choices, nodes, levels", [
    (EAGLE_MC_SIM_7B_63, 25, [4, 8, 8, 3, 2]),
    (MEDUSA_MC_SIM_7B_63, 63, [10, 28, 23, 2]),
    (MEDUSA_VICUNA_7B_STAGE2, 63, [10, 23, 23, 7]),
])
def test_published_static_trees_have_the_published_shape(choices, nodes, levels):
    # node counts per level from the reference notes; a mistyped path changes a level count or orphans a node
    parents, ranks = tree_from_choices(choices)
    assert len(parents) == nodes
    assert torch.bincount(depths(parents))[1:].tolist() == levels  # nodes at depth 1, 2, ...
    # siblings come out in increasing rank, as verification expects
    kids = children_lists(parents)
    assert all(ranks[k].tolist() == sorted(ranks[k].tolist()) for k in kids)


def test_eagle_tree_first_nodes():
    # EAGLE-1's tree: 4 root children ranked 0..3, then [0,0],[0,1],[0,2] under node 0
    parents, ranks = tree_from_choices(EAGLE_MC_SIM_7B_63)
    assert parents[:7].tolist() == [-1, -1, -1, -1, 0, 0, 0]
    assert ranks[:7].tolist() == [0, 1, 2, 3, 0, 1, 2]


def test_select_dynamic_tree_is_global_top_k_in_candidate_order():
    # candidates: level 1 = 0..2 under the root; level 2 = 3..5 under candidate 0. Top-4 by score is
    # {0 (-0.1), 3 (-0.3), 1 (-0.5), 4 (-0.6)}, returned in candidate order with parents remapped (3 -> node 0)
    tree = select_dynamic_tree(
        cand_tokens=torch.tensor([10, 11, 12, 20, 21, 22]),
        cand_scores=torch.tensor([-0.1, -0.5, -2.0, -0.3, -0.6, -3.0]),
        cand_parents=torch.tensor([-1, -1, -1, 0, 0, 0]),
        total_tokens=4,
    )
    assert tree.tokens.tolist() == [10, 11, 20, 21]
    assert tree.parents.tolist() == [-1, -1, 0, 0]
    assert tree.draft_probs is None


def test_rank_candidates_uses_the_path_minimum():
    """The docstring's example: candidate 3 has the best own score but its parent (1) ranks last, so 3 ranks with
    it; a ranking by own score would put a node before its parent and a prefix would not be a tree."""
    order, eff = rank_candidates(torch.tensor([-1.0, -2.0, -1.0, -0.5]), torch.tensor([-1, -1, 0, 1]))
    assert eff.tolist() == [-1.0, -2.0, -1.0, -2.0]
    assert order.tolist() == [0, 2, 1, 3]


def test_select_dynamic_tree_ties_stay_ancestor_closed():
    # the child (index 2) has exactly its parent's score (log-prob 0 step); with 2 slots, a tie-break that ignored
    # candidate order could keep the child and the other root child but not the parent
    tree = select_dynamic_tree(torch.tensor([7, 8, 9]), torch.tensor([-1.0, -1.0, -1.0]),
                               torch.tensor([-1, -1, 1]), 2)
    assert tree.tokens.tolist() == [7, 8]
    assert tree.parents.tolist() == [-1, -1]


def test_select_dynamic_tree_non_monotone_scores_stay_ancestor_closed():
    # candidate 3's own score is the best but its parent (1) is the worst: it may only come with its parent
    tree = select_dynamic_tree(torch.tensor([7, 8, 9, 5]), torch.tensor([-1.0, -2.0, -1.0, -0.5]),
                               torch.tensor([-1, -1, 0, 1]), 3)
    assert tree.tokens.tolist() == [7, 8, 9]
    assert tree.parents.tolist() == [-1, -1, 0]
    # with room for all, everything is kept and parent 1 of candidate 3 is node 1
    tree = select_dynamic_tree(torch.tensor([7, 8, 9, 5]), torch.tensor([-1.0, -2.0, -1.0, -0.5]),
                               torch.tensor([-1, -1, 0, 1]), 10)
    assert tree.parents.tolist() == [-1, -1, 0, 1]


def test_check_tree_names_the_bad_field():
    # a non-topological parent list would make masks and verification silently wrong
    with pytest.raises(ValueError, match="parents"):
        check_tree(DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1])))
    with pytest.raises(ValueError, match="tokens"):
        check_tree(DraftTree(torch.tensor([1, 99]), torch.tensor([-1, 0])), vocab_size=50)
    with pytest.raises(ValueError, match="draft_probs"):
        check_tree(DraftTree(torch.tensor([1]), torch.tensor([-1]), torch.zeros(1, 50)), vocab_size=50)
    check_tree(DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0]), torch.zeros(3, 50)), vocab_size=50)


def test_graft_chain_docstring_example_follows_the_shared_prefix():
    # root -> 7 -> 9, root -> 8; chain [7, 5, 6]: 7 exists, so 5 hangs under node 0 and 6 under 5. Duplicating the
    # 7 would waste a slot; hanging 5 under the root would verify the wrong continuation
    assert graft_chain([7, 8, 9], [-1, -1, 0], [7, 5, 6]) == ([7, 8, 9, 5, 6], [-1, -1, 0, 0, 3])


def test_graft_chain_adds_nothing_for_a_path_the_tree_has_and_builds_a_chain_on_an_empty_tree():
    assert graft_chain([7, 8, 9], [-1, -1, 0], [7, 9]) == ([7, 8, 9], [-1, -1, 0])
    assert graft_chain([7, 8, 9], [-1, -1, 0], []) == ([7, 8, 9], [-1, -1, 0])
    assert graft_chain([], [], [4, 4, 2]) == ([4, 4, 2], [-1, 0, 1])
    tokens, parents = graft_chain([7, 8, 9], [-1, -1, 0], [8, 9, 9])  # 8 exists (node 1); its child 9 does not
    assert (tokens, parents) == ([7, 8, 9, 9, 9], [-1, -1, 0, 1, 3])
    check_tree(DraftTree(torch.tensor(tokens), torch.tensor(parents)))  # still topological, parents < index


def test_path_length_counts_the_drafts_the_tree_proposed():
    # the adaptive calibration counts only the accepted drafts of the draft's own tree: a path the lookup chain
    # supplied must not count as the draft's success
    assert path_length([7, 8, 9], [-1, -1, 0], [7, 9, 4]) == 2
    assert path_length([7, 8, 9], [-1, -1, 0], [8, 9]) == 1
    assert path_length([7, 8, 9], [-1, -1, 0], [5]) == 0
    assert path_length([7, 8, 9], [-1, -1, 0], []) == 0


def test_swifts_confidence_widths_and_sibling_tree():
    """SWIFT's bands are strict (``> 0.95``, ``> 0.8``, ``> 0.5``; hemingkx/SWIFT@88caed7 get_choices_list): a
    confidence of exactly 0.8 gets the third width. The siblings of depth d hang below the chain node of depth d - 1
    in rank order, the chain node first; a sibling hung below a sibling, or the chain continued from a sibling,
    would verify another tree than SWIFT's"""
    assert confidence_widths([0.99, 0.95, 0.9, 0.8, 0.5, 0.1], (3, 5, 8, 10)) == [3, 5, 5, 8, 10, 10]
    assert confidence_widths([0.96, 0.81], (1, 3, 5, 10)) == [1, 3]
    tokens, parents, chain = sibling_tree([[10, 11, 12], [20, 21], [30, 31, 32]], [3, 1, 2])
    assert tokens == [10, 11, 12, 20, 30, 31]
    assert parents == [-1, -1, -1, 0, 3, 3]
    assert chain == [0, 3, 4]
