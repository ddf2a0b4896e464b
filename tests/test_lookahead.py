"""Lookahead decoding on literal tokens: the window as a side tree, its n-grams, its move to the next Jacobi iterate,
the n-gram pool and its verification trie (methods.lookahead), the engine's join of a draft and a side branch
(harness.engine.tree.join_side), and the options' checks."""

import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.tree import DraftTree, join_side
from methods.lookahead import (
    Lookahead,
    advance_window,
    pool_add,
    pool_trie,
    window_ngrams,
    window_tree,
)
from tests.support.helpers import GREEDY, tiny_target

R, A, B, C, D, E = 100, 1, 2, 3, 4, 5  # R stands for the root (level 0, column 0)


def test_window_tree_chains_level_zero_and_hangs_each_column_below_it():
    # level 0: root -> a -> b; column 0 of level 1 (c) sees only the root, column 1 (d) sees a, column 2 (e) sees
    # a -> b: a wrong parent would let a guess see the wrong positions (the paper's Fig. 2b mask)
    tokens, parents, last = window_tree([[R, A, B], [C, D, E]])
    assert tokens == [A, B, C, D, E]
    assert parents == [-1, 0, -1, 0, 1]
    assert last == [2, 3, 4]


def test_window_tree_of_one_level_reads_the_root_for_column_zero():
    # N = 2 (or the first warm-up step): the last level is level 0, whose column 0 is the root itself (-1)
    tokens, parents, last = window_tree([[R, A]])
    assert (tokens, parents, last) == ([A], [-1], [-1, 0])


def test_window_tree_of_three_levels_stacks_columns():
    # column 1's chain: a (level 0) -> d (level 1) -> 7 (level 2); the root's column: c -> 6
    tokens, parents, last = window_tree([[R, A], [C, D], [6, 7]])
    assert tokens == [A, C, D, 6, 7]
    assert parents == [-1, -1, 0, 1, 2]
    assert last == [3, 4]


def test_window_ngrams_pair_each_column_with_its_new_token():
    # column i's n-gram starts at level 0 (the root for column 0) and ends with the target's token after it
    assert window_ngrams([[R, A, B], [C, D, E]], [7, 8, 9]) == [(R, (C, 7)), (A, (D, 8)), (B, (E, 9))]
    assert window_ngrams([[R, A]], [7, 8]) == [(R, (7,)), (A, (8,))]


def test_a_full_window_moves_up_one_level():
    # level 0 takes level 1 (its column 0 then stands for the next root), the last level takes the outputs
    assert advance_window([[R, A, B], [C, D, E]], [7, 8, 9], 2) == [[C, D, E], [7, 8, 9]]


def test_the_warm_up_grows_one_level_per_step():
    # every level drops column 0 and the outputs from column 1 on become a new level, one column shorter: after
    # N - 2 steps a window of W + N - 2 columns is W columns by N - 1 levels
    levels = [[R, A, B, C, D]]  # W = 3, N = 4: W + N - 2 = 5 columns
    levels = advance_window(levels, [10, 11, 12, 13, 14], 3)
    assert levels == [[A, B, C, D], [11, 12, 13, 14]]
    levels = advance_window(levels, [20, 21, 22, 23], 3)
    assert levels == [[B, C, D], [12, 13, 14], [21, 22, 23]]
    assert advance_window(levels, [30, 31, 32], 3) == [[12, 13, 14], [21, 22, 23], [30, 31, 32]]


def test_the_pool_keeps_the_most_recent_grams_per_key():
    # a gram seen again moves to the end; a full key drops its oldest; other keys are untouched
    pool = {1: [(2,), (3,)], 9: [(9,)]}
    pool_add(pool, 1, (2,), 2)
    assert pool == {1: [(3,), (2,)], 9: [(9,)]}
    pool_add(pool, 1, (4,), 2)
    assert pool[1] == [(2,), (4,)]
    pool_add(pool, 5, (6, 7), 2)
    assert pool[5] == [(6, 7)]


def test_the_verification_trie_merges_shared_prefixes():
    tokens, parents = pool_trie([(5, 6), (5, 7), (8, 6)])
    assert (tokens, parents) == ([5, 6, 7, 8, 6], [-1, 0, 0, -1, 3])
    assert pool_trie([]) == ([], [])


def test_join_side_shifts_the_side_parents_past_the_draft():
    joined = join_side(DraftTree(torch.tensor([7, 8]), torch.tensor([-1, 0])),
                       DraftTree(torch.tensor([5, 6]), torch.tensor([-1, 0])))
    assert joined.tokens.tolist() == [7, 8, 5, 6]
    assert joined.parents.tolist() == [-1, 0, -1, 2]


def test_a_turn_fills_the_pool_from_the_window_and_the_next_turn_starts_afresh():
    # after N - 2 = 1 warm-up step every step adds W n-grams of N - 1 = 2 tail tokens; a new turn empties the pool
    target = tiny_target(eos=False)
    method = Lookahead.create(target, {"window": 4, "ngram": 3, "guess": 2})
    prompt = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])
    gen = method.generate(prompt, 20, GREEDY)
    assert method.pool and all(len(grams) <= 2 and all(len(g) == 2 for g in grams) for grams in method.pool.values())
    assert [len(level) for level in method.levels] == [4, 4]
    # every step ran the window: W + N - 3 = 4 slots at the warm-up step, then (W - 1) + W (N - 2) = 7
    assert gen.counters["window_tokens"] == 4 + 7 * (len(gen.accepted_drafts) - 1)
    method.begin(prompt, None)
    assert method.pool == {} and len(method.levels) == 1
    assert method.describe()["state"] == "n-gram pool and window reset every turn"


@pytest.mark.parametrize("options, message", [
    ({"window": 0}, "window must be an integer >= 1"),
    ({"ngram": 1}, "ngram must be an integer >= 2"),
    ({"guess": 0}, "guess must be an integer >= 1"),
    ({"window": 20, "ngram": 7}, r"need 210 slots per forward .* more than the 128"),
    ({"level": 5}, "level"),
])
def test_bad_options_are_refused_with_the_field(options, message):
    with pytest.raises(OptionsError, match=message):
        Lookahead.create(tiny_target(eos=False), options)


def test_the_defaults_fit_one_forward():
    # W = 15, N = 5, G = 15 (the paper's 7B setting): 1 + 14 + 45 + 60 slots
    assert Lookahead.Options().slots == 120
