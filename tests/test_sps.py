"""SpS (speculative sampling with a draft model; arXiv:2211.17192, arXiv:2302.01318): the draft's own cache stays equal
to the committed text, the proposal rows are the draft's shaped distribution, the chain-length schedule is
transformers' heuristic (Spec-Bench's SpS), a draft of another tokenizer is refused, and a draft loads from a folder
with the target's dtype. Losslessness (greedy, oracle, chi-square) comes from tests/test_lossless.py."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.models import target_from_model
from harness.registry import get_method
from methods.sps import Sps, SpsOptions
from tests.support.anymodel import tiny_causal_lm
from tests.support.helpers import GREEDY, char_tokenizer, check_generation, install_oracle, tiny_llama, tiny_target

PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def truncated_draft(target, layers: int = 1):
    """The target's first ``layers`` decoder layers with its embedding, final norm and lm_head: a draft that agrees
    with the target often but not always (partial accepts, the case a cache crop can get wrong)."""
    model = tiny_llama(vocab_size=target.config.vocab_size, seed=0, layers=target.config.num_hidden_layers,
                       special_ids=target.tokenizer is not None)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return target_from_model(model, target.tokenizer, name="truncated-draft")


def test_the_draft_cache_is_the_committed_text_after_every_step():
    """After each verification the draft's cache must hold exactly the committed tokens it has run (its keys equal
    to a fresh forward over them) and the rest must be pending: a crop by the wrong amount, or a rejected draft
    left in the cache, would shift every later draft position and make the draft see text that was not emitted"""
    target = tiny_target(eos=False, layers=3)
    method = Sps(target, SpsOptions(k=4, schedule="constant"), draft=truncated_draft(target))
    committed: list[int] = []
    checks = {"steps": 0, "partial": 0}
    accept = method.accept

    def checked_accept(tokens, hidden, next_root):
        accept(tokens, hidden, next_root)
        committed.extend(tokens)
        text = PROMPT[0].tolist() + committed
        held = method.cache.get_seq_length()
        assert held + method.pending.shape[0] == len(text)
        assert method.pending.tolist() == text[held:]
        fresh = DynamicCache(config=method.draft.model.config)
        method.draft.model(torch.tensor([text[:held]]), cache=fresh, use_cache=True)
        for mine, ref in zip(method.cache.layers, fresh.layers):
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-5, atol=1e-5)
        checks["steps"] += 1
        checks["partial"] += 0 < len(tokens) - 1 < 4

    method.accept = checked_accept
    gen = method.generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 40, GREEDY).token_ids
    check_generation(gen, method, PROMPT.shape[1], 40)
    assert checks["steps"] > 5 and checks["partial"] > 0, checks  # partial accepts happened and were checked


def test_sampled_chain_carries_the_drafts_shaped_distribution():
    """At T > 0 row i of draft_probs must be the distribution token i was drawn from: the draft's logits after
    prompt + root + the earlier drafts, with the run's temperature and top-p. A row off by one position or
    without the sampling shape makes the rejection rule biased (the chi-square test in test_lossless.py)"""
    target = tiny_target(eos=False)
    method = get_method("sps").example(target, seed=3, k=3, schedule="constant")
    sampling = SamplingParams(temperature=0.7, top_p=0.9)
    with torch.inference_mode():
        method.begin(PROMPT, None)
        tree = method.propose(17, sampling, torch.Generator().manual_seed(0))
        assert method.proposal == "sampled" and tree.parents.tolist() == [-1, 0, 1]
        assert tree.draft_probs.shape == (4, 128) and float(tree.draft_probs[3].sum()) == 0.0
        for i in range(3):
            ctx = torch.cat([PROMPT[0], torch.tensor([17]), tree.tokens[:i]])[None]
            q = logits_to_probs(method.draft.model(ctx).logits[0, -1], sampling)
            torch.testing.assert_close(tree.draft_probs[i], q, rtol=1e-5, atol=1e-6)
            assert float(q[tree.tokens[i]]) > 0
        method.begin(PROMPT, None)
        assert method.propose(17, GREEDY, None).draft_probs is None and method.proposal == "deterministic"


@pytest.mark.parametrize("schedule, depths", [
    ("heuristic", [5, 7, 9, 11, 13]),           # transformers' heuristic: +2 after a fully accepted chain
    ("constant", [5, 5, 5, 5, 5, 5, 5]),        # 1 + 6 x 6 tokens, then the 7th step is cut at 40
])
def test_chain_length_schedule(schedule, depths):
    """With oracle drafts every chain is fully accepted: the heuristic grows it by 2 each step, constant keeps k"""
    target = tiny_target(eos=False)
    method = get_method("sps").example(target, schedule=schedule)
    continuation = get_method("vanilla").create(target).generate(PROMPT, 80, GREEDY).token_ids
    install_oracle(method, continuation)
    gen = method.generate(PROMPT, 40, GREEDY)
    assert gen.draft_depths == depths and gen.accepted_drafts == depths


def test_heuristic_shrinks_on_rejection_and_persists_across_turns_unless_transient():
    """Random drafts are rejected: k goes 5, 4, 3, 2, 1, 1 ... and "heuristic" (transformers' persistent schedule)
    starts the next turn where the last ended, "heuristic_transient" starts again from k"""
    target = tiny_target(eos=False)
    for schedule, second_turn_start in (("heuristic", 1), ("heuristic_transient", 5)):
        method = get_method("sps").example(target, schedule=schedule)
        first = method.generate(PROMPT, 12, GREEDY)
        assert first.draft_depths[:6] == [5, 4, 3, 2, 1, 1] and max(first.accepted_drafts) == 0
        assert method.generate(PROMPT, 12, GREEDY).draft_depths[0] == second_turn_start


def test_a_draft_of_another_vocabulary_is_refused():
    """SpS compares token ids: a draft over another vocabulary must be refused with one line saying so, both when
    only the output sizes are known and when the tokenizers differ (the first differing token is named)"""
    target = tiny_target(vocab=64, tokenizer=False)
    small = target_from_model(tiny_llama(vocab_size=48, special_ids=False), None, name="small")
    with pytest.raises(OptionsError, match=r"method 'sps': vocabulary sizes differ \(target 64, draft 48 output "):
        Sps(target, draft=small)
    chat = tiny_target()
    other = char_tokenizer()
    other.add_tokens(["zz"])
    with pytest.raises(OptionsError, match=r"draft 'other' does not share the target's tokenizer \(token 'zz' has id "
                                           r"None in the target's and 101 in the draft's\)"):
        Sps(chat, draft=target_from_model(tiny_llama(), other, name="other"))
    with pytest.raises(OptionsError, match="option draft is required"):
        get_method("sps").create(chat, {})
    with pytest.raises(OptionsError, match="schedule must be one of heuristic, heuristic_transient, constant"):
        get_method("sps").create(chat, {"schedule": "fast"})


def test_a_draft_with_padded_output_rows_is_cut_to_the_target_vocabulary():
    """Same tokenizer, but the draft's lm_head has 16 padding rows more (as model families pad to a multiple):
    its logits are cut to the target's 128 ids, so proposals stay valid ids and the output is vanilla's"""
    target = tiny_target(eos=False)
    draft = target_from_model(tiny_llama(vocab_size=144, seed=4, layers=1), target.tokenizer, name="padded")
    method = Sps(target, SpsOptions(k=3), draft=draft)
    gen = method.generate(PROMPT, 30, GREEDY)
    assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 30, GREEDY).token_ids
    check_generation(gen, method, PROMPT.shape[1], 30)


def test_option_draft_loads_a_folder_with_the_targets_dtype(tmp_path):
    """`--opt sps.draft=FOLDER`: the draft is loaded like a target (config + weights + tokenizer) on the target's
    device and dtype, and its name is in the run's description, so a table row says which draft it was"""
    target = tiny_target(eos=False)
    draft = truncated_draft(target)
    draft.model.save_pretrained(tmp_path / "draft")
    target.tokenizer.save_pretrained(tmp_path / "draft")
    method = get_method("sps").create(target, {"draft": str(tmp_path / "draft"), "k": 3})
    assert method.draft.dtype == target.dtype and method.draft.model.config.num_hidden_layers == 1
    assert method.describe()["draft_model"] == str(tmp_path / "draft")
    gen = method.generate(PROMPT, 30, GREEDY)
    assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 30, GREEDY).token_ids


def test_the_drafts_own_kv_bytes_literal_and_as_held():
    """The draft's KV through ``metrics.draft_kv_bytes``: a tiny Qwen2 draft (2 kv heads of width 8, float32) with
    layer 0 full and layer 1 sliding over window 8 keeps 100 positions in layer 0 and the window - 1 = 7 that
    transformers' sliding layer keeps in layer 1: 2 x 2 x 8 x 4 x (100 + 7) = 13,696 bytes. After every verification
    of a turn the figure equals the bytes of the K/V tensors the draft's cache holds; counting the sliding layer over
    every position (93 x 128 bytes too many at 100) or over its full window would not. A one-layer full draft:
    2 x 2 x 8 x 4 = 128 bytes per position."""
    target = tiny_causal_lm("llama")
    method = Sps(target, SpsOptions(k=3), draft=tiny_causal_lm("qwen2", window=8, seed=2))
    assert method.draft_kv_bytes(100) == 13_696
    assert method.draft_kv_bytes(5) == 2 * 2 * 8 * 4 * (5 + 5)  # below the window the sliding layer holds all 5
    accept, steps = method.accept, []

    def checked_accept(tokens, hidden, next_root):
        accept(tokens, hidden, next_root)
        layers = method.cache.layers
        held = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
        steps.append(held == method.draft_kv_bytes(layers[0].keys.shape[-2]))

    method.accept = checked_accept
    method.generate(torch.arange(2, 42)[None], 20, GREEDY)  # a 40-token prompt: past the window from the start
    assert len(steps) > 3 and all(steps), steps
    assert Sps.example(target, k=3).draft_kv_bytes(1000) == 128 * 1000
