"""The per-step tree policies (methods/eagle/treepolicies.py) on literal token lists and timings, and the one
options base of the dynamic-tree methods (eagle2, eagle3, jakiro): shared fields, checks and recorded order."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import harness.engine.autotune as autotune
from harness.engine.tree import DraftTree
from harness.registry import get_method
from methods.eagle.eagle2 import DynamicTreeOptions, Eagle2Options
from methods.eagle.treepolicies import AdaptiveSizer, LookupGraft
from methods.eagle3.eagle3 import Eagle3Options
from methods.jakiro.jakiro import JakiroOptions
from tests.support.helpers import tiny_target

CPU = torch.device("cpu")


def _tree(tokens: list[int], parents: list[int]) -> DraftTree:
    return DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents))


def _no_draft() -> DraftTree:
    raise AssertionError("the chain alone was due: drafting must be skipped")


# ---- LookupGraft -------------------------------------------------------------------------------------------------
def test_lookup_graft_grafts_the_chain_onto_the_draft():
    """Context [1, 2, 3, 1, 2] + root 3: the 3-gram [1, 2, 3] recurs at 0, followed by [1, 2, 3]. Grafted onto the
    draft's tree root -> 1 -> 9, the chain follows node 0 (token 1) and appends 2 and 3 below it: 2 slots counted.
    A graft that ignored shared prefixes would append 3 nodes; one that dropped the draft would lose token 9."""
    graft = LookupGraft(length=4)
    graft.begin(torch.tensor([1, 2, 3, 1, 2]))
    counters: dict[str, int] = {}
    tree = graft.propose(3, lambda: _tree([1, 9], [-1, 0]), counters, CPU)
    assert tree.tokens.tolist() == [1, 9, 2, 3] and tree.parents.tolist() == [-1, 0, 0, 2]
    assert counters == {"lookup_slots": 2} and graft.drafted
    assert graft.own == ([1, 9], [-1, 0])  # the draft's own tree, without the chain
    assert graft.own_accepted([1, 2, 3]) == 1  # the draft proposed 1, not 2 after it: the chain won the rest
    assert graft.own_accepted([1, 9, 4]) == 2


def test_lookup_graft_alone_skips_drafting_on_a_long_match_only():
    """alone=3: the 3-gram match above verifies the chain alone (root -> 1 -> 2 -> 3) and never calls the draft;
    context [5, 6, 7, 8, 6] + root 7 matches only the 2-gram [6, 7] (followed by [8, 6, 7]), so that step drafts."""
    graft = LookupGraft(length=4, alone=3)
    graft.begin(torch.tensor([1, 2, 3, 1, 2]))
    counters: dict[str, int] = {}
    tree = graft.propose(3, _no_draft, counters, CPU)
    assert tree.tokens.tolist() == [1, 2, 3] and tree.parents.tolist() == [-1, 0, 1]
    assert counters == {"lookup_alone_steps": 1, "lookup_slots": 3} and not graft.drafted
    graft.begin(torch.tensor([5, 6, 7, 8, 6]))
    tree = graft.propose(7, lambda: _tree([8], [-1]), counters, CPU)
    assert graft.drafted and tree.tokens.tolist() == [8, 6, 7] and tree.parents.tolist() == [-1, 0, 1]
    assert counters == {"lookup_alone_steps": 1, "lookup_slots": 5}


def test_lookup_graft_without_a_match_keeps_the_tree_and_follows_the_commits():
    """No earlier occurrence: the draft's tree is returned as it is (nothing counted), and its own tree is still
    recorded; accepted tokens extend the context, so the next step finds the match they create."""
    graft = LookupGraft(length=2)
    graft.begin(torch.tensor([4, 5]))
    counters: dict[str, int] = {}
    draft = _tree([7], [-1])
    assert graft.propose(6, lambda: draft, counters, CPU) is draft
    assert counters == {} and graft.own == ([7], [-1])
    graft.accept([6, 4])  # context [4, 5, 6, 4]; root 5 -> [4, 5] recurs at 0, followed by [6, 4]
    assert graft.propose(5, lambda: _tree([6], [-1]), counters, CPU).tokens.tolist() == [6, 4]


# ---- AdaptiveSizer -----------------------------------------------------------------------------------------------
def test_adaptive_sizer_sizes_from_costs_and_calibrates():
    """best_tree_size's docstring example: probs [0.9, 0.5, 0.1], verification {1: 1.0, 2: 1.0, 4: 1.5} s, 0.5 s of
    drafting -> size 2 at 1.9 / 1.5 tokens/s. After 0 of the 0.9 predicted drafts were accepted the calibration is
    4 / 4.9 and the running costs move by a tenth: drafting 0.9 * 0.5 + 0.1 * 1.5 = 0.6 s, a forward 0.9 * 0.25 +
    0.1 * 0.5 = 0.275 s. A sizer that forgot its state between steps would see 1.5 s and 0.5 s."""
    sizer = AdaptiveSizer(cap=4)
    sizer.verify_s = {1: 1.0, 2: 1.0, 4: 1.5}
    assert sizer.another_level(0.0)  # nothing measured yet: always one more level
    counters: dict[str, int] = {}
    assert sizer.size([0.9, 0.5, 0.1], elapsed=0.5, forwards=2, counters=counters) == 2
    assert (sizer.draft_s, sizer.level_s, sizer.predicted) == (0.5, 0.25, 0.9)
    assert sizer.rate == pytest.approx(1.9 / 1.5) and counters == {"adaptive_slots": 2}
    assert sizer.another_level(0.4)  # 0.4 / 0.25 = 1.6 tokens/s > 1.27
    assert not sizer.another_level(0.3)  # 1.2 < 1.27
    sizer.accept(0)
    assert sizer.calibration.factor == pytest.approx(4 / 4.9)
    assert sizer.size([0.9, 0.5, 0.1], elapsed=1.5, forwards=3, counters=counters) == 2
    assert sizer.draft_s == pytest.approx(0.6) and sizer.level_s == pytest.approx(0.275)
    assert counters == {"adaptive_slots": 4}


def test_adaptive_sizer_times_the_verification_sizes_once(monkeypatch):
    """The verification sizes up to the cap are timed at the first turn only (a second timing would charge every
    turn with ~10 forwards per size)."""
    calls = []

    def timed(target, sizes, runtime="eager"):
        calls.append((sizes, runtime))
        return {s: 1.0 for s in sizes}

    monkeypatch.setattr(autotune, "time_tree_sizes", timed)
    sizer = AdaptiveSizer(cap=5)
    sizer.begin(None, "compiled")
    sizer.begin(None, "compiled")
    assert calls == [((1, 2, 3, 4, 5), "compiled")] and sizer.verify_s == {s: 1.0 for s in (1, 2, 3, 4, 5)}


# ---- the options base --------------------------------------------------------------------------------------------
OPTIONS = [Eagle2Options, Eagle3Options, JakiroOptions]
BAD = [
    ({"head": 5}, "head must be a checkpoint folder path (string), got int"),
    ({"total_tokens": 1}, "total_tokens must be >= 2 (root included) or -1 (automatic), got 1"),
    ({"depth": 0}, "depth must be >= 1, got 0"),
    ({"top_k": 0}, "top_k must be >= 1, got 0"),
    ({"adaptive": "yes"}, "adaptive must be true or false, got 'yes'"),
    ({"total_tokens": -1, "adaptive": True},
     "adaptive sizes each step's tree up to total_tokens: give total_tokens >= 2, not -1"),
    ({"lookup": True}, "lookup must be an integer >= 0 (tokens of the grafted prompt-lookup chain; 0 = off), got True"),
    ({"lookup": 4, "lookup_ngram": 4}, "lookup_ngram must be an integer in 1..3, got 4"),
    ({"lookup": 4, "lookup_ngram": 2, "lookup_alone": 1},
     "lookup_alone must be 0 (always draft) or an n-gram length in 2..3 (lookup_ngram..3), got 1"),
    ({"lookup_alone": 2}, "lookup_alone needs a lookup chain: set lookup > 0 too"),
    ({"draft_window": -1},
     "draft_window must be an integer >= 0 (positions the draft attends to; 0 = the whole context), got -1"),
    ({"draft_window": True},
     "draft_window must be an integer >= 0 (positions the draft attends to; 0 = the whole context), got True"),
    ({"max_spec_context": -5}, "max_spec_context must be an integer >= 0 (0 = off), got -5"),
    ({"stop_unprofitable": -1}, "stop_unprofitable must be an integer >= 0 (0 = off), got -1"),
    ({"stop_unprofitable": 4},
     "stop_unprofitable reads the adaptive sizing's measured costs: set adaptive true too"),
]


@pytest.mark.parametrize("values, message", BAD, ids=[",".join(v) for v, _ in BAD])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda c: c.__name__)
def test_the_dynamic_tree_options_refuse_a_bad_value_alike(options, values, message):
    """Every dynamic-tree method refuses a bad shared option with the same message: the checks are written once, in
    DynamicTreeOptions. A subclass that dropped or rewrote one would differ here."""
    with pytest.raises(ValueError) as refused:
        options(**values)
    assert str(refused.value) == message


def test_the_options_share_the_base_fields_and_add_only_their_own():
    """The base's thirteen fields are in all three, and each subclass declares only its own fields (and EAGLE-3 its
    depth default): a subclass re-declaring a shared field would be a copy that can drift again."""
    shared = [f.name for f in dataclasses.fields(DynamicTreeOptions)]
    assert shared == ["head", "total_tokens", "depth", "top_k", "adaptive", "lookup", "lookup_ngram", "lookup_alone",
                      "draft_window", "max_spec_context", "stop_unprofitable", "backoff", "head_precision"]
    for cls in OPTIONS:
        assert set(shared) <= {f.name for f in dataclasses.fields(cls)}
    assert list(Eagle2Options.__annotations__) == ["draft_vocab"]
    assert list(Eagle3Options.__annotations__) == ["depth"]
    assert list(JakiroOptions.__annotations__) == ["mode", "contrastive", "alignment", "candidates", "num_experts",
                                                   "experts_per_tok"]
    defaults = [(o.total_tokens, o.depth, o.top_k) for o in (Eagle2Options(), Eagle3Options(), JakiroOptions())]
    assert defaults == [(60, 5, 10), (60, 7, 10), (60, 5, 10)]
    assert not hasattr(Eagle3Options(), "draft_vocab")  # EAGLE-3's head has its own reduced vocabulary


def test_the_options_keep_their_recorded_order():
    """Manifests, turn records and tables (opt.* columns, ablation knobs) show the options in the order they always
    had, not the dataclass order (shared fields first): a jakiro sweep over mode and total_tokens has the knobs
    [mode, total_tokens]. A class that lists its order lists every field once (a field left out would follow the
    others, out of its place)."""
    for cls in OPTIONS:
        names = [f.name for f in dataclasses.fields(cls)]
        assert sorted(cls.RECORDED_ORDER or names) == sorted(names)
    target = tiny_target()
    described = {name: list(get_method(name).example(target, top_k=4).describe()["options"])
                 for name in ("eagle2", "eagle3", "jakiro")}
    later = ["draft_window", "max_spec_context", "stop_unprofitable", "backoff"]  # added after the others: they follow
    assert described == {
        "eagle2": ["head", "total_tokens", "depth", "top_k", "draft_vocab", "adaptive", "lookup", "lookup_ngram",
                   "lookup_alone", *later],
        "eagle3": ["head", "total_tokens", "depth", "top_k", "adaptive", "lookup", "lookup_ngram", "lookup_alone",
                   *later],
        "jakiro": ["head", "mode", "contrastive", "alignment", "candidates", "total_tokens", "depth", "top_k",
                   "num_experts", "experts_per_tok", "draft_vocab", "adaptive", "lookup", "lookup_ngram",
                   "lookup_alone", *later]}
    # head_precision came last: recorded (last) only when set, so runs with a head as loaded record what they always did
    with_head = get_method("eagle2").example(target, top_k=4, head_precision="bfloat16").describe()["options"]
    assert list(with_head)[-1] == "head_precision" and with_head["head_precision"] == "bfloat16"
