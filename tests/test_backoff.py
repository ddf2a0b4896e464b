"""Option ``backoff`` of the dynamic-tree methods (methods/eagle/treepolicies.py Backoff, harness/engine/autotune.py
best_arm): before every step, the head's tree, the lookup chain alone or a plain one-token step, whichever its
measured costs expect to be fastest; the head re-probed every turn and after k steps without it. The decision rule
on literal numbers; a draft whose acceptance is near zero backs off to plain steps and comes back when it recovers;
every output stays vanilla's."""

from __future__ import annotations

import pytest
import torch

import harness.engine.autotune as autotune
from harness.engine.autotune import best_arm, decayed
from harness.engine.hostio import upload
from harness.engine.tree import DraftTree, chain_tree
from harness.registry import get_method
from methods.eagle.eagle2 import Eagle2Options
from methods.eagle.treepolicies import AdaptiveSizer, Backoff, LookupGraft
from methods.vanilla import Vanilla
from tests.support.helpers import GREEDY, SAMPLING_IDS, SAMPLINGS, check_generation, method_pvalue, tiny_target

CPU = torch.device("cpu")
PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]])  # 17 tokens
VERIFY_S = {1: 1.0, 2: 1.1, 3: 1.15, 4: 1.2}  # literal verification seconds per size, root included


# ---- the decision rule --------------------------------------------------------------------------------------------
def test_best_arm_literal():
    """best_arm's docstring example, and ties going to the cheaper arm: a head that emits 1.2 tokens in 1.4 s
    (0.86/s) loses to a plain 1 s forward; an arm chosen on tokens alone (ignoring the draft's seconds) would pick
    the head, one chosen on cost alone always the plain step."""
    assert best_arm(1.0, chain=(2.0, 1.1), head=(1.2, 1.4)) == "chain"
    assert best_arm(1.0, head=(1.2, 1.4)) == "plain"
    assert best_arm(1.0, chain=(2.0, 1.1), head=(3.0, 1.5)) == "head"
    assert best_arm(1.0) == "plain"
    assert best_arm(1.0, chain=(2.0, 2.0), head=(2.0, 2.0)) == "plain"  # 1.0 each: the cheapest
    assert best_arm(0.5, chain=(4.0, 2.0), head=(2.0, 1.0)) == "plain"  # 2.0 each
    assert best_arm(1.0, chain=(3.0, 1.5), head=(4.0, 2.0)) == "chain"  # 2.0 each: no draft forward
    with pytest.raises(ValueError, match="plain_s must be > 0"):
        best_arm(0.0)
    with pytest.raises(ValueError, match="head needs tokens >= 0 and seconds > 0"):
        best_arm(1.0, head=(1.0, 0.0))


def test_decayed_mean_literal():
    """The first value is taken as it is (a prior of 0 would make a new head look worthless at once); then each
    value moves the mean by its weight."""
    assert decayed(None, 3.0, 0.25) == 3.0
    assert decayed(2.0, 0.0, 0.25) == 1.5
    assert decayed(1.0, 4.0, 0.25) == 1.75


def _draft(tokens: list[int]):
    def draft() -> DraftTree:
        return chain_tree(torch.tensor(tokens))
    return draft


def _no_draft() -> DraftTree:
    raise AssertionError("the step was not the head's: drafting must be skipped")


def _sizer(elapsed: float = 0.3) -> AdaptiveSizer:
    """A sizer whose verification sizes were timed at :data:`VERIFY_S` and whose drafting takes ``elapsed`` s."""
    sizer = AdaptiveSizer(cap=4)
    sizer.verify_s, sizer.elapsed = dict(VERIFY_S), elapsed
    return sizer


def test_a_losing_head_backs_off_to_plain_steps_and_comes_back_when_it_recovers():
    """Verification 1.0 s (one slot) .. 1.2 s (4 slots), drafting 0.3 s, probe 2. Step 1 probes the head (a new
    turn): 3 drafts, 0 accepted -> 1 token in 1.5 s (0.67/s) < 1/s, so steps 2 and 3 are plain (no draft called);
    step 4 probes again (2 steps without the head). The head now accepts 3: its mean moves to 1 + 0.25 * 3 = 1.75
    tokens in 1.5 s = 1.17/s > 1/s, so step 5 drafts without a probe, and so on. A policy without probes would stay
    plain forever; one that ignored the draft's 0.3 s would keep drafting the losing head (1 token in 1.2 s still
    loses, but 1.25 tokens would not)."""
    backoff, counters = Backoff(_sizer(), probe=2), {}
    backoff.begin()
    arms = []
    for accepted in [0, 0, 0, 3, 3, 3]:
        tree = backoff.propose([], _draft([7, 8, 9]), counters, CPU)
        arms.append(backoff.arm)
        assert len(tree) == (3 if backoff.arm == "head" else 0) and backoff.slots == len(tree) + 1
        backoff.record(accepted if backoff.arm == "head" else 0, None)
    assert arms == ["head", "plain", "plain", "head", "head", "head"]
    assert counters == {"backoff_probes": 2, "backoff_head": 4, "backoff_plain": 2}
    assert backoff.head[False] == (2.734375, 1.5)  # tokens 1 -> 1.75 -> 2.3125 -> 2.734375; 0.3 + 1.2 s each
    backoff.begin()  # a new turn probes the head again, whatever its mean
    backoff.head[False] = (1.0, 1.2)
    backoff.propose([], _draft([7]), counters, CPU)
    assert backoff.arm == "head" and counters["backoff_probes"] == 3


def test_the_chain_alone_wins_when_the_head_adds_nothing_to_it():
    """A chain of 3 tokens on offer (4 slots: 1.2 s). Step 1 probes the head with the chain grafted on: 2 drafts
    accepted, both on the chain -> chain mean 2, head-with-chain (3 tokens, 0.3 + 1.2 s). Step 2: chain alone 3 / 1.2 =
    2.5/s beats the head's 3 / 1.5 = 2.0/s: the chain alone, no draft. Step 3 has no chain: the head without one has
    never been measured, so it is probed. A rule that priced the chain as a grafted head step would pay the draft."""
    backoff, counters = Backoff(_sizer(), probe=8), {}
    backoff.begin()
    assert len(backoff.propose([5, 6, 7], _draft([5, 6, 7, 1]), counters, CPU)) == 4
    backoff.record(2, 2)
    assert (backoff.chain, backoff.head[True]) == (2.0, (3.0, 1.5))
    tree = backoff.propose([5, 6, 7], _no_draft, counters, CPU)
    assert backoff.arm == "chain" and tree.tokens.tolist() == [5, 6, 7] and tree.parents.tolist() == [-1, 0, 1]
    backoff.record(1, 1)
    assert backoff.chain == 1.75 and backoff.idle == 1
    backoff.propose([], _draft([9]), counters, CPU)
    assert backoff.arm == "head"
    assert counters == {"backoff_probes": 2, "backoff_head": 2, "backoff_chain": 1}
    with pytest.raises(ValueError, match="probe must be >= 1"):
        Backoff(_sizer(), probe=0)


def test_lookup_graft_asks_the_backoff_and_keeps_its_alone_rule():
    """Through LookupGraft: a 3-gram match with alone=3 verifies the chain alone without asking the backoff (its
    arm stays None); a 2-gram match asks it, and a plain step verifies no chain (chain_accepted None), a chain-alone
    step counts its slots as lookup_slots."""
    sizer = _sizer()
    backoff = Backoff(sizer, probe=8)
    backoff.begin()
    graft = LookupGraft(length=4, alone=3)
    graft.begin(torch.tensor([1, 2, 3, 1, 2]))
    counters: dict[str, int] = {}
    tree = graft.propose(3, _no_draft, counters, CPU, backoff)  # 3-gram [1, 2, 3] -> chain [1, 2, 3] alone
    assert tree.tokens.tolist() == [1, 2, 3] and backoff.arm is None and not graft.drafted
    assert graft.chain_accepted([1, 2, 9]) == 2
    backoff.record(2, 2)
    backoff.chain, backoff.head[True], backoff.idle = 0.0, (1.5, 1.5), 0  # a chain that never pays, a head at 1/s
    graft.begin(torch.tensor([5, 6, 7, 8, 6]))  # root 7: the 2-gram [6, 7] matches, chain [8, 6, 7]
    tree = graft.propose(7, _no_draft, counters, CPU, backoff)  # plain 1/s ties the head: the cheaper arm
    assert backoff.arm == "plain" and len(tree) == 0 and graft.chain_accepted([]) is None and not graft.drafted
    backoff.chain = 2.0  # 3 tokens in 1.2 s
    tree = graft.propose(7, _no_draft, counters, CPU, backoff)
    assert backoff.arm == "chain" and tree.tokens.tolist() == [8, 6, 7] and graft.chain_accepted([8]) == 1
    assert counters == {"lookup_alone_steps": 1, "lookup_slots": 6, "backoff_plain": 1, "backoff_chain": 1}


# ---- the methods ----------------------------------------------------------------------------------------------------
def _timed(monkeypatch):
    """Verification timings in place of measured ones: 1.0 s for one slot, 1.2 s for any more."""
    monkeypatch.setattr(autotune, "time_tree_sizes",
                        lambda target, sizes, runtime="eager": {s: 1.0 if s == 1 else 1.2 for s in sizes})


@pytest.mark.parametrize("name", ["eagle2", "eagle3", "jakiro"])
def test_a_random_head_backs_off_and_stays_lossless(name, monkeypatch):
    """A random head on the tiny target accepts almost nothing: with any tree dearer than a plain forward, most steps
    are plain (no draft forward), the head drafts at the first step and at least once in every 4 steps (probe 3),
    and the output is vanilla's."""
    _timed(monkeypatch)
    target = tiny_target(vocab=64, tokenizer=False)
    method = get_method(name).example(target, total_tokens=8, depth=2, top_k=3, adaptive=True, backoff=3)
    gen = method.generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == Vanilla(target).generate(PROMPT, 40, GREEDY).token_ids
    c, steps = gen.counters, len(gen.accept_lengths) - 1
    assert c.get("backoff_head", 0) + c.get("backoff_plain", 0) == steps and "backoff_chain" not in c
    assert c["backoff_plain"] > steps // 2 and c["backoff_head"] >= steps // 4 and c["backoff_probes"] >= 1
    assert gen.draft_depths.count(0) >= c["backoff_plain"]  # a plain step verifies the root alone
    check_generation(gen, method, PROMPT.shape[1], 40)


def test_the_head_comes_back_when_its_acceptance_recovers(monkeypatch):
    """eagle2 whose draft is replaced by a fake: 3 wrong tokens while fewer than 12 tokens are committed, vanilla's
    next 3 after that, always 0.05 s of drafting. Wrong: after the first probe the steps are plain, one probe in
    every 3 steps (probe 2). Right: the probe at 12 accepts 3 (1.75 tokens in 1.25 s > 1/s), and from then on every
    step drafts and emits 4 tokens. The accept lengths are literal: a policy that never re-probed would stay at 1."""
    _timed(monkeypatch)
    target = tiny_target(vocab=64, tokenizer=False)
    future = Vanilla(target).generate(PROMPT, 48, GREEDY).token_ids
    method = get_method("eagle2").example(target, total_tokens=4, depth=2, top_k=3, adaptive=True, backoff=2)
    at = {"n": 0}
    accept = method.accept

    def counting_accept(tokens, hidden, next_root):
        at["n"] += len(tokens)
        accept(tokens, hidden, next_root)

    def fake_draft(root):
        assert root == future[at["n"]]
        ahead = future[at["n"] + 1: at["n"] + 4]
        tokens = ahead if at["n"] >= 12 else [(t + 1) % 64 for t in ahead]
        method.sizer.size([0.9, 0.8, 0.7], 0.05, 1, method.counters)
        return chain_tree(upload(tokens, CPU))

    method.accept, method.propose_draft = counting_accept, fake_draft
    gen = method.generate(PROMPT, 32, GREEDY)
    assert gen.token_ids == future[:32]
    assert gen.accept_lengths == [1] + [1] * 12 + [4] * 4 + [3]
    assert gen.counters["backoff_head"] == 9 and gen.counters["backoff_plain"] == 8
    assert gen.counters["backoff_probes"] == 5


@pytest.mark.parametrize("lookup", [0, 6])
def test_backoff_keeps_greedy_output_with_and_without_the_chain(lookup):
    """Measured timings of the tiny target, whatever arm they pick: vanilla's output, and one arm counted per step."""
    target = tiny_target(vocab=64, tokenizer=False)
    prompt = torch.cat([PROMPT, PROMPT], dim=1)  # repeated n-grams: the chain has matches
    options = dict(total_tokens=8, depth=2, top_k=3, adaptive=True, backoff=2, lookup=lookup)
    method = get_method("eagle3").example(target, **options)
    gen = method.generate(prompt, 40, GREEDY)
    assert gen.token_ids == Vanilla(target).generate(prompt, 40, GREEDY).token_ids
    c = gen.counters
    assert sum(c.get(f"backoff_{arm}", 0) for arm in ("head", "chain", "plain")) == len(gen.accept_lengths) - 1
    check_generation(gen, method, prompt.shape[1], 40)


@pytest.mark.parametrize("values, message", [
    ({"backoff": 4}, "backoff reads the adaptive sizing's measured costs: set adaptive true too"),
    ({"backoff": -1, "adaptive": True}, "backoff must be an integer >= 0 (0 = off), got -1"),
    ({"backoff": 4, "adaptive": True, "stop_unprofitable": 4},
     "backoff already runs plain steps when drafting does not pay, and stop_unprofitable would charge them a draft: "
     "set one of them"),
])
def test_the_backoff_option_is_checked(values, message):
    with pytest.raises(ValueError) as refused:
        Eagle2Options(**values)
    assert str(refused.value) == message


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_sampling_with_backoff_matches_the_target_distribution(sampling):
    """At T > 0: plain, chain and head steps interleave; the joint of the first three tokens must be the target's."""
    options = {"total_tokens": 8, "depth": 2, "top_k": 3, "adaptive": True, "backoff": 1, "lookup": 2}
    assert method_pvalue("eagle2", sampling, 1500, 8, **options) > 1e-3
