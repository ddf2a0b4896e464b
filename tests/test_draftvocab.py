"""Reduced draft vocabulary (harness/engine/draftvocab.py): counts, top tokens, the restricted lm_head, and the methods'
``draft_vocab`` option (lossless, proposes only kept tokens, clear errors)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.engine.draftvocab import (
    DraftLMHead,
    load_counts,
    save_counts,
    token_counts,
    top_tokens,
)
from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from methods import SHIPPED_HEADS
from methods.eagle.checkpoint import save_eagle_head
from methods.eagle.eagle1 import Eagle1, Eagle1Options
from methods.eagle.eagle2 import Eagle2, Eagle2Options
from methods.jakiro.checkpoint import save_jakiro_head
from methods.jakiro.jakiro import Jakiro, JakiroOptions
from methods.medusa.checkpoint import save_medusa_heads
from methods.medusa.medusa import Medusa, MedusaOptions
from methods.vanilla import Vanilla
from tests.support.helpers import GREEDY, random_jakiro_head, random_medusa_heads, tiny_target
from tests.support.helpers import random_eagle_head as random_head

# what the shipped heads load as weights
WEIGHT_FILES = {"model.safetensors", "medusa_lm_head.safetensors", "hydra_lm_head.safetensors"}
PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])


def test_token_counts_and_top_tokens_literal():
    # only loss positions count; ties go to the smaller id; the result is sorted by id (not by frequency)
    counts = token_counts(torch.tensor([5, 7, 5, 2]), torch.tensor([1, 1, 1, 0]), 8)
    assert counts.tolist() == [0, 0, 0, 0, 0, 2, 0, 1]
    assert top_tokens(torch.tensor([0, 5, 5, 1]), 2).tolist() == [1, 2]
    assert top_tokens(torch.tensor([0, 5, 5, 1]), 3).tolist() == [1, 2, 3]
    assert top_tokens(torch.tensor([3, 0, 0, 9]), 3).tolist() == [0, 1, 3]  # tie 0/0 at ids 1, 2 -> id 1
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        top_tokens(torch.tensor([1, 2, 3, 4]), 5)


def test_restricted_lm_head_scores_only_kept_rows():
    # V = 4, kept [1, 3]: logits [-inf, l1, -inf, l3] with l = the full lm_head's values; a wrong index_copy would
    # put a kept token's logit on another token
    lm = torch.nn.Linear(2, 4, bias=False)
    with torch.no_grad():
        lm.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]]))
    x = torch.tensor([[3.0, 5.0]])
    out = DraftLMHead(lm, torch.tensor([1, 3]))(x)
    assert out[0, 1].item() == 5.0 and out[0, 3].item() == 1.0
    assert torch.isinf(out[0, 0]) and torch.isinf(out[0, 2]) and out.shape == (1, 4)
    assert torch.equal(DraftLMHead(lm)(x), lm(x)) and DraftLMHead(lm, torch.tensor([1, 3])).size == 2
    # columns <-> token ids: a token outside the vocabulary has no column
    restricted = DraftLMHead(lm, torch.tensor([1, 3]))
    assert restricted.columns(torch.tensor([3, 2, 1])).tolist() == [1, -1, 0]
    assert restricted.token_of(torch.tensor([1, 0])).tolist() == [3, 1]
    assert restricted.argmax(x).tolist() == [1]  # l1 = 5 beats l3 = 1


def counted_folder(tmp_path, target, head, save, kept: list[int], **kw):
    """A head folder whose token counts make ``kept`` the most frequent tokens."""
    folder = tmp_path / "head"
    save(head, folder, **kw)
    counts = torch.zeros(target.model.lm_head.weight.shape[0], dtype=torch.int64)
    counts[kept] = torch.arange(len(kept), 0, -1) + 10
    save_counts(counts, folder)
    return folder


KEPT = [4, 10, 20, 33, 40, 41, 42, 50, 60, 61, 70, 71, 72, 80, 90, 100]


@pytest.mark.parametrize("kind", ["eagle1", "eagle2", "jakiro", "medusa"])
def test_greedy_equals_vanilla_and_drafts_only_kept_tokens(tmp_path, kind):
    # the draft may propose only the 16 kept tokens, and the output must still be vanilla's token for token
    target = tiny_target(eos=False)
    expected = Vanilla(target).generate(PROMPT, 24, GREEDY).token_ids
    if kind == "jakiro":
        folder = counted_folder(tmp_path, target, random_jakiro_head(target, seed=4), save_jakiro_head, KEPT)
        method = Jakiro(target, JakiroOptions(head=str(folder), depth=3, top_k=3, total_tokens=12, draft_vocab=16))
    elif kind == "medusa":
        heads = random_medusa_heads(32, 128, shared=True)
        folder = counted_folder(tmp_path, target, heads, save_medusa_heads, KEPT, base_model="tiny",
                                dtype=torch.float32)
        method = Medusa(target, MedusaOptions(head=str(folder), draft_vocab=16))
    elif kind == "eagle1":
        folder = counted_folder(tmp_path, target, random_head(target), save_eagle_head, KEPT, dtype=torch.float32)
        method = Eagle1(target, Eagle1Options(head=str(folder), draft_vocab=16))
    else:
        folder = counted_folder(tmp_path, target, random_head(target), save_eagle_head, KEPT, dtype=torch.float32)
        method = Eagle2(target, Eagle2Options(head=str(folder), depth=3, top_k=4, total_tokens=12, draft_vocab=16))
    proposed: list[int] = []
    original = method.propose

    def spy(*a, **k):
        tree = original(*a, **k)
        proposed.extend(tree.tokens.tolist())
        return tree

    method.propose = spy
    assert method.generate(PROMPT, 24, GREEDY).token_ids == expected
    assert proposed and set(proposed) <= set(KEPT)


def test_sampled_eagle1_draft_probs_vanish_outside_the_vocabulary(tmp_path):
    # at T>0 the q the verifier corrects with must be the distribution the children were drawn from: zero
    # outside the kept tokens and summing to 1 (else the rejection rule would not be exact)
    target = tiny_target(eos=False)
    folder = counted_folder(tmp_path, target, random_head(target, seed=6), save_eagle_head, KEPT, dtype=torch.float32)
    method = Eagle1(target, Eagle1Options(head=str(folder), draft_vocab=16))
    with torch.inference_mode():
        hidden = target.model(PROMPT, output_hidden_states=True).hidden_states[-1][0]
        method.counters = {"draft_forwards": 0}
        method.begin(PROMPT, hidden)
        tree = method.propose(17, SamplingParams(temperature=0.8), torch.Generator().manual_seed(0))
    outside = torch.ones(tree.draft_probs.shape[1], dtype=torch.bool)
    outside[KEPT] = False
    live = tree.draft_probs.sum(-1) > 0
    assert torch.all(tree.draft_probs[:, outside] == 0)
    torch.testing.assert_close(tree.draft_probs[live].sum(-1), torch.ones(int(live.sum())))


def test_missing_or_mismatched_counts_are_clear_errors(tmp_path):
    target = tiny_target(eos=False)
    folder = tmp_path / "head"
    save_eagle_head(random_head(target), folder, dtype=torch.float32)
    with pytest.raises(OptionsError, match="token_counts.json.*data vocab"):
        Eagle2(target, Eagle2Options(head=str(folder), draft_vocab=16))
    save_counts(torch.ones(7, dtype=torch.int64), folder)
    with pytest.raises(ValueError, match=r"shape \(128,\)"):
        load_counts(folder, 128)
    with pytest.raises(ValueError, match="draft_vocab must be 0"):
        Eagle2Options(draft_vocab=3, top_k=10)
    Eagle2(target, Eagle2Options(head=str(folder), draft_vocab=0))  # full vocabulary needs no counts
    # more draft tokens than the target has was accepted silently (and drafted over the full vocabulary)
    with pytest.raises(OptionsError, match=r"draft_vocab=100000000 is more than the target's vocabulary of 128 tokens"):
        Eagle2(target, Eagle2Options(head=str(folder), draft_vocab=100_000_000))
    own = tmp_path / "medusa"
    save_medusa_heads(random_medusa_heads(32, 128, shared=False), own, base_model="tiny", dtype=torch.float32)
    with pytest.raises(OptionsError, match="share the target's lm_head"):
        Medusa(target, MedusaOptions(head=str(own), draft_vocab=16))


def test_counts_file_is_json_and_round_trips(tmp_path):
    # counts travel as JSON: if this failed, a head's token frequencies would change on disk (or be unreadable)
    path = save_counts(torch.tensor([0, 5, 5, 1]), tmp_path)
    assert path.name == "token_counts.json"
    assert json.loads(path.read_text()) == {"vocab_size": 4, "counts": [0, 5, 5, 1]}
    assert load_counts(tmp_path, 4).tolist() == [0, 5, 5, 1]
    path.write_text('{"counts": [1, -2]}')
    with pytest.raises(ValueError, match="no list of non-negative integers"):
        load_counts(tmp_path, 2)


def test_shipped_heads_hold_no_safetensors_but_their_weights():
    # vLLM loads every *.safetensors in a head folder as weights: a statistics file there fails the engine's load
    heads = sorted(SHIPPED_HEADS.glob("*/*"))
    assert heads, "no shipped heads found"
    for folder in heads:
        extra = [f.name for f in folder.glob("*.safetensors") if f.name not in WEIGHT_FILES]
        assert extra == [], f"{folder}: {extra} would be read as weights by vLLM"
        assert load_counts(folder, 49152).sum() > 0
