"""draftbench's ``sdpa_gqa`` attention (harness.models.sdpa_gqa_attention): a masked forward of a grouped-query
model gives transformers' ``sdpa`` result bit for bit without copying the K/V heads, and ``auto`` loads it."""

from __future__ import annotations

import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers import DynamicCache

from harness.engine.speculative import tree_mask_4d
from harness.models import SDPA_GQA, load_target, register_attention
from tests.support.anymodel import tiny_causal_lm
from tests.support.helpers import char_tokenizer


def _masked_verify_logits(target, monkeypatch) -> tuple[torch.Tensor, int]:
    """Logits of a 5-slot tree verification (parents [-1, -1, 0, 0, 2]) after a 7-token prefix, with the engine's
    4D mask; and how many times transformers' ``repeat_kv`` copied K/V heads during the tree forward."""
    model = target.model
    cache = DynamicCache(config=model.config)
    calls = []
    with torch.inference_mode():
        model(torch.tensor([[5, 9, 13, 17, 21, 25, 29]]), past_key_values=cache, use_cache=True)
        mask = tree_mask_4d(7, torch.tensor([-1, -1, 0, 0, 2]), torch.float32, torch.device("cpu"))  # [1, 1, 6, 13]
        real = hf_sdpa.repeat_kv
        monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
        out = model(torch.tensor([[3, 8, 40, 41, 12, 50]]), past_key_values=cache, attention_mask=mask,
                    position_ids=torch.tensor([[7, 8, 8, 9, 9, 10]]), use_cache=True)
        monkeypatch.setattr(hf_sdpa, "repeat_kv", real)
    return out.logits, len(calls)


def test_masked_gqa_forward_is_exact_and_copies_no_kv(monkeypatch):
    """A tiny Llama with 4 query heads over 2 KV heads: under the tree mask, sdpa_gqa must give transformers' sdpa
    logits exactly (same kernel, same sums; a difference would change greedy outputs against vanilla) and must
    never call repeat_kv (sdpa calls it for K and for V in each of the 2 layers: the copies this backend exists
    to avoid)."""
    ref, ref_copies = _masked_verify_logits(tiny_causal_lm("llama", attn="sdpa"), monkeypatch)
    new, new_copies = _masked_verify_logits(tiny_causal_lm("llama", attn=SDPA_GQA), monkeypatch)
    assert (ref_copies, new_copies) == (4, 0)
    assert ref.shape == (1, 6, 64)
    assert torch.equal(new, ref)


def test_auto_loads_sdpa_gqa_and_explicit_names_stay(tmp_path):
    """``attn_implementation: auto`` must load draftbench's sdpa_gqa where transformers would pick sdpa (else the
    default runs keep copying the K/V cache per verification), while an explicit ``sdpa`` keeps transformers'
    own function (the before/after comparison and anyone who wants it exactly)."""
    register_attention()
    target = tiny_causal_lm("llama")
    target.model.save_pretrained(tmp_path / "llama")
    char_tokenizer().save_pretrained(tmp_path / "llama")
    auto = load_target(str(tmp_path / "llama"), "float32", "cpu")
    explicit = load_target(str(tmp_path / "llama"), "float32", "cpu", attn_implementation="sdpa")
    assert (auto.model.config._attn_implementation, explicit.model.config._attn_implementation) == ("sdpa_gqa", "sdpa")
