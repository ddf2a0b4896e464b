"""Token Recycling on literal inputs: the adjacency matrix's update and BFS fill (methods.token_recycling.adjacency),
the engine's top-k hand-over (harness.engine.speculative.slot_top_ids), the published tree and the method's state; and
the authors' code's recorded forwards replayed (tests/data/recycling_reference.json)."""

import json
from pathlib import Path

import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import slot_top_ids
from harness.engine.tree import STATIC_TREES, DraftTree, tree_from_choices
from harness.engine.verify import verify_greedy
from methods.token_recycling.adjacency import recycle_candidates, tree_levels, tree_tokens_from_adjacency
from methods.token_recycling.token_recycling import TokenRecycling, tree_choices
from tests.support.helpers import GREEDY, tiny_target


def test_recycle_writes_every_slot_and_the_last_slot_of_a_token_wins():
    # rows of the slot tokens take their slot's top-k; token 1 sits on slots 0 and 2: slot 2's candidates must win
    # (an unordered scatter could keep slot 0's), and rows of tokens on no slot stay as they were
    adjacency = torch.zeros(4, 2, dtype=torch.long)
    recycle_candidates(adjacency, torch.tensor([1, 3, 1]), torch.tensor([[2, 0], [1, 2], [3, 2]]))
    assert adjacency.tolist() == [[0, 0], [3, 2], [0, 0], [1, 2]]


def test_recycle_rejects_a_width_other_than_the_matrix():
    with pytest.raises(ValueError, match="top_ids"):
        recycle_candidates(torch.zeros(4, 2, dtype=torch.long), torch.tensor([1]), torch.tensor([[1, 2, 3]]))


def test_bfs_fill_reads_each_node_from_its_parents_row():
    # rows 5 = [7, 8], 7 = [9, 5], 8 = [6, 6]; tree root -> {rank 0, rank 1}, rank-0 child -> rank 0,
    # rank-1 child -> rank 1: level 1 = [7, 8], level 2 = [adj[7, 0], adj[8, 1]] = [9, 6]
    adjacency = torch.zeros(10, 2, dtype=torch.long)
    adjacency[5], adjacency[7], adjacency[8] = torch.tensor([7, 8]), torch.tensor([9, 5]), torch.tensor([6, 6])
    parents, ranks = torch.tensor([-1, -1, 0, 1]), torch.tensor([0, 1, 0, 1])
    levels = [torch.tensor(nodes) for nodes in tree_levels(parents.tolist())]
    assert tree_tokens_from_adjacency(adjacency, torch.tensor([5]), parents, ranks, levels).tolist() == [7, 8, 9, 6]


def test_tree_levels_group_nodes_by_depth():
    assert tree_levels([-1, -1, 0, 2, 0]) == [[0, 1], [2, 4], [3]]
    assert tree_levels([]) == []


def test_slot_top_ids_pairs_each_slot_with_its_best_ids_and_drops_pad_slots():
    # root 3 then node token 1; a third logits row (a compiled forward's pad slot) must not be handed over
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 9.0], [9.0, 9.0, 9.0]])
    ids, top = slot_top_ids(torch.tensor([3]), torch.tensor([1]), logits, 2)
    assert ids.tolist() == [3, 1]
    assert top.tolist() == [[1, 2], [2, 0]]


def test_the_published_tree_has_80_nodes_on_six_levels_of_top_8_ranks():
    # the template "2.2.2" of the paper's code: levels [8, 21, 25, 15, 8, 3], ranks 0..7
    tree = STATIC_TREES["token_recycling_80"]
    parents, ranks = tree_from_choices(tree)
    assert [len(level) for level in tree_levels(parents.tolist())] == [8, 21, 25, 15, 8, 3]
    assert int(ranks.max()) == 7


def test_the_small_tree_keeps_the_paths_of_rank_sum_at_most_one():
    # 23 of the 80 nodes, ancestor-closed (tree_from_choices would raise otherwise), one chain per depth-1 rank
    small = tree_choices("token_recycling_23")
    parents, _ = tree_from_choices(small)
    assert [len(level) for level in tree_levels(parents.tolist())] == [2, 3, 4, 5, 6, 3]
    assert [0, 0, 0, 1, 0, 0] in small and [0, 1, 1] not in small


def test_the_matrix_learns_from_verification_and_persists_across_turns():
    # after one greedy turn the row of the prompt's last token holds the target's own top-k there, so the next turn
    # on the same prompt drafts the target's greedy token at rank 0 and accepts at least one draft per step
    target = tiny_target(eos=False)
    method = TokenRecycling.create(target, {"tree": [[0], [0, 0], [0, 0, 0]], "top_k": 2})
    prompt = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])
    first = method.generate(prompt, 12, GREEDY)
    second = method.generate(prompt, 12, GREEDY)
    assert second.token_ids == first.token_ids
    assert sum(second.accepted_drafts) > sum(first.accepted_drafts)
    assert method.describe()["state"].startswith("persists")


def test_persist_false_starts_every_turn_cold():
    target = tiny_target(eos=False)
    method = TokenRecycling.create(target, {"tree": [[0], [0, 0]], "top_k": 1, "persist": False})
    prompt = torch.tensor([[5, 9, 13]])
    method.generate(prompt, 8, GREEDY)
    method.begin(prompt, None)
    assert int(method.adjacency.abs().sum()) == 0
    assert method.propose(5, SamplingParams(), None).tokens.tolist() == [0, 0]
    assert method.describe()["state"] == "reset every turn"


def test_bad_options_name_the_field():
    target = tiny_target(eos=False)
    with pytest.raises(OptionsError, match="top_k=4 keeps ranks 0..3"):
        TokenRecycling.create(target, {"tree": "token_recycling_80", "top_k": 4})
    with pytest.raises(OptionsError, match="top_k"):
        TokenRecycling.create(target, {"top_k": 0})
    with pytest.raises(OptionsError, match="exceeds the vocabulary"):
        TokenRecycling.create(target, {"tree": [[0]], "top_k": 200})
    with pytest.raises(OptionsError, match="unknown tree"):
        TokenRecycling.create(target, {"tree": "nope"})
    with pytest.raises(OptionsError, match="persist"):
        TokenRecycling.create(target, {"persist": "sometimes"})


def test_the_authors_forwards_replay_step_by_step():
    # tests/data/recycling_reference.json: the authors' recycling_forward (Luowaterbi/TokenRecycling@1b4c05c,
    # tree "2.2.2", k 8) run on a table instead of a model (the logits at a slot: table[token] + by_depth[depth in
    # the tree]; vocabulary 12), written by tests/support/reference_recycling.py fixture: each tree forward's slots
    # [root, 80 nodes] and the matrix it was drafted from. At every forward the harness must draft the same 80 tokens
    # from that matrix (else its node order or BFS differs from the template's), accept as many (else its greedy walk
    # does), take the reference's next root as its bonus, and leave the matrix the reference drafts the next forward
    # from (else its update differs: a token sits on slots of several depths here, token 0 on most slots of the cold
    # forwards, and the last slot of a token must win, as the reference's CPU index_put leaves it; the first slot
    # winning would differ at some forward). The reference does not recycle its last forward (it stops before the
    # update), the harness does: the one difference.
    ref = json.loads((Path(__file__).parent / "data" / "recycling_reference.json").read_text())
    assert ref["tree"] == STATIC_TREES["token_recycling_80"]
    parents, ranks = tree_from_choices(ref["tree"])
    levels = [torch.tensor(nodes) for nodes in tree_levels(parents.tolist())]
    depth = torch.zeros(len(parents) + 1, dtype=torch.long)  # [81] slot depth, the root 0
    for d, nodes in enumerate(levels, 1):
        depth[nodes + 1] = d
    table, by_depth = torch.tensor(ref["table"]), torch.tensor(ref["by_depth"])  # [12, 12], [7, 12]
    steps = ref["steps"]
    assert ref["accept_lengths"] == [1, 1, 6, 5, 6, 6, 7, 4]
    first_wins_differs = 0
    for s, step in enumerate(steps):
        matrix, slots = torch.tensor(step["matrix"]), torch.tensor(step["slots"])  # [12, 8], [81]
        logits = table[slots] + by_depth[depth]  # [81, 12]
        tokens = tree_tokens_from_adjacency(matrix, slots[:1], parents, ranks, levels)
        assert tokens.tolist() == step["slots"][1:], f"forward {s}: tree"
        path, bonus = verify_greedy(DraftTree(tokens=tokens, parents=parents), logits)
        assert 1 + len(path) == ref["accept_lengths"][s], f"forward {s}: accepted length"
        first_wins = matrix.clone()
        ids, top = slot_top_ids(slots[:1], tokens, logits, 8)
        first_wins[ids.flip(0)] = top.flip(0)
        recycle_candidates(matrix, ids, top)
        first_wins_differs += not torch.equal(first_wins, matrix)
        if s + 1 < len(steps):
            assert bonus == steps[s + 1]["slots"][0], f"forward {s}: next root"
            assert matrix.tolist() == steps[s + 1]["matrix"], f"forward {s}: update"
    assert first_wins_differs > 0
    assert ref["final_matrix"] == steps[-1]["matrix"]
