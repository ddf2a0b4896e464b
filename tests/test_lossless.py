"""Losslessness of every registered method, by construction: the parameter lists are the registry
(:func:`tests.support.helpers.registered_methods`, read at collection time), and each method is built without files by
``Method.example`` (random draft parts). A method registered only in its own module is covered as soon as it
registers; one that cannot be built by ``example`` fails here, saying so.

- greedy on tiny targets: output == vanilla token for token on several prompts, to the budget and with EOS cuts;
- oracle drafts: the method proposes its own trees and runs its own bookkeeping, but the deepest path of every tree
  is rewritten with the target's greedy continuation, so every step accepts the full depth (long accepts through
  the method's ``accept`` and draft cache);
- sampled (slow): the joint distribution of the first three tokens at T=1 and at T=0.7/top-p 0.9 equals the
  target's (chi-square against the exact distribution on a vocabulary-8 target), and the same test rejects lossy
  verification.

Method-specific option combinations (Jakiro modes, Medusa acceptance rules, Jakiro* variants) are tested in the
methods' own test modules; the real-model version of the first two blocks is tests/test_default_model.py.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch

from harness.engine.speculative import SpeculativeMethod
from harness.registry import METHODS
from tests.support.helpers import (
    GREEDY,
    SAMPLE_PROMPT,
    SAMPLING_IDS,
    SAMPLINGS,
    build_example,
    check_generation,
    install_oracle,
    method_pvalue,
    registered_methods,
    sampling_target,
    tiny_target,
)

METHOD_NAMES = registered_methods()
PROMPTS = [
    torch.tensor([[5, 9, 13, 20, 31, 7, 44]]),
    torch.tensor([[40, 41, 42, 43, 40, 41, 42, 43, 40, 41]]),  # repeated n-grams: prompt lookup finds matches
    torch.tensor([[17]]),                                    # a one-token prompt
]
BUDGET = 40

# Options for the vocabulary-8 sampling target, where the default trees do not fit (top_k 10, rank-9 children);
# only for speed and fit: a method missing here is tested with its defaults.
SMALL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
SMALL_VOCAB_OPTIONS = {
    "eagle1": {"tree": SMALL_TREE},
    "eagle2": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "eagle3": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "jakiro": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "jakiro_star": {"tree": SMALL_TREE},
    "medusa": {"tree": [[0], [1], [0, 0], [1, 0], [0, 1]]},
    "hydra": {"tree": [[0], [1], [0, 0], [1, 0], [0, 1]]},
    "sam": {"total_tokens": 8, "depth": 2, "top_k": 3},
}
SAMPLE_SEED = 8  # the seed of the random draft heads in the sampled tests
# Examples with other draft parts, built by an argument of a method's example(): covered by the greedy, EOS, oracle
# and sampled tests as the registry's methods are. Hydra++ heads: a prefix layer keeping its own KV over the
# committed features (a KV kept over rejected tokens or a wrong feature would diverge or break an invariant). Layer
# skip by sub-layers: layer 0's MLP skipped in the draft (the sampled tests' target has one layer; a stand-in left in
# the model would diverge; tests/test_layer_skip.py skips attention sub-layers).
EXAMPLE_VARIANTS = {"hydra-prefix-mlp": ("hydra", {"head_arch": "prefix-mlp"}),
                    "layer_skip-sub-layers": ("layer_skip", {"skip_mlp": [0]})}
CASES = ([pytest.param(n, {}, id=n) for n in METHOD_NAMES]
         + [pytest.param(n, example, id=key) for key, (n, example) in EXAMPLE_VARIANTS.items()])
N_SAMPLES = 1500


def vanilla_tokens(target, prompt, budget: int) -> list[int]:
    return build_example("vanilla", target).generate(prompt, budget, GREEDY).token_ids


def assert_greedy_equals_vanilla(name: str, **options) -> None:
    """Method ``name`` (built by ``example`` with random draft parts) on a tiny target without EOS: for every
    prompt, vanilla's tokens to the budget, with every Generation invariant."""
    target = tiny_target(eos=False)
    method = build_example(name, target, **options)
    for prompt in PROMPTS:
        gen = method.generate(prompt, BUDGET, GREEDY)
        assert gen.token_ids == vanilla_tokens(target, prompt, BUDGET), f"prompt {prompt.tolist()}"
        check_generation(gen, method, prompt.shape[1], BUDGET)


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("name, example", CASES)
def test_greedy_equals_vanilla_with_random_drafts(name, example):
    # whatever a random draft proposes, verification must keep exactly the target's greedy tokens; a wrong
    # position, mask, cache compaction or draft bookkeeping makes the output diverge or an invariant break
    assert_greedy_equals_vanilla(name, **example)


ADAPTIVE = [n for n in METHOD_NAMES if "adaptive" in getattr(METHODS.get(n).Options, "__dataclass_fields__", {})]


@pytest.mark.parametrize("name", ADAPTIVE)
def test_adaptive_tree_sizes_stay_lossless(name):
    # adaptive=true verifies a per-step prefix of the ranked candidates, sized from the tiny target's measured
    # forward times: the emitted tokens must not depend on which prefix was chosen
    assert_greedy_equals_vanilla(name, adaptive=True, total_tokens=12, depth=3, top_k=4)


def test_the_dynamic_tree_methods_offer_adaptive():
    # the parametrization above is read from the methods' options: it must not be empty by accident
    assert {"eagle2", "eagle3", "jakiro"} <= set(ADAPTIVE)


WINDOW = [n for n in METHOD_NAMES if "draft_window" in getattr(METHODS.get(n).Options, "__dataclass_fields__", {})]


@pytest.mark.parametrize("name", WINDOW)
def test_a_draft_window_stays_lossless(name):
    # draft_window=3: the draft attends to its last 3 positions only (the prompts are up to 10 tokens, the turns 40
    # more), so it proposes other trees; the target verifies every one, so the tokens must still be vanilla's, and
    # the draft's stable KV must really hold no more than 3 positions
    assert {"eagle1", "eagle2", "eagle3", "jakiro", "jakiro_star"} <= set(WINDOW)
    assert_greedy_equals_vanilla(name, draft_window=3)
    method = build_example(name, tiny_target(eos=False), draft_window=3)
    method.generate(PROMPTS[0], BUDGET, GREEDY)
    assert method.cache.kv_length == 3 < method.cache.length


SPECULATIVE = [n for n in METHOD_NAMES if issubclass(METHODS.get(n), SpeculativeMethod)]
MAX_CONTEXT = 24


@pytest.mark.parametrize("name", SPECULATIVE)
def test_max_spec_context_turns_every_method_plain_past_it(name):
    # the engine's option, every speculative method's: with oracle drafts every step accepts its tree's full depth
    # while the context (prompt and emitted tokens) is at most 24; the first step past it and every later one is a
    # plain one-token forward without a tree, the turn says at which step and context it stopped, and the output is
    # vanilla's. A method whose options lacked the field would fail to build; one the engine kept speculating for
    # would show accepts > 1 after the stop
    assert {"pld", "medusa", "eagle1", "sps", "hydra", "lookahead", "jakiro_star", "layer_skip"} <= set(SPECULATIVE)
    target = tiny_target(eos=False)
    prompt = PROMPTS[1]  # 10 tokens of repeated 4-grams: the lookup methods find matches
    continuation = vanilla_tokens(target, prompt, BUDGET + 64)
    method = build_example(name, target, max_spec_context=MAX_CONTEXT)
    install_oracle(method, continuation)
    gen = method.generate(prompt, BUDGET, GREEDY)
    assert gen.token_ids == continuation[:BUDGET]
    context = [prompt.shape[1] + sum(gen.accept_lengths[:i]) for i in range(gen.steps)]  # before target forward i
    first = next(i for i in range(1, gen.steps) if context[i] > MAX_CONTEXT)
    assert gen.speculation_off == {"step": first, "reason": "max_spec_context", "context": context[first]}
    assert gen.accept_lengths[first:] == [1] * (gen.steps - first)
    assert gen.draft_depths[first - 1:] == [0] * (gen.steps - first)
    assert max(gen.accept_lengths[:first]) > 1, "the method never speculated before the stop"
    check_generation(gen, method, prompt.shape[1], BUDGET)
    unlimited = build_example(name, target)  # without the option the same turn speculates past 24 tokens
    install_oracle(unlimited, continuation)
    assert unlimited.generate(prompt, BUDGET, GREEDY).speculation_off is None


LOOKUP = [n for n in METHOD_NAMES if "lookup" in getattr(METHODS.get(n).Options, "__dataclass_fields__", {})]


@pytest.mark.parametrize("variant", [{}, {"adaptive": True}, {"adaptive": True, "lookup_alone": 2},
                                     {"adaptive": True, "lookup_alone": 2, "backoff": 1}],
                         ids=["fixed", "adaptive", "alone", "backoff"])
@pytest.mark.parametrize("name", LOOKUP)
def test_grafted_lookup_chains_stay_lossless(name, variant):
    # lookup=6 grafts a prompt-lookup chain onto every step's tree (the repeated prompt and the tiny target's loops
    # make it match), and lookup_alone=2 verifies a chain of a 2-gram match alone, skipping the draft (which then
    # catches up on several positions at once), and backoff=1 may also run the chain alone or a plain step instead
    # of the draft: the tokens must still be vanilla's, and the chains must really have been verified
    assert {"eagle2", "eagle3", "jakiro"} <= set(LOOKUP)
    options = dict(total_tokens=12, depth=3, top_k=4, lookup=6, **variant)
    assert_greedy_equals_vanilla(name, **options)
    method = build_example(name, tiny_target(eos=False), **options)
    gen = method.generate(PROMPTS[1], BUDGET, GREEDY)
    assert gen.counters.get("lookup_slots", 0) > 0, "no lookup chain was grafted on a prompt of repeated 4-grams"
    if "lookup_alone" in variant:
        assert 0 < gen.counters["lookup_alone_steps"] < gen.steps, "no step skipped the draft, or every step did"


@pytest.mark.parametrize("eos_at", [0, 9])
@pytest.mark.parametrize("name, example", CASES)
def test_greedy_stops_at_eos_like_vanilla(name, example, eos_at):
    # vanilla's token number `eos_at` becomes the EOS: the method must emit exactly up to and including its first
    # occurrence (accepted drafts past it are cut), stop with reason "eos", and keep the cache consistent
    target = tiny_target(eos=False)
    prompt = PROMPTS[0]
    reference = vanilla_tokens(target, prompt, BUDGET)
    target.eos_ids = frozenset({reference[eos_at]})
    method = build_example(name, target, **example)
    gen = method.generate(prompt, BUDGET, GREEDY)
    assert gen.token_ids == reference[: reference.index(reference[eos_at]) + 1]
    assert gen.stop_reason == "eos"
    check_generation(gen, method, prompt.shape[1], BUDGET)


# ------------------------------------------------------------------------------------------------ oracle drafts


@pytest.mark.parametrize("name, example", CASES)
def test_oracle_drafts_are_accepted_to_full_depth(name, example):
    # the deepest path of every tree the method proposes is the target's own continuation: verification must
    # accept exactly that depth at every step (a verifier that stops early, a wrong mask or position would accept
    # less), the method's accept/draft-cache logic must follow the long accepts, and the output is vanilla's
    target = tiny_target(eos=False)
    if not isinstance(build_example(name, target), SpeculativeMethod):
        pytest.skip(f"{name} is not a SpeculativeMethod: it proposes no draft tree to make an oracle of")
    steps = 0
    for prompt in PROMPTS:
        method = build_example(name, target, **example)
        continuation = vanilla_tokens(target, prompt, BUDGET + 64)
        path_lengths = install_oracle(method, continuation)
        gen = method.generate(prompt, BUDGET, GREEDY)
        assert gen.token_ids == continuation[:BUDGET]
        assert path_lengths == gen.draft_depths  # the rewritten path is the deepest one
        assert gen.accepted_drafts == gen.draft_depths, "a step accepted less than the oracle path"
        check_generation(gen, method, prompt.shape[1], BUDGET)
        steps += gen.steps
    # non-vacuous: the trees were deep enough for long accepts (more than 2 tokens per target forward overall)
    assert len(PROMPTS) * BUDGET / steps > 2, (name, steps)


# ------------------------------------------------------------------------------------------------ sampled


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
@pytest.mark.parametrize("name, example", CASES)
def test_sampling_matches_the_target_distribution(name, example, sampling):
    # prefill + one or two verifications make the first three tokens; a wrong draft_probs row, a sibling drawn
    # with replacement, a biased residual or bonus, or pruning at top_p shows up in their joint distribution
    options = {**SMALL_VOCAB_OPTIONS.get(name, {}), **example}
    if not build_example(name, sampling_target(), SAMPLE_SEED, **options).lossless:
        pytest.skip(f"{name} with options {options} says it is not lossless (lossless=False)")
    assert method_pvalue(name, sampling, N_SAMPLES, SAMPLE_SEED, **options) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_sampling_with_sams_static_automaton_matches_the_target_distribution(sampling):
    # sam with a static automaton over the target's own greedy text (Method.example), threshold 1 and no bias, so
    # that its chains draft from the first step: a chain is a deterministic proposal and must keep the target's
    # distribution; the counters show that static chains were verified
    options = {**SMALL_VOCAB_OPTIONS["sam"], "static": "example", "len_bias": 0, "threshold": 1}
    method = build_example("sam", sampling_target(), SAMPLE_SEED, **options)
    gen = method.generate(SAMPLE_PROMPT, 12, sampling, torch.Generator().manual_seed(0))
    assert gen.counters.get("static_steps", 0) > 0
    assert method_pvalue("sam", sampling, N_SAMPLES, SAMPLE_SEED, **options) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_sampling_with_a_grafted_lookup_chain_matches_the_target_distribution(sampling):
    # eagle2's tree with a prompt-lookup chain grafted on (the vocabulary-8 target repeats itself, so chains exist)
    # stays a deterministic proposal: the deterministic-proposal rule must keep the target's distribution
    options = {**SMALL_VOCAB_OPTIONS["eagle2"], "lookup": 3}
    assert method_pvalue("eagle2", sampling, N_SAMPLES, SAMPLE_SEED, **options) > 1e-3


@pytest.mark.slow
def test_the_sampled_test_rejects_a_lossy_verifier():
    # the same statistic on Medusa's typical acceptance (lossy at T > 0, and labelled so) must fail, or the test
    # above could not fail either
    options = {**SMALL_VOCAB_OPTIONS["medusa"], "acceptance": "typical"}
    assert not build_example("medusa", sampling_target(), **options).lossless
    assert method_pvalue("medusa", SAMPLINGS[0], N_SAMPLES, SAMPLE_SEED, **options) < 1e-6


# ------------------------------------------------------------------------------------------------ coverage


THROWAWAY = '''
from harness.engine.method import Generation, Method
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import chain_tree
from harness.registry import register_method


@register_method("throwaway_repeat")
class RepeatRoot(SpeculativeMethod):
    """Drafts the pending token twice."""

    def propose(self, root, sampling, generator):
        return chain_tree([root, root])


@register_method("throwaway_broken")
class Broken(Method):
    """Answers with token 7 whatever the target says."""

    def generate(self, prompt_ids, max_new_tokens, sampling, generator=None):
        return Generation([7] * max_new_tokens, [1] * max_new_tokens, "max_new_tokens")


@register_method("throwaway_needs_a_checkpoint")
class NeedsCheckpoint(SpeculativeMethod):
    """Loads a head in its constructor and does not override Method.example."""

    def __init__(self, target, options=None):
        raise FileNotFoundError("no head at /nowhere")
'''


@pytest.fixture()
def throwaway_methods(tmp_path, monkeypatch):
    """A module outside the repository that registers three methods on import; registry and sys.modules are
    restored afterwards."""
    (tmp_path / "throwaway_methods.py").write_text(textwrap.dedent(THROWAWAY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(METHODS, "_entries", dict(METHODS._entries))
    yield importlib.import_module("throwaway_methods")
    sys.modules.pop("throwaway_methods", None)


def test_a_method_registered_in_its_own_module_is_covered(throwaway_methods):
    # the parameter list is the registry, not a hand-written list: a method registered only in its own file is in
    # it, its greedy check runs (and passes for a lossless method, fails for a wrong one), and a method that needs
    # a checkpoint without overriding Method.example fails with a message saying so instead of being skipped
    names = registered_methods()
    assert {"throwaway_repeat", "throwaway_broken", "throwaway_needs_a_checkpoint"} <= set(names)
    assert set(METHOD_NAMES) <= set(names)
    assert_greedy_equals_vanilla("throwaway_repeat")
    with pytest.raises(AssertionError, match="prompt"):
        assert_greedy_equals_vanilla("throwaway_broken")
    with pytest.raises(AssertionError, match=r"'throwaway_needs_a_checkpoint'.*FileNotFoundError: no head at "
                                             r"/nowhere.*must override Method\.example"):
        assert_greedy_equals_vanilla("throwaway_needs_a_checkpoint")


def test_collected_methods_are_the_registry():
    # the built-in methods are all collected; test doubles registered by test modules (defined under tests.) are not
    builtin = {"vanilla", "pld", "eagle1", "eagle2", "eagle3", "jakiro", "jakiro_star", "medusa", "hydra", "sps"}
    assert builtin <= set(METHOD_NAMES)
    assert all(not METHODS.get(n).__module__.startswith("tests.") for n in METHOD_NAMES)
