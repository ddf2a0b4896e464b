"""Prompt lookup on literal token lists."""

import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from methods.pld.lookup import lookup_draft, lookup_match
from methods.pld.pld import PromptLookup


def test_docstring_example_most_recent_two_gram():
    # [5, 2, 3] has no earlier occurrence; [2, 3] occurs at 1 and 5: the most recent (5) is followed by [5, 2, 3]
    # (the earliest match would give [4, 9, 2])
    assert lookup_draft([1, 2, 3, 4, 9, 2, 3, 5, 2, 3], 3, 1, 3) == [5, 2, 3]


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    # 3-gram [7, 8, 9] matches at 0 (-> 1); the 1-gram [9] also matches later at 5 (-> 4) but n=3 is tried first
    assert lookup_draft([7, 8, 9, 1, 0, 9, 4, 7, 8, 9], 3, 1, 1) == [1]


def test_draft_is_capped_and_may_run_into_the_end():
    # [1, 2] at 0 is followed by [3, 1, 2]; the cap of 2 tokens keeps [3, 1]; a cap of 10 stops at the end
    assert lookup_draft([1, 2, 3, 1, 2], 2, 2, 2) == [3, 1]
    assert lookup_draft([1, 2, 3, 1, 2], 2, 2, 10) == [3, 1, 2]


def test_no_match_and_min_ngram():
    # all tokens distinct: nothing to copy; with min_ngram 2 a lone repeated token is not enough
    assert lookup_draft([1, 2, 3, 4], 3, 1, 5) == []
    assert lookup_draft([6, 1, 2, 6], 3, 2, 5) == []
    assert lookup_draft([6, 1, 2, 6], 3, 1, 5) == [1, 2, 6]
    # a context of one token has no earlier occurrence of anything
    assert lookup_draft([6], 3, 1, 5) == []


def test_the_pattern_itself_is_not_a_match():
    # [4, 4]: the last 1-gram [4] matches at 0 (followed by 4), never at 1 (nothing follows it)
    assert lookup_draft([4, 4], 1, 1, 3) == [4]


def test_propose_tracks_committed_tokens_and_root():
    # the method's context = prompt + accepted tokens + the pending root; the tree is a chain
    m = PromptLookup(None, PromptLookup.Options(max_ngram=2, min_ngram=1, num_draft_tokens=4))  # model-free
    m.begin(torch.tensor([[10, 11, 12, 13]]), None)
    tree = m.propose(10, SamplingParams(), None)  # context [10, 11, 12, 13, 10]: [10] at 0 -> [11, 12, 13, 10]
    assert tree.tokens.tolist() == [11, 12, 13, 10]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    m.accept([10, 11], None, 7)
    assert m.context == [10, 11, 12, 13, 10, 11]
    assert m.propose(7, SamplingParams(), None).tokens.tolist() == []  # 7 is new


def test_bad_options_name_the_field():
    with pytest.raises(OptionsError, match="max_ngram"):
        PromptLookup.create(None, {"max_ngram": 1, "min_ngram": 2})
    with pytest.raises(OptionsError, match="num_draft_tokens"):
        PromptLookup.create(None, {"num_draft_tokens": 0})
    with pytest.raises(OptionsError, match="occurrence must be 'recent' or 'earliest', got 'first'"):
        PromptLookup.create(None, {"occurrence": "first"})


def test_earliest_occurrence_is_vllms_ngram_rule():
    """occurrence=earliest copies after the first occurrence of the longest matching n-gram, as vLLM 0.32's ngram
    proposer does (it keeps the earliest position among the longest matches); without it a vLLM ngram entry and its
    harness twin draft differently wherever an n-gram recurs with another continuation."""
    context = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3]  # [2, 3] at 1 (-> 4, 9, 2) and at 5 (-> 5, 2, 3)
    assert lookup_match(context, 3, 1, 3, earliest=True) == (2, [4, 9, 2])
    assert lookup_match(context, 3, 1, 3) == (2, [5, 2, 3])
    # the longest n still wins first: [7, 8, 9] at 0 only, although [9] recurs at 5
    assert lookup_draft([7, 8, 9, 1, 0, 9, 4, 7, 8, 9], 3, 1, 2, earliest=True) == [1, 0]
    m = PromptLookup(None, PromptLookup.Options(max_ngram=1, min_ngram=1, num_draft_tokens=2, occurrence="earliest"))
    m.begin(torch.tensor([[5, 6, 5, 7]]), None)
    assert m.propose(5, SamplingParams(), None).tokens.tolist() == [6, 5]  # [5] at 0 and 2: the earliest, 0


def test_lookup_match_names_the_matched_ngram_length():
    # the eagle-family option lookup_alone decides on this length: a wrong n would skip the draft on weak matches
    assert lookup_match([1, 2, 3, 1, 2], 3, 1, 3) == (2, [3, 1, 2])
    assert lookup_match([1, 2, 3, 4, 9, 2, 3, 5, 2, 3], 3, 1, 3) == (2, [5, 2, 3])
    assert lookup_match([6, 1, 2, 6], 3, 1, 5) == (1, [1, 2, 6])
    assert lookup_match([1, 2, 3, 4], 3, 1, 5) == (0, [])
