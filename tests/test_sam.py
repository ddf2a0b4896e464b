"""SAM-Decoding on literal inputs: the suffix automaton (methods.sam.automaton) against its definition, and the
method's choice between the automaton's chain and its fallback; the static corpus automaton against a brute-force
search, its choice against the dynamic one with len_bias, its files and builder, and its bad inputs."""

import json
from pathlib import Path

import pytest
import torch

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from methods.rest.datastore import SEPARATOR, Datastore, concatenate, tokenizer_identity
from methods.sam.automaton import StaticAutomaton, SuffixAutomaton, choose_automaton, load_static_automaton
from methods.sam.build import build_static_automaton
from methods.sam.sam import SamDecoding
from tests.support.helpers import GREEDY, build_example, char_tokenizer, tiny_target


def naive_match(text: list[int], root: int) -> int:
    """The length of the longest suffix of text + [root] that occurs in text, by brute force."""
    full = text + [root]
    best = 0
    for n in range(1, len(full) + 1):
        suffix = full[-n:]
        if any(text[i: i + n] == suffix for i in range(len(text) - n + 1)):
            best = n
    return best


def test_worked_examples_of_the_module_docstring():
    # [1, 2, 1, 2, 3] + root 1: no [3, 1] occurs, [1] first ends at 0 -> what followed: [2, 1, 2, 3]
    assert SuffixAutomaton([1, 2, 1, 2, 3]).draft(1, 4) == (1, [2, 1, 2, 3])
    # [1, 2, 1] + root 2: [1, 2] first ends at 1 -> [1]
    assert SuffixAutomaton([1, 2, 1]).draft(2, 1) == (2, [1])
    assert SuffixAutomaton([5, 6, 7, 5]).draft(6, 10) == (2, [7, 5])


def test_no_occurrence_and_an_empty_text_give_no_draft():
    assert SuffixAutomaton([1, 2, 3]).draft(9, 5) == (0, [])
    assert SuffixAutomaton().draft(1, 5) == (0, [])


def test_the_states_of_a_small_text():
    # "abb" (a=1, b=2): states {empty}, {a}, {ab}, {b}, {abb, bb}: 5 states; the split of "b" out of "ab" at the
    # second b is a clone that keeps the first occurrence of "b" (position 1)
    sam = SuffixAutomaton([1, 2, 2])
    assert len(sam.length) == 5
    state, length = sam.match(2)  # "abb" + b: "bbb" does not occur, "bb" does, ending first at 2
    assert length == 2 and sam.first_end[state] == 2
    b = sam.next[0][2]
    assert sam.length[b] == 1 and sam.first_end[b] == 1


@pytest.mark.parametrize("text", [
    [1, 2, 1, 2, 3, 1, 2, 1, 2, 1],
    [4, 4, 4, 4, 5, 4, 4],
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3],
])
def test_match_length_equals_the_brute_force_definition_at_every_prefix(text):
    # the online construction (splits, clones, suffix links) must give the longest matching suffix at every length
    # of the text and for every root, which a missing clone redirect or a wrong link would break
    sam = SuffixAutomaton()
    for i, token in enumerate(text):
        for root in set(text):
            state, length = sam.match(root)
            assert length == naive_match(text[:i], root), (text[:i], root)
            if length:  # the first occurrence really ends with the matched string
                end = sam.first_end[state]
                assert text[end - length + 1: end + 1] == (text[:i] + [root])[-length:]
        sam.extend(token)


def test_a_late_first_occurrence_falls_back_to_a_shorter_earlier_suffix():
    # text [7, 1, 2, 9, 1, 2], root 9: [1, 2, 9] first ends at 3, leaving [1, 2] (2 tokens); with 4 wanted, the
    # shorter [2, 9]/[9] share that occurrence, so nothing earlier exists: the draft stays [1, 2] of match length 3
    assert SuffixAutomaton([7, 1, 2, 9, 1, 2]).draft(9, 4) == (3, [1, 2])
    # text [9, 3, 4, 6, 5, 9], root 3: [9, 3] first ends at 1 with 4 tokens after it: no shorter suffix needed
    assert SuffixAutomaton([9, 3, 4, 6, 5, 9]).draft(3, 4) == (2, [4, 6, 5, 9])
    # text [2, 6, 6, 1, 2, 6], root 6: [2, 6, 6] first ends at 2 leaving 3 tokens; the shorter [6, 6] shares it,
    # [6] first ends at 1 leaving 4: with 4 wanted the draft is what followed [6] at 1; the match length stays 3
    assert SuffixAutomaton([2, 6, 6, 1, 2, 6]).draft(6, 4) == (3, [6, 1, 2, 6])


def test_chain_above_threshold_else_fallback_none_gives_an_empty_tree():
    target = tiny_target(eos=False)
    method = SamDecoding.create(target, {"fallback": "none", "threshold": 2, "draft_tokens": 3})
    assert not method.needs_hidden_states
    method.counters = {}
    method.begin(torch.tensor([[10, 11, 12, 13, 10]]), None)
    # root 11 after [.., 10]: [10, 11] matches (length 2) -> what followed: [12, 13, 10]
    assert method.propose(11, SamplingParams(), None).tokens.tolist() == [12, 13, 10]
    # root 12 after committing [11]: [10, 11, 12] matches -> [13, 10, 11]
    method.accept([11], None, 12)
    assert method.propose(12, SamplingParams(), None).tokens.tolist() == [13, 10, 11]
    # root 13 is new after [.., 12, 40]: no match of length 2 -> no draft
    method.accept([12, 40], None, 13)
    assert len(method.propose(13, SamplingParams(), None)) == 0
    assert method.counters == {"sam_steps": 2, "fallback_steps": 1}


def test_the_threshold_holds_the_longest_match_even_when_the_draft_follows_a_shorter_suffix():
    # prompt [2, 6, 6, 1, 2, 6], root 6: the longest match [2, 6, 6] (length 3) first ends at 2, leaving 3 tokens;
    # with 4 wanted the chain follows [6] at 1: [6, 1, 2, 6]. SAM-Decoding's code (hyx1999/SAM-Decoding, samd/
    # draft.py, DraftModel.lookup) holds the lookup's match length (3) against the threshold before gen_draft climbs
    # to the shorter suffix, so threshold 2 verifies that chain; testing the climbed length (1) would fall back
    target = tiny_target(eos=False)
    method = SamDecoding.create(target, {"fallback": "none", "threshold": 2, "draft_tokens": 4})
    method.counters = {}
    method.begin(torch.tensor([[2, 6, 6, 1, 2, 6]]), None)
    assert method.propose(6, SamplingParams(), None).tokens.tolist() == [6, 1, 2, 6]
    assert method.counters == {"sam_steps": 1}


def test_eagle2_fallback_drafts_when_the_match_is_short_and_follows_every_commit():
    # a prompt without repeats: the first steps fall back to EAGLE-2 (a tree of total_tokens - 1 nodes); once the
    # tiny target loops, chains take over; the output is vanilla's either way
    target = tiny_target(eos=False)
    method = build_example("sam", target, total_tokens=6, depth=2, top_k=2)
    assert method.needs_hidden_states
    gen = method.generate(torch.tensor([[5, 9, 13, 20, 31, 7, 44]]), 40, GREEDY)
    vanilla = build_example("vanilla", target).generate(torch.tensor([[5, 9, 13, 20, 31, 7, 44]]), 40, GREEDY)
    assert gen.token_ids == vanilla.token_ids
    assert gen.counters["fallback_steps"] > 0 and gen.counters["draft_forwards"] > 0
    assert gen.counters["fallback_steps"] + gen.counters.get("sam_steps", 0) == gen.steps - 1
    assert method.describe()["fallback"]["method"] == "eagle2"


def test_bad_options_name_the_field():
    target = tiny_target(eos=False)
    with pytest.raises(OptionsError, match="fallback"):
        SamDecoding.create(target, {"fallback": "eagle3"})
    with pytest.raises(OptionsError, match="threshold"):
        SamDecoding.create(target, {"fallback": "none", "threshold": 0})
    with pytest.raises(OptionsError, match="draft_tokens"):
        SamDecoding.create(target, {"fallback": "none", "draft_tokens": 0})
    with pytest.raises(OptionsError, match="depth"):  # the fallback's options are checked at configuration time
        SamDecoding.create(target, {"depth": 0})


def test_the_draft_kv_is_the_fallbacks_or_none():
    """With the EAGLE-2 fallback, sam holds that head's draft KV (one layer, 2 kv heads of width 8, float32 on the
    tiny target: 2 x 1 x 2 x 8 x 4 = 128 bytes per position, over the whole context since it follows every committed
    token); with fallback none it keeps no KV: None, never 0 (a 0 would read as a measured empty cache)."""
    target = tiny_target(vocab=64, tokenizer=False)
    assert build_example("sam", target, total_tokens=8, depth=2, top_k=3).draft_kv_bytes(1000) == 128 * 1000
    assert SamDecoding.create(target, {"fallback": "none"}).draft_kv_bytes(1000) is None


def test_drafts_as_sam_decodings_own_automaton_on_recorded_text():
    # tests/data/sam_reference.json: the match lengths and drafts of SAM-Decoding's dynamic automaton (hyx1999/
    # SAM-Decoding 18c41f0, DynSAM called as its DraftModel.lookup and update call it: n_predicts 40, len_threshold
    # 5, no static automaton) at every step of 12 requests (six MT-bench questions, both turns, SmolLM2 token ids,
    # GPT-4's answers as the generated text, greedy decoding replayed), recorded by tests/support/reference_sam.py
    # fixture. The harness with draft_tokens 39 and threshold 5 matches as long and drafts the same at all 412
    # steps; a wrong construction (clone, link, first occurrence), a threshold held against the shorter suffix the
    # draft climbs to (4 of these steps), or the draft's start would differ
    ref = json.loads((Path(__file__).parent / "data" / "sam_reference.json").read_text())
    method = SamDecoding.create(tiny_target(eos=False), {"fallback": "none", "threshold": ref["len_threshold"],
                                                         "draft_tokens": ref["n_predicts"] - 1})
    steps = 0
    for request in ref["requests"]:
        out = request["output"]
        method.begin(torch.tensor([request["prompt"]]), None)
        n = 1
        for length, expected in zip(request["lengths"], request["drafts"], strict=True):
            assert method.automaton.match(out[n - 1])[1] == length
            draft = method.propose(out[n - 1], SamplingParams(), None).tokens.tolist()
            assert draft == expected, (ref["requests"].index(request), n)
            acc = 0
            while acc < len(draft) and n + acc < len(out) and draft[acc] == out[n + acc]:
                acc += 1
            method.accept(out[n - 1:n + acc], None, out[n + acc] if n + acc < len(out) else -1)
            n += acc + 1
            steps += 1
        assert n >= len(out)
    assert steps == 412


# ------------------------------------------------------------------------------------------------ static automaton

CORPUS = [[1, 2, 1, 2, 3], [2, 3, 4, 2], [4, 4, 1, 2, 5, 6]]  # tokens 1 2 1 2 3 | 2 3 4 2 | 4 4 1 2 5 6 |


def naive_static(corpus: list[list[int]], context: list[int], root: int, max_tokens: int) -> tuple[int, list[int]]:
    """By brute force: the longest suffix of context + [root] inside one document of ``corpus``, and what followed
    its first occurrence (the smallest end position in the documents joined) up to that document's end."""
    full, tokens = context + [root], concatenate(corpus).tolist()
    for n in range(len(full), 0, -1):
        ends = [i + n - 1 for i in range(len(tokens) - n + 1) if tokens[i: i + n] == full[-n:]]
        if ends:
            after = tokens[ends[0] + 1: ends[0] + 1 + max_tokens]
            return n, after[: after.index(SEPARATOR)] if SEPARATOR in after else after
    return 0, []


def test_worked_examples_of_the_static_docstrings():
    a = StaticAutomaton.build([1, 2, 1])  # states {}, {1}, {1 2, 2}, {1 2 1, 2 1}; edges 0-1->1, 0-2->2, 1-2->2, 2-1->3
    assert (a.edge_start.tolist(), a.edge_token.tolist(), a.edge_target.tolist()) == ([0, 2, 3, 4, 4], [1, 2, 2, 1],
                                                                                    [1, 2, 2, 3])
    b = StaticAutomaton.build([1, 2, 3])
    assert [b.follow(0, 0, ctx)[1] for ctx in ([1], [1, 2], [1, 2, 1], [1, 2, 1, 9])] == [1, 2, 1, 0]
    c = StaticAutomaton.build(concatenate([[5, 6, 7, 8], [6, 9]]))
    cursor = c.follow(0, 0, [5])
    assert c.draft(*cursor, 6, 10) == (2, [7, 8]) and c.draft(*cursor, 6, 1) == (2, [7])


@pytest.mark.parametrize("max_tokens", [1, 3, 8])
def test_static_match_and_draft_equal_a_brute_force_search(max_tokens):
    # the cursor carried along the context (matching statistics through suffix links) must give, at every prefix
    # of the query and for every root, the longest suffix occurring in one document and what followed its first
    # occurrence, cut at the document's end; a wrong frozen edge (sorting, offsets), a cursor not shortened along
    # the links, or a draft crossing a separator would differ
    static = StaticAutomaton.build(concatenate(CORPUS))
    query = [7, 1, 2, 1, 2, 3, 4, 2, 3, 4, 4, 1, 2, 5, 9, 2, 3]
    roots = sorted({t for doc in CORPUS for t in doc} | {9})
    cursor, checked = (0, 0), 0
    for i in range(len(query) + 1):
        for root in roots:
            assert static.draft(*cursor, root, max_tokens) == naive_static(CORPUS, query[:i], root, max_tokens), (
                query[:i], root)
            checked += static.draft(*cursor, root, max_tokens)[0] > 1
        if i < len(query):
            cursor = static.follow(*cursor, [query[i]])
    assert checked > 20  # non-vacuous: many matches longer than the root alone


@pytest.mark.parametrize(("dynamic", "static", "bias", "threshold", "expected"), [
    (3, 9, 4, 4, "static"),    # 9 - 4 = 5 beats 3
    (5, 9, 4, 4, "dynamic"),   # 5 = 9 - 4: the dynamic one on a tie
    (6, 9, 4, 4, "dynamic"),
    (2, 7, 4, 4, None),        # max(2, 7 - 4) < 4: the fallback
    (0, 8, 4, 4, "static"),    # the static one alone reaches the threshold after the bias
    (0, 7, 0, 4, "static"),    # no bias
    (4, 0, 4, 4, "dynamic"),   # no static match at all
    (3, 3, 0, 4, None),
])
def test_the_choice_with_len_bias_is_the_references(dynamic, static, bias, threshold, expected):
    # hyx1999/SAM-Decoding@18c41f0 samd/draft.py DraftModel.lookup: match_static -= len_bias; if max(...) >=
    # len_threshold: the dynamic one if match_dyn >= match_static else the static one; else the tree model. A bias
    # added instead of subtracted, a tie to the static side or a threshold on the unbiased length fails a case
    assert choose_automaton(dynamic, static, bias, threshold) == expected


def static_sam(corpus, **options) -> SamDecoding:
    target = tiny_target(eos=False)
    method = SamDecoding(target, SamDecoding.Options(fallback="none", **options),
                         static=StaticAutomaton.build(concatenate(corpus)))
    method.counters = {}
    return method


def test_the_method_drafts_from_the_static_automaton_when_its_biased_match_is_longer():
    # corpus [[30, 31, 32, 33, 34, 35, 36]]; prompt [50, 30, 31, 32, 50, 32], root 33: 50 is not in the corpus, so
    # the static match is [32, 33] (2) -> [34, 35, 36]; 33 never occurred in the prompt: no dynamic match (0)
    method = static_sam([[30, 31, 32, 33, 34, 35, 36]], threshold=2, len_bias=0, draft_tokens=3)
    method.begin(torch.tensor([[50, 30, 31, 32, 50, 32]]), None)
    assert method.propose(33, SamplingParams(), None).tokens.tolist() == [34, 35, 36]
    # committing [33, 34]: the static cursor follows ([32, 33, 34] matches: 3); root 35 -> [32..35] (4) -> [36]
    method.accept([33, 34], None, 35)
    assert method.cursor[1] == 3
    assert method.propose(35, SamplingParams(), None).tokens.tolist() == [36]
    assert method.counters == {"static_steps": 2}


def test_a_tie_goes_to_the_dynamic_automaton_and_the_bias_can_leave_only_the_fallback():
    # corpus [[7, 30, 31, 32, 40, 41, 42]]. Prompt [30, 31, 32, 9, 30, 31], root 32: dynamic [30, 31, 32] (3) ->
    # [9, 30, 31], static [30, 31, 32] (3) -> [40, 41, 42]: a tie goes to the dynamic chain. Prompt [31, 9, 30, 31],
    # root 32: no dynamic match (32 never occurred), static 3: the static chain with bias 0, none with bias 2 (3 - 2
    # = 1 < threshold 2: the fallback, here no draft)
    corpus = [[7, 30, 31, 32, 40, 41, 42]]
    prompt = torch.tensor([[30, 31, 32, 9, 30, 31]])
    tie = static_sam(corpus, threshold=3, len_bias=0, draft_tokens=3)
    tie.begin(prompt, None)
    assert tie.propose(32, SamplingParams(), None).tokens.tolist() == [9, 30, 31]
    longer = static_sam(corpus, threshold=2, len_bias=0, draft_tokens=3)
    longer.begin(torch.tensor([[31, 9, 30, 31]]), None)
    assert longer.propose(32, SamplingParams(), None).tokens.tolist() == [40, 41, 42]
    biased = static_sam(corpus, threshold=2, len_bias=2, draft_tokens=3)
    biased.begin(torch.tensor([[31, 9, 30, 31]]), None)
    assert len(biased.propose(32, SamplingParams(), None)) == 0
    assert (tie.counters, longer.counters, biased.counters) == ({"sam_steps": 1}, {"static_steps": 1},
                                                               {"fallback_steps": 1})


@pytest.mark.parametrize("fallback", ["none", "eagle2"])
def test_the_static_variant_stays_lossless_and_drafts_from_the_corpus(fallback):
    # Method.example with a static option builds the automaton over the tiny target's own greedy continuations
    # (methods/rest/rest.py example_documents), so it matches: the output must be vanilla's token for token, and the
    # static chains must really have been verified
    target = tiny_target(eos=False)
    method = build_example("sam", target, static="example", len_bias=0, fallback=fallback, total_tokens=6, depth=2,
                           top_k=2)
    assert method.describe()["static_automaton"]["source"] == "example"
    vanilla = build_example("vanilla", target)
    static_steps = 0
    for prompt in ([[5, 9, 13, 20, 31, 7, 44]], [[17]], [[40, 41, 42, 43, 40, 41]]):
        gen = method.generate(torch.tensor(prompt), 40, GREEDY)
        assert gen.token_ids == vanilla.generate(torch.tensor(prompt), 40, GREEDY).token_ids
        static_steps += gen.counters.get("static_steps", 0)
    assert static_steps > 0


def test_static_files_round_trip_and_refuse_another_tokenizer(tmp_path):
    tok = char_tokenizer()
    built = StaticAutomaton.build(concatenate(CORPUS), tokenizer=tokenizer_identity(tok, "tiny"))
    built.save(tmp_path / "sam")
    loaded = load_static_automaton(tmp_path / "sam", tokenizer_identity(tok, "another name"))
    cursor = loaded.follow(0, 0, [4, 1])
    assert loaded.draft(*cursor, 2, 4) == built.draft(*built.follow(0, 0, [4, 1]), 2, 4) == (3, [5, 6])
    other = dict(tokenizer_identity(tok, "tiny"), vocab_sha256="0" * 64)
    with pytest.raises(ValueError, match="static SAM .* was built for tokenizer 'tiny'.*static-sam") as e:
        load_static_automaton(tmp_path / "sam", other)
    assert "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="not found.*draftbench data static-sam --target tiny"):
        load_static_automaton(tmp_path / "nothing", other)


def test_the_method_refuses_a_missing_or_foreign_static_automaton_at_configuration(tmp_path):
    target = tiny_target()
    with pytest.raises(FileNotFoundError, match="draftbench data static-sam"):
        SamDecoding.create(target, {"fallback": "none", "static": str(tmp_path / "nothing")})
    StaticAutomaton.build([1, 2, 3], tokenizer=dict(tokenizer_identity(target.tokenizer, "t"), vocab_size=1)).save(
        tmp_path / "sam")
    with pytest.raises(ValueError, match="built for tokenizer"):
        SamDecoding.create(target, {"fallback": "none", "static": str(tmp_path / "sam")})


def test_bad_static_options_name_the_field():
    target = tiny_target(eos=False)
    for bad, field in [({"len_bias": -1}, "len_bias"), ({"len_bias": "4"}, "len_bias"),
                       ({"len_bias": True}, "len_bias"), ({"static": ""}, "static"), ({"static": 3}, "static")]:
        with pytest.raises(OptionsError, match=field):
            SamDecoding.create(target, {"fallback": "none", **bad})


def test_the_builder_keeps_whole_documents_up_to_max_tokens(tmp_path):
    # datastore [[1, 2, 3], [4, 5], [6, 7, 8, 9]] = 1 2 3 | 4 5 | 6 7 8 9 |: 8 tokens keep the first two documents
    # (7 tokens, separators included), never a cut document; 3 tokens keep none: one clear error
    tok = char_tokenizer()
    Datastore.build([[1, 2, 3], [4, 5], [6, 7, 8, 9]], tokenizer=tokenizer_identity(tok, "tiny")).save(tmp_path / "ds")
    folder, automaton = build_static_automaton(tok, "tiny", tmp_path / "ds", tmp_path / "sam", max_tokens=8)
    assert automaton.tokens.tolist() == [1, 2, 3, -1, 4, 5, -1]
    assert load_static_automaton(folder).manifest["documents"] == 2
    with pytest.raises(ValueError, match="longer than --max-tokens 3"):
        build_static_automaton(tok, "tiny", tmp_path / "ds", tmp_path / "sam2", max_tokens=3)
