"""Layer-skip self-speculation (SWIFT arXiv:2410.06916, Draft & Verify arXiv:2309.08168): the draft pass shares the
target's cache and leaves it as a vanilla forward would, the skipped layers are the option's, the draft with nothing
skipped is the target itself, the confidence stop and the sampled rows are the draft's, and bad options are refused
with one line; SWIFT's confidence tree; the drafts of SWIFT's own code replayed (tests/data/layer_skip_reference.json).
Registry-wide losslessness (greedy, oracle, chi-square, compiled) comes from tests/test_lossless.py,
tests/test_default_model.py and tests/test_runtime.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.tree import CONFIDENCE_WIDTHS, confidence_widths, sibling_tree, tree_from_choices
from harness.registry import get_method
from methods.layer_skip.layer_skip import LayerSkip, LayerSkipOptions, interleaved_skip
from methods.layer_skip.layersearch import (
    bayes_skip,
    gp_ucb,
    matchness,
    random_skip,
    skip_point,
    split_sub_layers,
    sub_layer_ids,
    sub_layer_sets,
    top_layers,
)
from tests.support.anymodel import tiny_causal_lm
from tests.support.helpers import GREEDY, check_generation, sampled_pvalue, tiny_target
from tests.support.reference_layer_skip import comparable_steps, recording

PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def vanilla(target, budget: int) -> list[int]:
    return get_method("vanilla").create(target).generate(PROMPT, budget, GREEDY).token_ids


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


TARGETS = {"llama": lambda: tiny_target(eos=False, layers=4), "mistral-w6": lambda: tiny_causal_lm("mistral", 6),
           "gemma3-w5": lambda: tiny_causal_lm("gemma3", 5)}


@pytest.mark.parametrize("arch, skip", [("llama", [1, 2]), ("llama", [0, 3]), ("llama", []), ("mistral-w6", [1]),
                                        ("gemma3-w5", [0]),
                                        ("llama", {"skip_attn": [1, 2], "skip_mlp": [2, 3]}),
                                        ("llama", {"skip_attn": [0]}),
                                        ("mistral-w6", {"skip_attn": [1], "skip_mlp": [0]}),
                                        ("gemma3-w5", {"skip_attn": [0], "skip_mlp": [1]})])
def test_the_target_cache_after_every_step_is_a_vanilla_forwards(arch, skip):
    """The draft pass writes drafted positions into the kept layers of the target's own cache. Right after propose
    every layer must be back to what it was (same length, same K/V), and after each accepted step the cache must
    equal a fresh full forward over the committed text: a crop by the wrong amount, a draft K/V left in a kept
    layer, or one written into a skipped layer's slot would make verification attend to text that was not emitted.
    Sliding-window layers (Mistral; Gemma 3 mixes them with full ones, and with layer 0 skipped its kept full layer
    must get the full-attention mask and RoPE) hold their last window - 1 positions, as a fresh cache does. A dict
    skips sub-layers: a layer whose attention is skipped writes no draft K/V, and cropping it would cut committed K/V"""
    target = TARGETS[arch]()
    sets = skip if isinstance(skip, dict) else {"skip_layers": skip}
    method = LayerSkip(target, LayerSkipOptions(**sets, k=4, stop_threshold=0.0))
    checks = {"proposals": 0, "steps": 0, "partial": 0}
    propose, accept = method.propose, method.accept
    committed: list[int] = []

    def checked_propose(root, sampling, generator):
        before = layer_kv(method.cache)
        tree = propose(root, sampling, generator)
        assert method.target.model.get_decoder().layers is not method.kept_layers  # the layers are put back
        for (k0, v0), layer in zip(before, method.cache.layers):
            assert torch.equal(k0, layer.keys) and torch.equal(v0, layer.values)
        checks["proposals"] += 1
        return tree

    def checked_accept(tokens, hidden, next_root):
        accept(tokens, hidden, next_root)
        committed.extend(tokens)
        text = PROMPT[0].tolist() + committed
        assert method.committed == len(text)
        fresh = DynamicCache(config=target.model.config)
        target.model(torch.tensor([text]), cache=fresh, use_cache=True)
        for mine, ref in zip(method.cache.layers, fresh.layers):
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-5, atol=1e-5)
        checks["steps"] += 1
        checks["partial"] += 0 < len(tokens) - 1 < 4

    method.propose, method.accept = checked_propose, checked_accept
    gen = method.generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 40, GREEDY).token_ids
    check_generation(gen, method, PROMPT.shape[1], 40)
    assert checks["steps"] > 5 and checks["proposals"] == checks["steps"] + 1, checks
    if arch == "llama" and skip == [1, 2]:
        assert checks["partial"] > 0, checks  # partial accepts happened and were checked


def test_skipping_nothing_drafts_the_targets_own_tokens():
    """With no layer skipped the draft is the target: every chain of k = 4 is accepted whole (1 + 8 x 5 = 41 > 40
    tokens). A draft at the wrong position id, or a mask that hides a committed position or shows a stale one,
    would break this"""
    target = tiny_target(eos=False, layers=3)
    method = get_method("layer_skip").create(target, {"skip_layers": [], "k": 4, "stop_threshold": 0.0})
    gen = method.generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == vanilla(target, 40)
    assert gen.accepted_drafts == [4] * 7 + [4] and gen.draft_depths == [4] * 8
    assert gen.counters["draft_forwards"] == 4 * 8


def test_the_draft_runs_only_the_kept_layers():
    """The draft forwards call the kept decoder layers and no other: with layers 1 and 2 skipped of 4, layers 0 and 3
    run once per draft token and 1, 2 only in the target's prefill and verification forwards"""
    target = tiny_target(eos=False, layers=4)
    method = get_method("layer_skip").create(target, {"skip_layers": [2, 1], "k": 3, "stop_threshold": 0.0})
    assert method.skipped == [1, 2] and method.kept == [0, 3]
    assert method.describe()["skipped_layers"] == [1, 2]
    calls = [0, 0, 0, 0]
    hooks = [layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, layer in enumerate(target.model.get_decoder().layers)]
    try:
        gen = method.generate(PROMPT, 10, GREEDY)
    finally:
        for hook in hooks:
            hook.remove()
    target_forwards = gen.counters["target_forwards"]
    assert calls == [target_forwards + gen.counters["draft_forwards"], target_forwards, target_forwards,
                     target_forwards + gen.counters["draft_forwards"]]


def test_sub_layer_skips_run_the_other_sub_layer_and_both_are_the_whole_layer():
    """skip_attn / skip_mlp swap the named sub-layers for zero updates during the draft forwards only: layer 1's
    attention and layer 2's MLP never run in a draft forward but their other halves do, the verification forwards run
    everything, and the modules are the model's own again afterwards. A layer named in both is skipped whole (its
    decoder layer is not called by the draft), so {attn: [1, 3], mlp: [3]} drafts exactly as skip_layers [3] with
    layer 1's attention skipped. Skipping attention must change the draft (else the stand-in never ran)"""
    target = tiny_target(eos=False, layers=4)
    layers = target.model.get_decoder().layers
    originals = [(layer.self_attn, layer.mlp) for layer in layers]
    method = get_method("layer_skip").create(target, {"skip_attn": [1, 3], "skip_mlp": [2, 3], "k": 3,
                                                      "stop_threshold": 0.0})
    assert method.skipped == [3] and method.kept == [0, 1, 2]
    assert method.attn_only == [1] and method.mlp_only == [2] and method.attending == [0, 2]
    described = method.describe()
    assert (described["skipped_layers"], described["skipped_attention_only"], described["skipped_mlp_only"]) == \
        ([3], [1], [2])
    calls = {(i, part): 0 for i in range(4) for part in ("self_attn", "mlp")}
    hooks = [getattr(layer, part).register_forward_hook(lambda *_, key=(i, part): calls.__setitem__(key,
                                                                                                  calls[key] + 1))
             for i, layer in enumerate(layers) for part in ("self_attn", "mlp")]
    try:
        gen = method.generate(PROMPT, 12, GREEDY)
    finally:
        for hook in hooks:
            hook.remove()
    assert gen.token_ids == vanilla(target, 12)
    target_forwards, drafts = gen.counters["target_forwards"], gen.counters["draft_forwards"]
    assert drafts > 0
    assert calls == {(0, "self_attn"): target_forwards + drafts, (0, "mlp"): target_forwards + drafts,
                     (1, "self_attn"): target_forwards, (1, "mlp"): target_forwards + drafts,
                     (2, "self_attn"): target_forwards + drafts, (2, "mlp"): target_forwards,
                     (3, "self_attn"): target_forwards, (3, "mlp"): target_forwards}
    assert [(layer.self_attn, layer.mlp) for layer in layers] == originals

    whole = get_method("layer_skip").create(target, {"skip_layers": [3], "k": 3, "stop_threshold": 0.0})
    attn_too = get_method("layer_skip").create(target, {"skip_attn": [3], "skip_mlp": [3], "k": 3,
                                                        "stop_threshold": 0.0})
    with_attn = get_method("layer_skip").create(target, {"skip_layers": [3], "skip_attn": [1], "k": 3,
                                                         "stop_threshold": 0.0})
    runs = [m.generate(PROMPT, 24, GREEDY) for m in (whole, attn_too, with_attn)]
    assert runs[0].accepted_drafts == runs[1].accepted_drafts  # both sub-layers = the whole layer
    assert runs[0].accepted_drafts != runs[2].accepted_drafts  # layer 1's attention changed the draft
    assert all(run.token_ids == vanilla(target, 24) for run in runs)


def test_confidence_stop_ends_the_chain():
    """stop_threshold 1.0: no draft token of the random target is that sure, so every chain ends after one token;
    0 never stops early, so every chain is k = 5 long (SWIFT's confidence-aware drafting)"""
    target = tiny_target(eos=False, layers=3)
    sure = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 5, "stop_threshold": 1.0})
    assert set(sure.generate(PROMPT, 20, GREEDY).draft_depths) == {1}
    never = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 5, "stop_threshold": 0.0})
    assert set(never.generate(PROMPT, 20, GREEDY).draft_depths) == {5}


def test_the_confidence_tree_hangs_the_drafts_top_k_beside_its_chain():
    """tree: confidence (SWIFT's): the chain is the chain mode's, and below the chain node of each depth hang the
    draft's top-10 there (width 10 on a random target, never above 0.5 sure), the chain token first. Greedy output
    stays vanilla's and a sibling is accepted at times (with siblings of the wrong depth or rank it never would be);
    the static cache is sized for the 1 + 10 k slots, padded to the compiled runtime's bucket (32)"""
    target = tiny_target(eos=False, layers=3)
    chain = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 3, "stop_threshold": 0.0})
    tree = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 3, "stop_threshold": 0.0,
                                                    "tree": "confidence"})
    assert tree.max_tree_slots == 32 and chain.max_tree_slots == 128
    with torch.inference_mode():
        for method in (chain, tree):
            cache = DynamicCache(config=target.model.config)
            target.model(PROMPT, cache=cache, use_cache=True)
            method.cache, method.committed = cache, PROMPT.shape[1]
        line = chain.propose(17, GREEDY, None).tokens.tolist()
        drafted = tree.propose(17, GREEDY, None)
        assert drafted.parents.tolist() == [-1] * 10 + [0] * 10 + [10] * 10
        assert drafted.tokens[[0, 10, 20]].tolist() == line
        ref = DynamicCache(config=target.model.config)
        target.model(PROMPT, cache=ref, use_cache=True)  # the prompt's K/V are the full model's
        layers = target.model.get_decoder().layers
        target.model.get_decoder().layers = torch.nn.ModuleList([layers[0], layers[2]])
        try:  # [3, V] the skipping model's next tokens after 17, t0, t1
            logits = target.model(torch.tensor([[17] + line[:2]]), cache=ref, use_cache=True).logits[0]
        finally:
            target.model.get_decoder().layers = layers
        assert drafted.tokens.view(3, 10).tolist() == logits.topk(10).indices.tolist()
    gen = tree.generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == vanilla(target, 40)
    check_generation(gen, tree, PROMPT.shape[1], 40)
    assert len(gen.accept_lengths) < len(chain.generate(PROMPT, 40, GREEDY).accept_lengths)  # siblings accepted


def test_sampled_chain_carries_the_drafts_shaped_distribution():
    """At T > 0 row i of draft_probs must be the distribution token i was drawn from: the target with layer 1
    skipped, after the prompt (in the target's cache), the root and the earlier drafts, shaped by temperature and
    top-p. A row off by one position or unshaped biases the rejection rule"""
    target = tiny_target(eos=False, layers=3)
    method = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 3, "stop_threshold": 0.0})
    sampling = SamplingParams(temperature=0.7, top_p=0.9)
    with torch.inference_mode():
        cache = DynamicCache(config=target.model.config)
        target.model(PROMPT, cache=cache, use_cache=True)
        method.cache, method.committed = cache, PROMPT.shape[1]
        tree = method.propose(17, sampling, torch.Generator().manual_seed(0))
        assert method.proposal == "sampled" and tree.parents.tolist() == [-1, 0, 1]
        assert tree.draft_probs.shape == (4, 128) and float(tree.draft_probs[3].sum()) == 0.0
        assert cache.get_seq_length() == PROMPT.shape[1]
        layers = target.model.get_decoder().layers
        for i in range(3):
            ctx = torch.cat([torch.tensor([17]), tree.tokens[:i]])
            ref = DynamicCache(config=target.model.config)
            target.model(PROMPT, cache=ref, use_cache=True)
            target.model.get_decoder().layers = torch.nn.ModuleList([layers[0], layers[2]])
            try:
                logits = target.model(ctx[None], cache=ref, use_cache=True).logits[0, -1]
            finally:
                target.model.get_decoder().layers = layers
            torch.testing.assert_close(tree.draft_probs[i], logits_to_probs(logits, sampling), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)])
@pytest.mark.parametrize("skip", [{"skip_layers": [1]}, {"skip_attn": [1], "skip_mlp": [0]}], ids=["layer", "sub"])
def test_sampling_with_a_layer_skipped_matches_the_target_distribution(sampling, skip):
    """The registry-wide chi-square test runs a 1-layer target (nothing to skip): here a 2-layer one with layer 1
    skipped (or layer 1's attention and layer 0's MLP), so the draft differs from the target and rejections happen;
    the first three tokens must still follow the target's exact joint distribution"""
    target = tiny_target(vocab=8, hidden=16, layers=2, init=0.3, seed=0, tokenizer=False)
    method = get_method("layer_skip").create(target, {**skip, "k": 2, "stop_threshold": 0.0})
    assert sampled_pvalue(method, sampling, 1500) > 1e-3


@pytest.mark.slow
def test_sampling_the_confidence_tree_matches_the_target_distribution():
    """tree: confidence at T > 0 draws each depth's candidates without replacement from the draft and carries that
    distribution on the chain node above them; a row on the wrong node, or a sibling not among the first draws,
    would bias the engine's rejection rule and the first three tokens' joint distribution"""
    target = tiny_target(vocab=8, hidden=16, layers=2, init=0.3, seed=0, tokenizer=False)
    method = get_method("layer_skip").create(target, {"skip_layers": [1], "k": 2, "stop_threshold": 0.0,
                                                      "tree": "confidence"})
    assert sampled_pvalue(method, SamplingParams(temperature=1.0), 1500) > 1e-3


def test_interleaved_pattern():
    """skip_ratio spreads round(ratio * L) skipped layers over 1 .. L - 2; SWIFT's initial set for a 30-layer model
    is every other layer 1, 3, ..., 27"""
    assert interleaved_skip(30, 0.45) == list(range(1, 28, 2))
    assert interleaved_skip(30, 0.2) == [1, 5, 10, 15, 19, 24]
    assert interleaved_skip(30, 0.0) == [] and interleaved_skip(2, 0.5) == [1] and interleaved_skip(1, 0.5) == []
    assert interleaved_skip(4, 0.9) == [1, 2]  # never more than the middle layers
    target = tiny_target(eos=False, layers=4)
    assert get_method("layer_skip").create(target, {}).skipped == [1, 2]  # default ratio 0.45: round(1.8) = 2


@pytest.mark.parametrize("options, message", [
    ({"skip_layers": [1, 4]}, r"option skip_layers: layer 4 does not exist, the target has 4 decoder layers \(0..3\)"),
    ({"skip_layers": [0, 1, 2, 3]}, "skips all 4 decoder layers; keep at least one"),
    ({"skip_layers": [1, 1]}, r"skip_layers names a layer twice: \[1, 1\]"),
    ({"skip_layers": [-1]}, "skip_layers must be layer indices >= 0, got -1"),
    ({"skip_layers": ["a"]}, r"option skip_layers\[0\]: expected an integer"),
    ({"skip_layers": [1], "skip_ratio": 0.5}, "give skip_layers or skip_ratio, not both"),
    ({"skip_ratio": 1.0}, r"skip_ratio must be in \[0, 1\), got 1.0"),
    ({"k": 0}, r"k must be an integer in \[1, 127\]"),
    ({"k": 128}, r"k must be an integer in \[1, 127\]"),
    ({"stop_threshold": 1.5}, r"stop_threshold must be in \[0, 1\], got 1.5"),
    ({"search": "bayes"}, "search must be one of off, persist, per_turn, got 'bayes'"),
    ({"search_window": 0}, "search_window must be >= 1, got 0"),
    ({"search_bayes_every": -1}, "search_bayes_every must be >= 0, got -1"),
    ({"search_score": 0.0}, r"search_score must be in \(0, 1\], got 0.0"),
    ({"tree": "eagle"}, "tree must be one of chain, confidence, got 'eagle'"),
    ({"skip_attn": [4]}, r"option skip_attn: layer 4 does not exist, the target has 4 decoder layers \(0..3\)"),
    ({"skip_mlp": [0, 0]}, r"skip_mlp names a layer twice: \[0, 0\]"),
    ({"skip_attn": [1], "skip_ratio": 0.5}, "give skip_attn or skip_ratio, not both"),
    ({"skip_layers": [1], "skip_mlp": [1, 2]}, "skip_mlp names layer 1, which skip_layers skips whole"),
    ({"skip_attn": [1], "search": "persist"}, "search_space: layers moves whole layers; skip_attn and skip_mlp need "
                                              "search_space: sub_layers"),
    ({"search_space": "heads"}, "search_space must be one of layers, sub_layers, got 'heads'"),
    ({"skip_attn": [0], "search": "persist", "search_space": "sub_layers"},
     r"search_space: sub_layers: the initial set's layer 0 is not searchable: sub-layers of layers 1..2 only"),
    ({"skip_layers": [0], "skip_attn": [1, 2, 3]}, "skip_attn skips the attention of every layer the draft keeps"),
])
def test_bad_options_are_refused_with_one_line(options, message):
    target = tiny_target(eos=False, layers=4)
    with pytest.raises(OptionsError, match=r"method 'layer_skip': .*" + message):
        get_method("layer_skip").create(target, options)


@pytest.mark.slow
def test_published_defaults_equal_vanilla_on_the_default_model(real_target, vanilla_reference):
    """The registry-wide default-model test builds Method.example (k 5, no confidence stop); the published defaults
    (SWIFT's interleaved 14 of 30 layers, k 25, stop 0.8) must give vanilla's greedy tokens on the real model (fp32)
    too, with drafts that accept something (a draft that never matches would hide a broken draft pass)"""
    prompt = real_target.render_chat([{"role": "user", "content": "List three facts about the moon."}])
    method = get_method("layer_skip").create(real_target, {})
    assert method.skipped == list(range(1, 28, 2))
    gen = method.generate(prompt, 40, GREEDY)
    assert gen.token_ids == vanilla_reference(prompt, 40)
    check_generation(gen, method, prompt.shape[1], 40)
    assert sum(gen.accepted_drafts) > 0


def test_the_confidence_stop_costs_one_host_read_per_draft_token():
    """Without the stop a step makes the engine's one transfer only (tests/test_syncs.py); with it, each draft
    token but the k-th of a full chain reads its top-1 probability once (SWIFT's stop needs the value on the host).
    More reads would mean a per-layer or per-row sync crept into the draft pass"""
    from harness.measure.syncs import StepSyncProbe

    target = tiny_target(eos=False, layers=4, init=0.3)  # peaked enough for top-1 probabilities around 0.1
    method = get_method("layer_skip").create(target, {"skip_layers": [1, 2], "k": 3, "stop_threshold": 0.1})
    with StepSyncProbe(target.model) as probe:
        gen = method.generate(PROMPT, 24, GREEDY)
    assert probe.events["__float__"] == sum(min(depth, 2) for depth in gen.draft_depths)
    assert set(gen.draft_depths) == {1, 2, 3}  # the stop ended some chains early, not all


# ---- SWIFT's layer set search (arXiv:2410.06916 Sec. 4.1) -----------------------------------------------------------

def test_search_maths_on_literal_inputs():
    """Matchness is the share of equal next tokens; a set is the one-hot point of its skipped layers; a point is read
    back as its n largest coordinates; the GP's upper confidence bound is near each scored point's score plus a
    little uncertainty and, far from every point, the scores' mean + 2.5 x their std. A wrong normalisation or a
    kernel that ignored distance would move these numbers"""
    assert matchness(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 0, 3, 0])) == 0.5
    assert skip_point([1, 3], [1, 2, 3, 4]).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert top_layers(torch.tensor([0.1, 0.9, 0.3, 0.8]), [1, 2, 3, 4], 2) == [2, 4]
    ucb = gp_ucb(torch.tensor([[0.0], [1.0]]), torch.tensor([0.0, 1.0]), torch.tensor([[0.0], [1.0], [10.0]]))
    torch.testing.assert_close(ucb, torch.tensor([0.1301, 1.1186, 1.7500]), rtol=0, atol=1e-4)
    drawn = random_skip([1, 2, 3, 4, 5], 3, torch.Generator().manual_seed(0))
    assert len(set(drawn)) == 3 and set(drawn) <= {1, 2, 3, 4, 5} and drawn == sorted(drawn)
    # a GP that saw [2, 4] score 0.9 and the others 0.1-0.2 proposes [2, 4] again
    layers = [1, 2, 3, 4]
    points = torch.stack([skip_point(s, layers) for s in ([1, 2], [3, 4], [2, 4])])
    assert bayes_skip(points, torch.tensor([0.1, 0.2, 0.9]), layers, 2, torch.Generator().manual_seed(0)) == [2, 4]


def test_sub_layer_coordinates_are_swifts():
    """SWIFT's point of a sub-layer set (hemingkx/SWIFT@88caed7 get_next_point_to_probe): layer l's attention at
    l - 1 and its MLP at L - 2 + l - 1 over layers 1 .. L - 2; a whole layer is both. Off by one here would search
    or record other sub-layers than SWIFT's"""
    assert sub_layer_ids([2], [1], [3], 5) == [0, 1, 4, 5]
    assert sub_layer_sets([0, 1, 4, 5], 5) == ([2], [1], [3])
    assert split_sub_layers({1, 2}, {2, 3}) == ([2], [1], [3])  # the options' sets read the same way
    assert sub_layer_ids(list(range(1, 28, 2)), [], [], 30) == [i - 1 for i in range(1, 28, 2)] + \
        [27 + i for i in range(1, 28, 2)]  # SWIFT's initial set on a 30-layer model: 28 of the 56
    assert sub_layer_sets([], 5) == ([], [], [])
    with pytest.raises(ValueError, match=r"layer 4 is not searchable: sub-layers of layers 1..3 only"):
        sub_layer_ids([], [4], [], 5)


def identity_layers_target(identity: tuple[int, ...], attn: tuple[int, ...] = (), mlp: tuple[int, ...] = ()):
    """A 6-layer tiny target whose layers ``identity`` add nothing to the residual stream (zero attention output
    and MLP down projections), nor the attention of the layers ``attn`` nor the MLP of ``mlp``: skipping exactly
    those drafts the target's own tokens."""
    target = tiny_target(eos=False, layers=6, init=0.3)
    layers = target.model.get_decoder().layers
    for i in set(identity) | set(attn):
        torch.nn.init.zeros_(layers[i].self_attn.o_proj.weight)
    for i in set(identity) | set(mlp):
        torch.nn.init.zeros_(layers[i].mlp.down_proj.weight)
    return target


def test_search_finds_the_planted_identity_layers():
    """Layers 2 and 4 are identities: skipping them is the target itself (matchness 1), any other pair of layers
    1..4 is not. Started from [1, 3], the search (window 8, seed 0) replaces it at step 10 by its first candidate
    and finds [2, 4] at its 18th, above search_score, and stops; the output stays vanilla's, the record says which
    set drafted from which step, and the next turn of a persistent search starts from the found set without
    searching again"""
    target = identity_layers_target((2, 4))
    method = get_method("layer_skip").create(target, {"skip_layers": [1, 3], "k": 4, "stop_threshold": 0.0,
                                                      "search": "persist", "search_window": 8})
    gen = method.generate(PROMPT, 60, GREEDY)
    assert gen.token_ids == vanilla(target, 60)
    assert gen.method_notes == {
        "skipped_layers": [1, 3],
        "layer_set_changes": [{"step": 10, "skipped_layers": [1, 2], "matchness": 0.125},
                              {"step": 27, "skipped_layers": [2, 4], "matchness": 1.0}],
        "search_iterations": 18, "search_best_matchness": 1.0, "search_done": True}
    assert gen.counters["search_forwards"] == 18 and method.skipped == [2, 4]
    assert set(gen.accepted_drafts[27:]) == {4}  # the found set drafts the target's tokens: every chain accepted
    again = method.generate(PROMPT, 20, GREEDY)
    assert again.method_notes["skipped_layers"] == [2, 4] and again.method_notes["layer_set_changes"] == []
    assert "search_forwards" not in again.counters
    assert method.describe()["skipped_layers"] == [1, 3] and method.describe()["order_dependent"] is True


def test_the_sub_layer_search_finds_the_planted_identity_sub_layers():
    """search_space: sub_layers is SWIFT's space: layer 2's attention and layer 3's MLP add nothing, so skipping
    exactly those two sub-layers drafts the target itself and no other pair of the 8 sub-layers of layers 1..4 does.
    Started from layer 1's attention and layer 4's MLP, the search (window 8, seed 0) must find them, record the set
    as attention-only and MLP-only layers, stop, and keep vanilla's output. With no set given a candidate skips
    SWIFT's int(2 (L - 2) x 0.45) = 3 of the 8"""
    target = identity_layers_target((), attn=(2,), mlp=(3,))
    method = get_method("layer_skip").create(target, {"skip_attn": [1], "skip_mlp": [4], "k": 4, "stop_threshold": 0.0,
                                                      "search": "persist", "search_space": "sub_layers",
                                                      "search_window": 8})
    assert method.candidate_size == 2 and method.searchable == list(range(8))
    gen = method.generate(PROMPT, 120, GREEDY)
    assert gen.token_ids == vanilla(target, 120)
    notes = gen.method_notes
    assert (notes["skipped_layers"], notes["skipped_attention_only"], notes["skipped_mlp_only"]) == ([], [1], [4])
    assert notes["search_done"] and notes["search_best_matchness"] == 1.0
    assert notes["layer_set_changes"][-1] == {"step": notes["layer_set_changes"][-1]["step"], "skipped_layers": [],
                                              "skipped_attention_only": [2], "skipped_mlp_only": [3],
                                              "matchness": 1.0}
    assert (method.skipped, method.attn_only, method.mlp_only) == ([], [2], [3])
    assert gen.counters["search_forwards"] == notes["search_iterations"] > 1
    last = notes["layer_set_changes"][-1]["step"]
    assert set(gen.accepted_drafts[last:]) == {4}  # the found set is the target: every chain accepted
    default = get_method("layer_skip").create(target, {"search": "persist", "search_space": "sub_layers"})
    assert default.skipped == [1, 2, 3] and default.candidate_size == 3  # int(8 * 0.45); the initial set is 6 of 8


def test_a_per_turn_search_starts_each_turn_from_the_initial_set():
    """search=per_turn: every turn starts from skip_layers and searches afresh, so two identical turns draft and
    record identically (the run does not depend on the order of its questions)"""
    target = identity_layers_target((2, 4))
    method = get_method("layer_skip").create(target, {"skip_layers": [1, 3], "k": 4, "stop_threshold": 0.0,
                                                      "search": "per_turn", "search_window": 8})
    first, second = method.generate(PROMPT, 60, GREEDY), method.generate(PROMPT, 60, GREEDY)
    assert first.method_notes == second.method_notes and first.accepted_drafts == second.accepted_drafts
    assert first.method_notes["skipped_layers"] == [1, 3] and method.describe()["order_dependent"] is False


def test_the_search_leaves_the_targets_cache_as_vanilla_would():
    """Candidates are scored in a copy of the prompt's cache: the engine's cache after every step must still be a
    fresh forward's over the committed text (as in the fixed-set test above), on a sliding-window target too, and
    with SWIFT's sub-layer space (a candidate that skips a layer's attention writes no K/V there to crop)"""
    for target, sets in ((tiny_target(eos=False, layers=4), {"skip_layers": [1]}),
                         (tiny_causal_lm("mistral", 6), {"skip_layers": [1]}),
                         (tiny_target(eos=False, layers=4), {"skip_attn": [1], "search_space": "sub_layers"})):
        method = get_method("layer_skip").create(target, {**sets, "k": 3, "stop_threshold": 0.0,
                                                          "search": "per_turn", "search_window": 4, "search_score": 1.0,
                                                          "search_bayes_every": 3})
        accept, committed = method.accept, []

        def checked_accept(tokens, hidden, next_root, method=method, accept=accept, committed=committed,
                           target=target):
            accept(tokens, hidden, next_root)
            committed.extend(tokens)
            fresh = DynamicCache(config=target.model.config)
            target.model(torch.tensor([PROMPT[0].tolist() + committed]), cache=fresh, use_cache=True)
            for mine, ref in zip(method.cache.layers, fresh.layers):
                torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-5)

        method.accept = checked_accept
        gen = method.generate(PROMPT, 40, GREEDY)
        assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 40, GREEDY).token_ids
        assert gen.counters["search_forwards"] > 3  # the search ran, Bayesian candidates included


def test_the_search_without_a_layer_to_move_is_refused():
    target = tiny_target(eos=False, layers=4)
    with pytest.raises(OptionsError, match=r"method 'layer_skip': option search moves the skipped layers among "
                                           r"layers 1..2 .*skip between 1 and 2 layers, got 0"):
        get_method("layer_skip").create(target, {"skip_layers": [], "search": "persist"})


# ---- against SWIFT's own code (tests/data/layer_skip_reference.json, tests/support/reference_layer_skip.py) ---------

def swift_reference() -> dict:
    return json.loads((Path(__file__).parent / "data" / "layer_skip_reference.json").read_text())


def test_the_confidence_tree_is_swifts_choices():
    """SWIFT's get_choices_list (hemingkx/SWIFT@88caed7, recorded on literal confidences, greedy and sampled) and
    the harness's confidence_widths + sibling_tree must give the same tree, node for node in the same order: a band
    edge taken as >= instead of >, a width off by one or a sibling below the wrong node would verify another tree"""
    for case in swift_reference()["choices"]:
        for mode in ("greedy", "sampled"):
            parents, ranks = tree_from_choices(case[mode])
            widths = confidence_widths(case["confidences"], CONFIDENCE_WIDTHS[mode])
            ranked = [[100 * d + r for r in range(10)] for d in range(len(widths))]
            tokens, mine, _ = sibling_tree(ranked, widths)
            assert mine == parents.tolist()
            assert [t % 100 for t in tokens] == ranks.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("sets", ["layers", "sub_layers"])
def test_drafts_as_swifts_own_code_on_the_default_model(real_target, shape, sets):
    """The chain SWIFT's swift_draft drafted at each step and the draft tokens its verification accepted (the same
    skipped layers, k 25, stop 0.8, greedy; the bare chain, and SWIFT's confidence tree, here tree: confidence) on
    two MT-bench turns of the default model, recorded by tests/support/reference_layer_skip.py: the harness must draft
    and accept the same at every step the budget does not shorten. A different chain means the draft pass sees other
    K/V, positions or layers than SWIFT's; a different accepted count with the same chain, another tree or rule.
    ``sub_layers``: one turn with different attention and MLP sets (SWIFT's set_skip_layers(attn, mlp), the harness's
    skip_attn / skip_mlp): a sub-layer skipped otherwise than SWIFT's residual pass-through would change the chains"""
    ref = swift_reference()
    chosen = ({"skip_layers": ref["skip_layers"]} if sets == "layers"
              else {"skip_attn": ref["sub_layers"]["skip_attn"], "skip_mlp": ref["sub_layers"]["skip_mlp"]})
    method = get_method("layer_skip").create(real_target, {
        **chosen, "k": ref["k"], "stop_threshold": ref["stop_threshold"],
        "tree": "confidence" if shape == "tree" else "chain"})
    chains: list[list[int]] = []
    method.propose = recording(method.propose, chains)
    for row in ref["rows"] if sets == "layers" else ref["sub_layers"]["rows"]:
        chains.clear()
        gen = method.generate(torch.tensor([row["prompt"]]), ref["tokens"], GREEDY)
        assert gen.token_ids == row["vanilla"]
        theirs, accepted = row[f"swift_{shape}_chains"], row[f"swift_{shape}_accepted"]
        steps = comparable_steps(chains, theirs, accepted, ref["tokens"])
        assert steps > 10
        assert chains[:steps] == theirs[:steps]
        assert [a - 1 for a in gen.accept_lengths[1:steps + 1]] == accepted[:steps]
