"""REST on literal token lists: the truncated suffix array, retrieval by the longest suffix, the trie draft, the
datastore on disk with its tokenizer check, and the builder on literal conversations."""

import json

import numpy as np
import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from harness.train.sources import Conversation
from methods.rest.build import build_datastore
from methods.rest.datastore import (
    Datastore,
    concatenate,
    load_datastore,
    retrieve,
    suffix_array,
    tokenizer_identity,
    trie_draft,
)
from methods.rest.rest import Rest
from tests.support.helpers import GREEDY, build_example, char_tokenizer, tiny_target


def test_concatenate_separates_documents():
    assert concatenate([[5, 6], [7]]).tolist() == [5, 6, -1, 7, -1]


def test_suffix_array_sorts_by_the_key_and_keeps_position_order_on_ties():
    # keys (2, 1), (1, 2), (2, 1), (1,): the short suffix (1,) sorts before (1, 2); the two (2, 1) keep 0 before 2
    assert suffix_array(np.array([2, 1, 2, 1]), 2).tolist() == [3, 1, 0, 2]
    # with the full key the two suffixes from 0 and 2 differ ((2, 1, 2, 1) > (2, 1)): 2 comes first
    assert suffix_array(np.array([2, 1, 2, 1]), 4).tolist() == [3, 1, 2, 0]


def test_suffix_array_agrees_with_sorting_the_suffixes():
    # a wrong doubling step would misorder some suffixes, and the binary search would miss occurrences
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, 300)
    expected = sorted(range(300), key=lambda i: (tokens[i: i + 8].tolist(), i))
    assert suffix_array(tokens, 8).tolist() == expected


def test_occurrences_find_every_position_of_a_pattern():
    store = Datastore.build([[5, 6, 5, 7], [5, 6]])
    lo, hi = store.occurrences([5, 6])
    assert sorted(store.suffixes[lo:hi].tolist()) == [0, 5]
    lo, hi = store.occurrences([5])
    assert sorted(store.suffixes[lo:hi].tolist()) == [0, 2, 5]
    lo, hi = store.occurrences([6, 5, 6])  # does not occur: an empty range
    assert lo == hi


def test_docstring_example_retrieve():
    # [9, 1, 2] does not occur, [1, 2] does at 0 and 4: continuations [3, end] and [4, 5] in suffix-array order
    store = Datastore.build([[1, 2, 3], [1, 2, 4, 5]])
    n, conts = retrieve(store, [9, 1, 2], 3, 1, 10, 2)
    assert n == 2 and conts.tolist() == [[3, -1], [4, 5]]
    # max_candidates 1 keeps the first occurrence only; min_match 3 allows no shorter match: nothing
    assert retrieve(store, [9, 1, 2], 3, 1, 1, 2)[1].tolist() == [[3, -1]]
    n, conts = retrieve(store, [9, 1, 2], 3, 3, 10, 2)
    assert n == 0 and conts.shape == (0, 2)


def test_matches_do_not_cross_documents():
    # [2, 7] spans the boundary of [1, 2] and [7, 8]: it must not match, and [2]'s continuation stops at the end
    store = Datastore.build([[1, 2], [7, 8]])
    n, conts = retrieve(store, [2, 7], 2, 1, 10, 2)
    assert n == 1 and conts.tolist() == [[8, -1]]


def test_docstring_example_trie_draft():
    # prefix counts 3: 3, (3, 4): 2, (3, 5): 1, 6: 1 -> the 3 most frequent, depth breaking the tie 6 vs (3, 5)
    rows = np.array([[3, 4], [3, 4], [3, 5], [6, -1]])
    assert trie_draft(rows, 3) == ([3, 6, 4], [-1, -1, 0])
    assert trie_draft(rows, 10) == ([3, 6, 4, 5], [-1, -1, 0, 0])
    assert trie_draft(np.zeros((0, 2), dtype=np.int64), 3) == ([], [])


def saved_store(tmp_path, tokenizer, name="tiny"):
    store = Datastore.build([[1, 2, 3]], tokenizer=tokenizer_identity(tokenizer, name))
    return store.save(tmp_path / "ds")


def test_load_refuses_a_missing_datastore_and_another_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found.*draftbench data datastore"):
        load_datastore(tmp_path / "nothing")
    tok = char_tokenizer()
    folder = saved_store(tmp_path, tok)
    assert load_datastore(folder, tokenizer_identity(tok, "another name")).tokens.tolist() == [1, 2, 3, -1]
    other = dict(tokenizer_identity(tok, "tiny"), vocab_sha256="0" * 64)
    with pytest.raises(ValueError, match="built for tokenizer 'tiny'.*not the target's") as e:
        load_datastore(folder, other)
    assert "\n" not in str(e.value)
    # the command it prints names the run's target, so it can be pasted as it is
    with pytest.raises(FileNotFoundError, match="--source sharegpt --target tiny --out "):
        load_datastore(tmp_path / "nothing", other)


def test_the_method_refuses_a_datastore_of_another_tokenizer(tmp_path):
    target = tiny_target()
    manifest = tmp_path / "ds" / "manifest.json"
    saved_store(tmp_path, target.tokenizer)
    data = json.loads(manifest.read_text())
    data["tokenizer"]["vocab_size"] += 1
    manifest.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="built for tokenizer"):
        Rest.create(target, {"datastore": str(tmp_path / "ds")})


def test_method_proposes_the_trie_of_the_longest_suffix(tmp_path):
    # datastore [[4, 5, 6, 7], [4, 5, 6, 8], [5, 9]]; context [1, 4, 5] (root 5): [4, 5] matches twice -> 6 (2),
    # then 7 and 8 (1 each); the 1-token suffix [5] would also see 9, but the longer match wins
    target = tiny_target()
    store = Datastore.build([[4, 5, 6, 7], [4, 5, 6, 8], [5, 9]], tokenizer=tokenizer_identity(target.tokenizer, "t"))
    store.save(tmp_path / "ds")
    m = Rest.create(target, {"datastore": str(tmp_path / "ds"), "min_match": 1, "depth": 3})
    m.begin(torch.tensor([[1, 4]]), None)
    tree = m.propose(5, SamplingParams(), None)
    assert tree.tokens.tolist() == [6, 7, 8] and tree.parents.tolist() == [-1, 0, 0]
    m.accept([5, 6], None, 9)
    assert m.context == [1, 4, 5, 6]
    assert m.describe()["datastore"]["documents"] == 3


def test_the_test_helper_builds_the_example_datastore_once_per_target():
    # tests/support/helpers.py build_example: REST's example store (~200 forwards of the real model) is shared by the
    # examples of one target and seed, each with its own options; another target's or seed's store would draft from
    # text this target never wrote, a shared method would share its options
    target = tiny_target(eos=False)
    first, second = build_example("rest", target), build_example("rest", target, num_draft=2)
    assert second.store is first.store and (first.options.num_draft, second.options.num_draft) == (64, 2)
    assert build_example("rest", target, seed=1).store is not first.store
    assert build_example("rest", tiny_target(eos=False)).store is not first.store
    own = Rest.example(target, num_draft=2)
    assert own.store.tokens.tolist() == second.store.tokens.tolist()
    prompt = torch.tensor([[5, 9, 13, 20]])
    assert second.generate(prompt, 12, GREEDY).token_ids == own.generate(prompt, 12, GREEDY).token_ids


def test_bad_options_name_the_field():
    target = tiny_target()
    for bad, field in [({"num_draft": 0}, "num_draft"), ({"num_draft": 200}, "num_draft"),
                       ({"max_match": 1, "min_match": 2}, "max_match"), ({"depth": 0}, "depth")]:
        with pytest.raises(OptionsError, match=field):
            Rest.create(target, bad)


def test_builder_tokenizes_assistant_turns_of_literal_conversations(tmp_path, monkeypatch):
    # the builder must keep only assistant turns, in the target's tokenizer, and record the tokenizer's identity
    conversations = [Conversation("a", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]),
                     Conversation("b", [{"role": "user", "content": "yo"}, {"role": "assistant", "content": "ab"}])]
    monkeypatch.setattr("methods.rest.build.load_source", lambda name: conversations)
    tok = char_tokenizer()
    with pytest.warns(UserWarning, match="no contamination check"):  # no evaluation data in tmp_path
        folder, store = build_datastore("sharegpt", tok, "tiny", tmp_path / "ds", data_dir=str(tmp_path))
    ids = tok("abc", add_special_tokens=False)["input_ids"] + [-1] + tok("ab", add_special_tokens=False)["input_ids"]
    assert store.tokens.tolist() == ids + [-1]
    loaded = load_datastore(folder, tokenizer_identity(tok, "tiny"))
    assert loaded.manifest["conversations"] == 2 and loaded.manifest["source"] == "sharegpt"
