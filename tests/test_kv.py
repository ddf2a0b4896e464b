"""KV-cache compaction after a tree forward equals the cache of running the accepted tokens directly."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from harness.engine.kv import compact_cache
from harness.engine.speculative import tree_mask_4d


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


PREFIX = torch.tensor([[3, 14, 15, 9, 26]])  # committed prompt, P = 5
ROOT = 5
TOKENS = torch.tensor([35, 8, 9, 7, 29])  # root -> {35, 8}; 35 -> 9 -> 7; 35 -> 29
PARENTS = torch.tensor([-1, -1, 0, 2, 0])
POSITIONS = torch.tensor([[5, 6, 6, 7, 8, 7]])  # P + depth of each slot, root at P (not P + slot index)


def cache_after_tree(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(PREFIX, cache=cache, use_cache=True)
    ids = torch.cat([torch.tensor([ROOT]), TOKENS])[None]
    mask = tree_mask_4d(PREFIX.shape[1], PARENTS, torch.float32, torch.device("cpu"))
    model(ids, attention_mask=mask, position_ids=POSITIONS, cache=cache, use_cache=True)
    return cache


def direct_cache(model, accepted: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(torch.cat([PREFIX, torch.tensor([[ROOT] + accepted])], dim=1), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("keep, accepted", [
    ([0, 1, 3, 4], [35, 9, 7]),   # the deepest path: slots of nodes 0, 2, 3 (not contiguous after the root)
    ([0, 1, 5], [35, 29]),        # a path through the last sibling
    ([0, 2], [8]),                # the second root child: slot 1 must be skipped
    ([0, 1], [35]),               # a contiguous prefix (the crop fast path)
    ([0], []),                    # nothing accepted: only the root stays
])
def test_compact_cache_equals_running_the_accepted_tokens(keep, accepted):
    # a wrong offset (prev_len), a kept rejected slot, or K/V left behind would break the equality or the length
    model = tiny_model()
    with torch.no_grad():
        cache = cache_after_tree(model)
        compact_cache(cache, PREFIX.shape[1], torch.tensor(keep))
        expected = direct_cache(model, accepted)
    assert cache.get_seq_length() == PREFIX.shape[1] + len(keep)
    for got, want in zip(cache.layers, expected.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)


def test_compacted_cache_continues_like_a_fresh_one():
    # the next forward after compaction must see exactly the committed sequence (same logits as no-cache)
    model = tiny_model()
    with torch.no_grad():
        cache = cache_after_tree(model)
        compact_cache(cache, PREFIX.shape[1], [0, 1, 3])
        nxt = model(torch.tensor([[11]]), cache=cache, use_cache=True).logits[0, -1]
        full = model(torch.cat([PREFIX, torch.tensor([[ROOT, 35, 9, 11]])], dim=1)).logits[0, -1]
    torch.testing.assert_close(nxt, full, atol=1e-5, rtol=1e-5)


def test_compact_cache_rejects_out_of_range_slots():
    # slot 6 does not exist (6 slots: root + 5 nodes): silently keeping garbage would corrupt the cache
    model = tiny_model()
    with torch.no_grad():
        cache = cache_after_tree(model)
    with pytest.raises(ValueError, match="out of range"):
        compact_cache(cache, PREFIX.shape[1], [0, 6])
