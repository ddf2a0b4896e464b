"""Option ``draft_window`` of the head drafters (eagle1, eagle2, eagle3, jakiro, jakiro_star): the draft attends to
the last W positions
(harness/engine/draftcache.py). The masks and the trimmed KV on literal inputs; with W at least the context the
drafts are the windowless ones exactly; a smaller W changes exactly the draft positions whose context exceeds it;
the output stays vanilla's (the target verifies every draft)."""

from __future__ import annotations

import pytest
import torch

from harness.engine.draftcache import DraftCache, DraftKV, default_draft_mask
from harness.engine.method import OptionsError
from harness.registry import get_method
from harness.run.config import ConfigError, config_from_dict
from methods.vanilla import Vanilla
from tests.support.helpers import GREEDY, check_generation, tiny_target

CPU = torch.device("cpu")
PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]])  # 17 tokens
N_NEW = 24
HEAD_METHODS = ["eagle1", "eagle2", "eagle3", "jakiro", "jakiro_star"]
DYNAMIC = {"total_tokens": 8, "depth": 2, "top_k": 3}
STATIC = {"tree": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}  # the static trees of eagle1 and jakiro_star
SMALL = {"eagle1": STATIC, "jakiro_star": STATIC}


def _rows(mask: torch.Tensor) -> list[list[int]]:
    return mask.int().tolist()


def test_the_window_mask_literal():
    """Three new positions after one in the KV, window 2: each sees itself and the one before it. A mask that kept
    the causal lower triangle would let the last row see column 0; one off by one would show a window of 1 or 3.
    A window at least the positions in play is the causal mask (the windowless draft, exactly)."""
    assert _rows(default_draft_mask(3, 1, CPU, window=2)) == [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert _rows(default_draft_mask(2, 1, CPU)) == [[1, 1, 0], [1, 1, 1]]
    for window in (4, 5, 100):
        assert torch.equal(default_draft_mask(3, 1, CPU, window=window), default_draft_mask(3, 1, CPU))


def _kv(positions: list[int]) -> DraftKV:
    """A KV whose keys hold their own positions (values: their negatives), one head of width 1."""
    keys = torch.tensor(positions, dtype=torch.float).view(1, 1, -1, 1)
    return DraftKV(keys, -keys)


def test_the_cache_keeps_the_last_window_positions():
    """Window 2: after the prompt's 3 pairs the stable KV holds positions 1 and 2 (``length`` counts 3, so the next
    pairs sit at positions 3 and 4), tree nodes see those 2 columns, and the next pending block's mask sees
    (position - 2, position]. Without a window nothing is dropped. A cache that trimmed to W - 1, or counted
    positions by what it holds, would shift every later position."""
    cache = DraftCache(window=2)
    cache.reset(torch.tensor([[10, 11, 12]]), torch.zeros(3, 4))
    _, tokens, pos = cache.pending(13)
    assert tokens.tolist() == [11, 12, 13] and pos.tolist() == [0, 1, 2]
    assert _rows(cache.pending_mask(CPU)) == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    cache.advance(_kv([0, 1, 2]))
    assert (cache.length, cache.kv_length) == (3, 2) and cache.kv.keys.flatten().tolist() == [1.0, 2.0]
    assert cache.kv.values.flatten().tolist() == [-1.0, -2.0]
    assert _rows(cache.stable_columns(2, CPU)) == [[1, 1], [1, 1]]
    cache.commit([13, 14], torch.zeros(2, 4))
    _, tokens, pos = cache.pending(15)
    assert tokens.tolist() == [14, 15] and pos.tolist() == [3, 4]
    assert _rows(cache.pending_mask(CPU)) == [[0, 1, 1, 0], [0, 0, 1, 1]]  # columns: positions 1, 2, 3, 4
    new = _kv([3, 4])
    cache.advance(cache.kv.extend(new.keys, new.values))
    assert (cache.length, cache.kv.keys.flatten().tolist()) == (5, [3.0, 4.0])
    full = DraftCache()
    full.reset(torch.tensor([[10, 11, 12]]), torch.zeros(3, 4))
    full.advance(_kv([0, 1, 2]))
    assert (full.length, full.kv_length) == (3, 3)


def test_draft_kv_tail_literal():
    kv = _kv([0, 1, 2, 3])
    assert kv.tail(2).keys.flatten().tolist() == [2.0, 3.0] and kv.tail(9) is kv and kv.tail(0).length == 0
    with pytest.raises(ValueError, match="length must be >= 0"):
        kv.tail(-1)


def test_a_bad_window_is_refused_by_name():
    target = tiny_target()
    with pytest.raises(OptionsError, match="method 'eagle2': option draft_window: expected an integer, got 'x'"):
        get_method("eagle2").create(target, {"draft_window": "x"})
    with pytest.raises(OptionsError, match=r"draft_window must be an integer >= 0 .* got -3"):
        get_method("eagle3").example(target, draft_window=-3)
    for name in ("eagle1", "jakiro_star"):  # the static-tree methods check it at configuration time too
        with pytest.raises(OptionsError, match=rf"method '{name}': draft_window must be an integer >= 0 .* got -1"):
            get_method(name).create(target, {"draft_window": -1})


def _drafting(name: str, target, window: int):
    """The method's greedy turn, every tree it proposed (tokens, parents) and every draft attention output
    ``[S, H]`` (the stable forwards and the tree forwards, in order)."""
    method = get_method(name).example(target, **SMALL.get(name, DYNAMIC), draft_window=window)
    trees, outputs = [], []
    propose = method.propose

    def recorded(root, sampling, generator):
        tree = propose(root, sampling, generator)
        trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    method.propose = recorded
    attention = method.head.midlayer.self_attn if name == "eagle3" else method.head.layers[0].self_attn
    hook = attention.register_forward_hook(lambda module, args, out: outputs.append(out[0][0].clone()))
    try:
        gen = method.generate(PROMPT, N_NEW, GREEDY)
    finally:
        hook.remove()
    return method, gen, trees, outputs


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_a_window_at_least_the_context_drafts_exactly_as_without(name):
    """W = 64 >= the whole turn's context (17 + 24 tokens + a tree): the same trees and bitwise the same draft
    attention outputs as W = 0, and the same KV length. A window rule that touched the mask or the KV below its
    size (an off-by-one trim, a mask built another way) would change a float somewhere here."""
    target = tiny_target(vocab=64, tokenizer=False)
    _, plain, trees, outputs = _drafting(name, target, 0)
    method, windowed, trees_w, outputs_w = _drafting(name, target, 64)
    assert trees_w == trees and len(outputs_w) == len(outputs)
    assert all(torch.equal(a, b) for a, b in zip(outputs, outputs_w))
    assert windowed.token_ids == plain.token_ids and windowed.accept_lengths == plain.accept_lengths
    assert method.cache.kv_length == method.cache.length


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_a_small_window_changes_only_the_positions_past_it_and_stays_lossless(name):
    """W = 4 on a 17-token prompt: in the first draft forward (the prompt's positions 0..16) the rows of positions
    0..3, whose context is at most 4, are bitwise the windowless ones and every later row differs; the stable KV
    never holds more than 4 positions (the draft's cost stops growing); the output is vanilla's."""
    target = tiny_target(vocab=64, tokenizer=False)
    _, _, _, outputs = _drafting(name, target, 0)
    method, gen, _, outputs_w = _drafting(name, target, 4)
    first, first_w = outputs[0], outputs_w[0]  # [17, H] each
    assert first.shape[0] == PROMPT.shape[1]
    assert torch.equal(first[:4], first_w[:4])
    assert all(not torch.allclose(first[i], first_w[i]) for i in range(4, PROMPT.shape[1]))
    assert method.cache.kv_length == 4 and method.cache.length > 4
    assert gen.token_ids == Vanilla(target).generate(PROMPT, N_NEW, GREEDY).token_ids
    check_generation(gen, method, PROMPT.shape[1], N_NEW)


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_the_heads_own_kv_bytes_literal(name):
    """The tiny target's heads have one layer with 2 kv heads of width 8 in float32: 2 x 1 x 2 x 8 x 4 = 128 bytes
    per position, all of them without a window, the last 4 with ``draft_window`` 4; a method without a draft head
    keeps none (None, not 0)."""
    target = tiny_target(vocab=64, tokenizer=False)
    options = SMALL.get(name, DYNAMIC)
    assert get_method(name).example(target, **options).draft_kv_bytes(1000) == 128 * 1000
    assert get_method(name).example(target, **options, draft_window=4).draft_kv_bytes(1000) == 128 * 4
    assert Vanilla(target).draft_kv_bytes(1000) is None and get_method("pld").create(target).draft_kv_bytes(9) is None


def test_the_window_and_the_stop_options_are_sweep_knobs():
    """``--sweep eagle3.draft_window=0,16`` (or a preset's ``sweep:``) makes one labelled entry per value, and a bad
    value fails at configuration time naming the sweep field; max_spec_context sweeps the same way."""
    base = {"methods": ["vanilla", {"name": "eagle3", "options": {"total_tokens": 16}}]}
    cfg = config_from_dict({**base, "sweep": {"eagle3": {"draft_window": [0, 16], "max_spec_context": [0, 2048]}}})
    assert [m.label for m in cfg.methods] == [
        "vanilla", "eagle3[draft_window=0,max_spec_context=0]", "eagle3[draft_window=0,max_spec_context=2048]",
        "eagle3[draft_window=16,max_spec_context=0]", "eagle3[draft_window=16,max_spec_context=2048]"]
    with pytest.raises(ConfigError, match=r"run\.sweep\.eagle3\.draft_window=-2: draft_window must be an integer"):
        config_from_dict({**base, "sweep": {"eagle3": {"draft_window": [-2]}}})


@pytest.mark.slow
def test_a_small_window_on_the_default_model_keeps_vanilla_output(real_target, vanilla_reference):
    """The shipped EAGLE-3 head of SmolLM2-135M with an 8-position window on a 37-token chat prompt: every draft
    position past the 8th sees less than it was trained on, and the greedy output is still vanilla's."""
    prompt = real_target.render_chat([{"role": "user", "content": "List three facts about the moon."}])
    method = get_method("eagle3").create(real_target, {"total_tokens": 12, "depth": 4, "top_k": 4, "draft_window": 8})
    gen = method.generate(prompt, 32, GREEDY)
    assert gen.token_ids == vanilla_reference(prompt, 32)
    assert method.cache.kv_length == 8
    check_generation(gen, method, prompt.shape[1], 32)
