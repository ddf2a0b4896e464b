"""SuffixDecoding on literal token lists: the bounded suffix tree, the greedy speculation tree, the method's trees."""

import json
from pathlib import Path

import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from methods.suffix.suffix import SuffixDecoding
from methods.suffix.suffixtree import SuffixTree, expand, speculate


def tree_of(*sequences, max_depth=3):
    tree = SuffixTree(max_depth)
    for seq in sequences:
        tree.add(seq)
    return tree


def test_counts_are_occurrences_of_every_substring_up_to_the_depth():
    # [1, 2, 3, 1, 2, 4]: [1, 2] occurs twice, [1, 2, 3] once; [1, 2, 3, 1] is longer than max_depth 3 and absent;
    # the root counts the 6 positions. Wrong counts would give wrong probabilities to every speculation tree.
    tree = tree_of([1, 2, 3, 1, 2, 4])
    assert tree.counts[0] == 6
    assert tree.counts[tree.find([1, 2])] == 2
    assert tree.counts[tree.find([1])] == 2
    assert tree.counts[tree.find([1, 2, 3])] == 1
    assert tree.find([1, 2, 3, 1]) is None
    assert tree.find([4, 1]) is None


def test_sequences_do_not_run_into_each_other_and_extend_continues_one():
    # add() starts a new sequence: [2, 3] must not be counted across the boundary of [1, 2] and [3]; extend()
    # continues the current sequence, so [2] then extend([3]) does make [2, 3]
    tree = tree_of([1, 2], [3])
    assert tree.find([2, 3]) is None
    tree.add([2])
    tree.extend([3])
    assert tree.counts[tree.find([2, 3])] == 1
    assert tree.counts[tree.find([3])] == 2


def test_matches_are_the_suffixes_the_tree_holds_shortest_first():
    # [2] and [1, 2] are held, [7, 1, 2] is not (and ends the list); [9] is not held at all
    tree = tree_of([1, 2, 3, 1, 2, 4])
    assert tree.matches([7, 1, 2]) == [(tree.find([2]), 1), (tree.find([1, 2]), 2)]
    assert tree.matches([9]) == []
    # max_depth 3 caps p at 2 (a full-depth node has no children): [3, 1, 2] would be 3
    assert [p for _, p in tree.matches([3, 1, 2])] == [1, 2]


def test_docstring_example_speculation_tree():
    # both continuations of [1, 2] have D = 1/2; factor 1 * p 2 = 2 tokens, siblings of the matched node
    spec = speculate(tree_of([1, 2, 3, 1, 2, 4]), [7, 1, 2], 1.0, 0.1, 32)
    assert (spec.tokens, spec.parents, spec.probs, spec.match_length) == ([3, 4], [-1, -1], [0.5, 0.5], 2)
    assert spec.score == 1.0


def test_probabilities_multiply_down_the_tree_and_prune():
    # [5, 6, 7] twice, [5, 6, 8] once (max_depth 4): below [5] (count 3): 6 (D 1), then 7 (D 2/3), 8 (D 1/3).
    # min_token_prob 0.5 prunes 8; the budget (factor 3 * p 1 = 3) is not what stops it
    tree = tree_of([5, 6, 7], [5, 6, 7], [5, 6, 8], max_depth=4)
    spec = speculate(tree, [5], 3.0, 0.5, 32)
    assert spec.tokens == [6, 7] and spec.parents == [-1, 0]
    assert spec.probs == pytest.approx([1.0, 2 / 3])
    # without pruning the third token is its sibling 8 (parent node 0), after the more probable 7
    spec = speculate(tree, [5], 3.0, 0.0, 32)
    assert spec.tokens == [6, 7, 8] and spec.parents == [-1, 0, 0]


def test_adaptive_length_is_factor_times_match_length_capped():
    # a long repeated run: a match of p tokens drafts floor(factor * p) tokens, at most max_spec_tokens
    tree = tree_of(list(range(10)), max_depth=16)
    assert len(speculate(tree, [2], 1.0, 0.1, 32).tokens) == 1
    assert len(speculate(tree, [0, 1, 2], 1.0, 0.1, 32).tokens) == 3
    assert len(speculate(tree, [0, 1, 2], 2.0, 0.1, 32).tokens) == 6
    assert len(speculate(tree, [0, 1, 2], 2.0, 0.1, 4).tokens) == 4
    assert speculate(tree, [42], 2.0, 0.1, 4).tokens == []  # no match, no draft


def test_a_shorter_match_wins_when_its_tree_scores_higher():
    # the period-2 text [5, 6, 5, 6, 5, 6], context [6, 5, 6, 5], factor 2: the longest match (p 4, at position 1)
    # is followed by one token before the text ends: [6], score 1. [5, 6, 5] (p 3, at 0 and 2) drafts 6 (D 1),
    # 5 (D 1/2), 6 (D 1/2): score 2; [6, 5] (p 2) scores 2 too and [5] (p 1) 5/3. The best score wins, the
    # longer match on a tie; a longest-match-only rule would draft a single token here
    tree = tree_of([5, 6, 5, 6, 5, 6], max_depth=8)
    spec = speculate(tree, [6, 5, 6, 5], 2.0, 0.1, 32)
    assert (spec.tokens, spec.parents, spec.probs) == ([6, 5, 6], [-1, 0, 1], [1.0, 0.5, 0.5])
    assert (spec.match_length, spec.score) == (3, 2.0)


def test_a_chain_takes_the_best_child_at_every_node():
    # the docstring example of expand(): [5, 6, 7] twice, [5, 6, 8] once; below [5] the tree is 6, 7, 8 (8 a sibling
    # of 7), the chain 6, 7 only: a chain that kept 8 would be drafting a tree the engine (vLLM) cannot verify
    tree = tree_of([5, 6, 7], [5, 6, 7], [5, 6, 8], max_depth=4)
    spec = expand(tree, tree.find([5]), 3, 0.0)
    assert (spec.tokens, spec.parents) == ([6, 7, 8], [-1, 0, 0])
    chain = expand(tree, tree.find([5]), 3, 0.0, branch=False)
    assert (chain.tokens, chain.parents, chain.probs) == ([6, 7], [-1, 0], [1.0, 2 / 3])


def test_equal_siblings_come_in_the_order_their_counts_last_changed():
    # [5, 9] then [5, 7]: both follow 5 once; 9 was counted first and comes first (ArcticInference appends a new
    # child behind its siblings), not the smaller token id 7. Then [5, 7] and [5, 9] again: 7 reached 2 first
    tree = tree_of([5, 9], [5, 7])
    assert expand(tree, tree.find([5]), 2, 0.0).tokens == [9, 7]
    tree.add([5, 7])
    tree.add([5, 9])
    assert expand(tree, tree.find([5]), 2, 0.0).tokens == [7, 9]


def test_the_pending_root_is_counted_before_matching():
    # prompt [1, 2, 3, 1], root 2: [1, 2] now occurs twice (at 0 and at the end), followed once by 3, so 3 has
    # D = 1/2 and 1 after it 1/2 (factor 1 * p 2 = 2 tokens); leaving the pending root out of the counts would
    # give D = 1 to both, as the authors' implementation (which adds each sampled token before it speculates)
    # does not
    m = SuffixDecoding(None, SuffixDecoding.Options(tree=False, max_depth=8))
    m.begin(torch.tensor([[1, 2, 3, 1]]), None)
    assert m.propose(2, SamplingParams(), None).tokens.tolist() == [3, 1]
    assert m.request_tree.counts[m.request_tree.find([1, 2])] == 2
    # accept() does not count the root twice: [1, 2] stays at 2, [2, 3] gains the accepted 3
    m.accept([2, 3], None, 9)
    assert m.request_tree.counts[m.request_tree.find([1, 2])] == 2
    assert m.request_tree.counts[m.request_tree.find([2, 3])] == 2


def test_method_drafts_from_the_prompt_then_from_earlier_outputs():
    # turn 1: the prompt [1, 2, 3] with root 1 matches [1] -> [2]; it emits 1, 2, 8, 9. Turn 2 (a new question,
    # persist) has a prompt without the text, but the global tree holds turn 1's output: root 8 -> [9]
    m = SuffixDecoding(None, SuffixDecoding.Options())
    m.begin(torch.tensor([[1, 2, 3]]), None)
    assert m.propose(1, SamplingParams(), None).tokens.tolist() == [2]
    m.accept([1, 2], None, 8)
    m.propose(8, SamplingParams(), None)
    m.accept([8], None, 9)
    m.propose(9, SamplingParams(), None)
    m.accept([9], None, 4)
    m.begin(torch.tensor([[6]]), None)
    assert m.propose(8, SamplingParams(), None).tokens.tolist() == [9]
    assert m.describe()["order_dependent"] is True


def test_per_question_starts_cold_but_keeps_the_text_of_earlier_turns():
    # per_question: a prompt that continues the last one ([1, 2, 3] -> [1, 2, 3, 8, 9, 4, 7]) is a second turn and
    # keeps the global tree; a prompt that does not is a new question and empties it
    m = SuffixDecoding(None, SuffixDecoding.Options(global_tree="per_question"))
    m.begin(torch.tensor([[1, 2, 3]]), None)
    m.accept([8, 9, 4], None, 5)
    m.begin(torch.tensor([[1, 2, 3, 5, 7]]), None)
    assert m.propose(8, SamplingParams(), None).tokens.tolist() == [9]
    m.begin(torch.tensor([[6]]), None)
    assert m.propose(8, SamplingParams(), None).tokens.tolist() == []
    assert m.describe()["order_dependent"] is False


def test_bad_options_name_the_field():
    for bad, field in [({"global_tree": "forever"}, "global_tree"), ({"max_spec_factor": 0}, "max_spec_factor"),
                       ({"min_token_prob": 1.5}, "min_token_prob"), ({"max_spec_tokens": 500}, "max_spec_tokens"),
                       ({"max_depth": 1}, "max_depth"), ({"tree": "no"}, "tree")]:
        with pytest.raises(OptionsError, match=field):
            SuffixDecoding.create(None, bad)


def test_chain_drafts_equal_the_authors_implementation_as_vllm_drives_it():
    # tests/data/suffix_arcticinference.json: the drafts of ArcticInference 0.3.0's SuffixDecodingCache (the
    # authors' implementation, which vLLM 0.32's `suffix` method calls) at every step of four requests (two MT-bench
    # questions, both turns, SmolLM2 token ids; GPT-4's answers as the generated text, greedy decoding replayed),
    # recorded by the command in docs/reference.md. tree=false drafts the same chain at every step but one (a tie),
    # the global tree carrying the first answers into the later requests; a difference in counting (the pending
    # root), in the match rule or in the pruning would draft other tokens at many steps
    ref = json.loads((Path(__file__).parent / "data" / "suffix_arcticinference.json").read_text())
    m = SuffixDecoding(None, SuffixDecoding.Options(max_depth=ref["max_tree_depth"], tree=False,
                                                    max_spec_tokens=ref["num_speculative_tokens"],
                                                    max_spec_factor=ref["max_spec_factor"],
                                                    min_token_prob=ref["min_token_prob"]))
    drafted, differ = 0, []
    for request in ref["requests"]:
        out = request["output"]
        m.begin(torch.tensor([request["prompt"]]), None)
        n = 1
        for expected in request["drafts"]:
            draft = m.propose(out[n - 1], SamplingParams(), None).tokens.tolist()
            if draft != expected:
                differ.append((ref["requests"].index(request), n, draft, expected))
            acc = 0
            while acc < len(draft) and n + acc < len(out) and draft[acc] == out[n + acc]:
                acc += 1
            m.accept(out[n - 1:n + acc], None, out[n + acc] if n + acc < len(out) else -1)
            n += acc + 1
            drafted += bool(draft)
        assert n >= len(out)
    assert drafted == 73
    # one step of 116: after "the" the continuations " second" and " last" have equal counts (D 1/3 each) and
    # ArcticInference's sibling list, which places a child that reaches a count before or behind the siblings
    # already there depending on where it stood, lists the other first (the harness's order approximates it: the
    # child whose count changed earliest first)
    assert differ == [(1, 35, [1796], [1596])]
