"""Any causal LM through every method: sliding-window attention (Mistral, Gemma 2, Gemma 3, Qwen2 with sliding
layers), a non-Llama head config (OPT), and the attention backend option. Tiny random models, fp32 on CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from harness.engine.kv import (
    attention_layout,
    check_layer_types,
    compact_cache,
    prepare_cache,
    verification_masks,
)
from harness.engine.sampling import SamplingParams
from harness.engine.tree import ancestor_matrix, slot_depths, windowed_tree_mask
from harness.models import check_attn_implementation
from harness.registry import get_method
from methods.vanilla import Vanilla
from tests.support.anymodel import TREE_METHODS, tiny_causal_lm, tree_method
from tests.test_engine import PROMPT, OracleBranched, OracleChain

GREEDY = SamplingParams()
BUDGET = 30
# (architecture, sliding window): the prompt has 17 tokens and a turn ends at 47 positions, so window 5/6 is
# shorter than the prompt, 24 is crossed during the turn and 64 is never reached (Mistral-7B-v0.1's 4096 case)
WINDOWED = [("mistral", 6), ("mistral", 24), ("mistral", 64), ("gemma2", 5), ("gemma3", 5), ("gemma3", 24),
            ("qwen2", 5)]
PLAIN = [("gemma2", None), ("gemma3", None), ("opt", None), ("llama", None)]
CASES = WINDOWED + PLAIN


def case_id(case) -> str:
    arch, window = case
    return f"{arch}-w{window}" if window else arch


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def case(request):
    """A tiny target of the case and its vanilla greedy output (computed once per case)."""
    arch, window = request.param
    target = tiny_causal_lm(arch, window)
    return target, Vanilla(target).generate(PROMPT, BUDGET, GREEDY).token_ids


def test_vanilla_equals_generate(case):
    """Vanilla is the reference every method is compared with: it must be transformers' own greedy decoding (with
    its sliding-window cache and masks), or the comparisons below would prove nothing."""
    target, want = case
    with torch.no_grad():
        ref = target.model.generate(PROMPT, max_new_tokens=BUDGET, do_sample=False)[0, PROMPT.shape[1]:].tolist()
    assert want == ref


@pytest.mark.parametrize("name", ("oracle_chain", "oracle_branched") + TREE_METHODS)
def test_every_tree_method_equals_vanilla(case, name):
    """Greedy output of every tree method = vanilla's, token for token. A mask that ignores a layer's window, a
    sliding cache cut before compaction or compacted with the wrong offset, or a missing per-layer-type mask makes
    the continuation diverge (or raises a size mismatch) once the window is shorter than the context. The oracles
    accept deep, non-contiguous paths at every step, so compaction of windowed layers is exercised."""
    target, want = case
    if name == "oracle_chain":
        method = OracleChain(target)
    elif name == "oracle_branched":
        method = OracleBranched(target)
    else:
        method = tree_method(name, target)
    got = method.generate(PROMPT, BUDGET, GREEDY)
    assert got.token_ids == want
    assert method.last_cache_length == PROMPT.shape[1] + BUDGET - 1
    if name.startswith("oracle"):
        assert sum(got.accepted_drafts) >= 20  # nearly every drafted token accepted


def test_windowed_tree_mask_literal():
    """The docstring example: committed 3 (all kept), window 2, root + one child. The root (position 3) sees
    position 2 and itself; the child (position 4) sees the root and itself only. A mask that let the child see
    position 2 would attend outside its window (what a 4D mask without the window does)."""
    m = torch.finfo(torch.float32).min
    ancestors = ancestor_matrix(torch.tensor([-1]))
    mask = windowed_tree_mask(ancestors, slot_depths(ancestors), 3, 3, 2, torch.float32)
    assert mask[0, 0].tolist() == [[m, m, 0, 0, m], [m, m, m, 0, 0]]
    full = windowed_tree_mask(ancestors, slot_depths(ancestors), 3, 3, None, torch.float32)
    assert full[0, 0].tolist() == [[0, 0, 0, 0, m], [0, 0, 0, 0, 0]]


def test_ancestor_matrix_equals_the_host_walk_on_a_deep_tree():
    """Pointer jumping must close paths longer than one round: a 9-deep chain with a side branch (needs 4 rounds).
    Row r lists slot r's ancestors-or-self; a missing round leaves deep rows incomplete."""
    parents = torch.tensor([-1, 0, 1, 2, 3, 4, 5, 6, 7, 0])
    from harness.engine.tree import tree_attention_mask

    assert torch.equal(ancestor_matrix(parents), tree_attention_mask(parents))
    assert slot_depths(ancestor_matrix(parents)).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 2]


def test_masks_are_a_dict_per_layer_type_for_mixed_models():
    """Gemma 2/3 take {"full_attention": ..., "sliding_attention": ...}; Mistral (all layers sliding) one tensor.
    The sliding mask covers only the window - 1 committed positions its cache keeps, the full one all of them."""
    ancestors = ancestor_matrix(torch.tensor([-1, 0]))
    depth = slot_depths(ancestors)
    for arch, kind in (("gemma2", dict), ("mistral", torch.Tensor)):
        target = tiny_causal_lm(arch, 5)
        cache = DynamicCache(config=target.model.config)
        with torch.no_grad():
            target.model(PROMPT, cache=cache, use_cache=True)
        layout = attention_layout(cache)
        masks = verification_masks(layout, cache, ancestors, depth, PROMPT.shape[1], torch.float32)
        assert isinstance(masks, kind)
        if kind is dict:
            assert set(masks) == {"full_attention", "sliding_attention"}
            assert masks["full_attention"].shape == (1, 1, 3, 17 + 3)
            assert masks["sliding_attention"].shape == (1, 1, 3, 4 + 3)
        else:
            assert masks.shape == (1, 1, 3, 4 + 3)


def test_sliding_cache_compaction_equals_running_the_accepted_tokens():
    """After a tree forward and compaction, a sliding layer must hold exactly what vanilla decoding of the
    accepted tokens leaves: the last window - 1 keys/values and cumulative_length = committed length. Keeping a
    rejected slot, dropping a committed one, or a wrong count breaks the equality."""
    target = tiny_causal_lm("mistral", 6)
    model = target.model
    parents = torch.tensor([-1, -1, 0, 2, 0])  # root -> {a, b}; a -> c -> d; a -> e
    tokens = torch.tensor([35, 8, 9, 7, 29])
    root, keep, accepted = 5, [0, 1, 3, 4], [35, 9, 7]
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(PROMPT, cache=cache, use_cache=True)
        prepare_cache(cache)
        layout = attention_layout(cache)
        ancestors = ancestor_matrix(parents)
        depth = slot_depths(ancestors)
        masks = verification_masks(layout, cache, ancestors, depth, PROMPT.shape[1], torch.float32)
        ids = torch.cat([torch.tensor([root]), tokens])[None]
        model(ids, attention_mask=masks, position_ids=(depth + PROMPT.shape[1])[None], cache=cache, use_cache=True)
        compact_cache(cache, PROMPT.shape[1], keep)
        direct = DynamicCache(config=model.config)
        model(torch.cat([PROMPT, torch.tensor([[root, *accepted]])], dim=1), cache=direct, use_cache=True)
    for got, want in zip(cache.layers, direct.layers):
        assert got.cumulative_length == want.cumulative_length == PROMPT.shape[1] + len(keep)
        assert got.keys.shape[-2] == 5  # window - 1
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)


def test_unsupported_layer_types_are_refused_by_name():
    """Chunked attention (Llama 4) needs a mask the tree masks do not build: refused naming the layer, not run
    with a wrong mask."""
    check_layer_types(["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="layer 1 is of type 'chunked_attention'"):
        check_layer_types(["full_attention", "chunked_attention"])


# ---- the attention backend ------------------------------------------------------------------------------------
def test_unknown_attention_backend_fails_by_name():
    """A typo must fail in one line naming the option and the close match, before any model is loaded."""
    from harness.run.config import ConfigError, RunConfig

    check_attn_implementation("eager")
    check_attn_implementation("sdpa")
    check_attn_implementation("kernels-community/flash-attn")  # a kernels-hub id
    with pytest.raises(ValueError, match=r"unknown attn_implementation 'sdpaa' \(did you mean 'sdpa'\?\)"):
        check_attn_implementation("sdpaa")
    with pytest.raises(ConfigError, match=r"run\.attn_implementation: unknown attn_implementation 'fast'"):
        RunConfig(attn_implementation="fast")


def test_attention_backend_reaches_the_model_and_the_command_line(tmp_path):
    """--attn-implementation sets the run field that load_target passes to transformers: a Gemma 2 saved to a
    folder loads with eager (transformers refuses sdpa for it), and the loaded model runs that backend."""
    from harness.cli import build_parser
    from harness.cli.run import config_from_args
    from harness.models import load_target

    args = build_parser().parse_args(["run", "--attn-implementation", "eager", "--profile", "on"])
    cfg = config_from_args(args)
    assert (cfg.attn_implementation, cfg.profile) == ("eager", "on")
    target = tiny_causal_lm("gemma2", 5)
    target.model.save_pretrained(tmp_path / "gemma2")
    _char_tokenizer().save_pretrained(tmp_path / "gemma2")
    loaded = load_target(str(tmp_path / "gemma2"), "float32", "cpu", attn_implementation=cfg.attn_implementation)
    assert loaded.model.config._attn_implementation == "eager"


def _char_tokenizer():
    from tests.support.helpers import char_tokenizer

    return char_tokenizer()


def test_tree_methods_refuse_flash_backends_with_the_reason():
    """Flash kernels cannot take the 4D tree mask: building a tree method on such a target must fail at once with
    the reason, not mid-run (or silently with a causal mask)."""
    target = tiny_causal_lm("llama")
    target.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2.*only eager, sdpa and sdpa_gqa take an arbitrary mask"):
        get_method("eagle2").example(target, seed=1, total_tokens=16, depth=3, top_k=4)
    Vanilla(target)  # vanilla needs no tree mask


# ---- draft heads for any config -------------------------------------------------------------------------------
def test_head_config_from_an_opt_config():
    """OPT has no intermediate_size (ffn_dim), no rms eps (layer_norm_eps... default) and a 16-wide projected
    embedding: the head is shaped from the lm_head width and ffn_dim; a config without a hidden size is named."""
    from transformers import PretrainedConfig

    from methods.eagle.head import EagleHead, HeadConfigError, eagle_config_for

    target = tiny_causal_lm("opt")
    head = EagleHead.for_target(target)
    assert (head.config.hidden_size, head.config.intermediate_size, head.config.vocab_size) == (16, 64, 64)
    assert head.config.num_attention_heads * head.config.head_dim == 16
    with pytest.raises(HeadConfigError, match="has no hidden_size"):
        eagle_config_for(PretrainedConfig(vocab_size=10))
    with pytest.raises(HeadConfigError, match="has no vocab_size"):
        eagle_config_for(PretrainedConfig(hidden_size=8))


@pytest.mark.slow
def test_opt_heads_build_and_train(tmp_path):
    """EAGLE and Jakiro heads for an OPT target train (loss falls over a few steps), save and load back, and the
    loaded EAGLE head drafts losslessly: a head config that assumed Llama fields could not be built at all."""
    import json

    from harness.models import target_from_model
    from harness.train.features import build_dataset
    from harness.train.loop import TrainConfig, train
    from methods.eagle.checkpoint import load_eagle_head
    from methods.eagle.eagle2 import Eagle2, Eagle2Options
    from tests.support.helpers import char_tokenizer

    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, OPTConfig

    cfg = OPTConfig(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=256, word_embed_proj_dim=16, eos_token_id=4, bos_token_id=1,
                    pad_token_id=2)
    target = target_from_model(AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False), char_tokenizer(),
                               name="tiny-opt")
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"say ab {i}"},
                                               {"from": "gpt", "value": "ab " * (5 + i % 3)}]} for i in range(8)]
    (tmp_path / "convs.json").write_text(json.dumps(convs))
    build_dataset(target, [str(tmp_path / "convs.json")], tmp_path / "data", max_len=64, shard_size=8,
                  eval_questions={}, progress=False)
    config = TrainConfig(lr=3e-3, warmup_steps=2, batch_size=4, eval_fraction=0.25, eval_every=1000, log_every=1,
                         save_every=1000, eval_positions=2, cpu=True, progress=False, max_steps=30)
    for objective in ("eagle", "jakiro"):
        train(objective, target, tmp_path / "data", tmp_path / objective, config)
        rows = [json.loads(line) for line in (tmp_path / objective / "train_log.jsonl").open()]
        losses = [r["loss"] for r in rows if r["kind"] == "train"]
        assert len(losses) >= 20 and sum(losses[-5:]) < sum(losses[:5]), (objective, losses)
    head = load_eagle_head(tmp_path / "eagle" / "head", target)
    method = Eagle2(target, Eagle2Options(total_tokens=8, depth=2, top_k=2), head=head)
    prompt = target.render_chat([{"role": "user", "content": "say ab 3"}])
    target.eos_ids = frozenset()
    assert method.generate(prompt, 20, GREEDY).token_ids == Vanilla(target).generate(prompt, 20, GREEDY).token_ids


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_tree_size_timing_runs_on_windowed_models(arch):
    """eagle2's total_tokens=-1 times verification forwards with the engine's own masks and compaction: a
    full-prefix 4D mask on a sliding cache (context 12 > window 5) raised a size mismatch, and Gemma 2 needs the
    per-layer-type dict."""
    from harness.engine.autotune import time_tree_sizes

    timings = time_tree_sizes(tiny_causal_lm(arch, 5), sizes=(4, 9), repeats=1, context_len=12)
    assert sorted(timings) == [4, 9] and all(v > 0 for v in timings.values())
