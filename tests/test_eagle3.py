"""EAGLE-3 (arXiv:2503.01840): the published checkpoint format (a stand-in written with the published key names and
shapes), the head's arithmetic against a hand-written reference, the reduced vocabulary (d2t/t2d), the dynamic tree
grown from three target levels, and training with the training-time test. Losslessness (greedy, oracle, chi-square)
comes from tests/test_lossless.py, which covers every registered method."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engine.checkpoints import CheckpointError
from harness.engine.method import OptionsError
from harness.registry import get_method
from methods.eagle.head import rope_theta
from methods.eagle3.checkpoint import check_vocab_maps, load_eagle3_head, save_eagle3_head
from methods.eagle3.eagle3 import Eagle3, Eagle3Options
from methods.eagle3.head import Eagle3Head
from tests.support.helpers import GREEDY, check_generation, tiny_target

H, V, I, VD = 32, 128, 64, 16  # tiny target: hidden, vocab, intermediate; the stand-in's draft vocabulary
KEPT = [0, 3, 4, 5, 9, 17, 20, 33, 40, 41, 64, 77, 90, 101, 120, 127]  # its 16 target ids, sorted
PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])

# config.json as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ships it (eagle/traineagle3/config.json), with tiny sizes
PUBLISHED_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 4, "hidden_act": "silu",
    "hidden_size": H, "initializer_range": 0.02, "intermediate_size": I, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": V, "draft_vocab_size": VD,
}
# the published keys and shapes for that config (4 heads x 8, 2 KV heads, fused levels 3 x 32)
PUBLISHED_SHAPES = {
    "fc.weight": (32, 96),
    "midlayer.self_attn.q_proj.weight": (32, 64),
    "midlayer.self_attn.k_proj.weight": (16, 64),
    "midlayer.self_attn.v_proj.weight": (16, 64),
    "midlayer.self_attn.o_proj.weight": (32, 32),
    "midlayer.mlp.gate_proj.weight": (64, 32),
    "midlayer.mlp.up_proj.weight": (64, 32),
    "midlayer.mlp.down_proj.weight": (32, 64),
    "midlayer.input_layernorm.weight": (32,),
    "midlayer.hidden_norm.weight": (32,),
    "midlayer.post_attention_layernorm.weight": (32,),
    "norm.weight": (32,),
    "lm_head.weight": (16, 32),
    "d2t": (16,),
    "t2d": (128,),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def published_eagle3_folder(folder: Path, config: dict | None = None, seed: int = 1,
                            edit=None) -> dict[str, torch.Tensor]:
    """Write a stand-in EAGLE-3 checkpoint exactly as the published ones are laid out: ``config.json`` and
    ``pytorch_model.bin`` with the keys of :data:`PUBLISHED_SHAPES` (weights N(0, 0.2^2), norms 1 + noise, d2t int64
    and t2d bool for :data:`KEPT`). ``edit(sd)`` may break it before it is written."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in PUBLISHED_SHAPES.items():
        noise = torch.randn(*shape, generator=g) * 0.2
        sd[key] = 1 + noise if key.endswith("norm.weight") else noise
    kept = torch.tensor(KEPT)
    sd["d2t"] = kept - torch.arange(VD)                       # int64: target = draft + d2t[draft]
    sd["t2d"] = torch.zeros(V, dtype=torch.bool)
    sd["t2d"][kept] = True
    if edit is not None:
        edit(sd)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or PUBLISHED_CONFIG))
    torch.save(sd, folder / "pytorch_model.bin")
    return sd


def rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE by hand on x [S, heads, 8]: pairs (i, i + 4) rotated by pos * base^(-2i/8)."""
    inv = base ** (-torch.arange(0, 8, 2).float() / 8)               # [4]
    ang = pos[:, None].float() * inv[None]                           # [S, 4]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    half = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
    return x * cos + half * sin


def reference_eagle3(sd: dict, embed: torch.Tensor, levels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The published EAGLE-3 draft layer written out by hand over one causal sequence (positions 0..S-1):
    g = fc(levels); x = [RMSNorm_in(E[tok]), RMSNorm_hidden(g)] (2H); causal GQA attention with RoPE base 10000 (no
    rope_theta in the config); h = g + o(attn); out = h + MLP(RMSNorm_post(h)); logits = lm_head(RMSNorm(out)).
    levels [S, 3H], tokens [S] -> draft-vocabulary logits [S, 16]."""
    S = tokens.shape[0]
    g = levels @ sd["fc.weight"].T
    x = torch.cat([rms(embed[tokens], sd["midlayer.input_layernorm.weight"]),
                   rms(g, sd["midlayer.hidden_norm.weight"])], dim=-1)                      # [S, 64]
    pos = torch.arange(S)
    q = rotate((x @ sd["midlayer.self_attn.q_proj.weight"].T).view(S, 4, 8), pos)
    k = rotate((x @ sd["midlayer.self_attn.k_proj.weight"].T).view(S, 2, 8), pos).repeat_interleave(2, dim=1)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(S, 2, 8).repeat_interleave(2, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(8)
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(S, 32)
    h = g + attn @ sd["midlayer.self_attn.o_proj.weight"].T
    n = rms(h, sd["midlayer.post_attention_layernorm.weight"])
    out = h + (F.silu(n @ sd["midlayer.mlp.gate_proj.weight"].T) * (n @ sd["midlayer.mlp.up_proj.weight"].T)) \
        @ sd["midlayer.mlp.down_proj.weight"].T
    return rms(out, sd["norm.weight"]) @ sd["lm_head.weight"].T


# ------------------------------------------------------------------------------------------------ checkpoint


def test_published_checkpoint_loads_and_matches_a_hand_written_head(tmp_path):
    """The stand-in (published key names, shapes, d2t/t2d buffers, config without rope_theta) must load strictly and
    compute what the published architecture computes; a swapped norm, a missing residual, the target's RoPE base
    or a wrong embedding/feature order in the 2H attention input would change the logits"""
    target = tiny_target()
    sd = published_eagle3_folder(tmp_path)
    head = load_eagle3_head(tmp_path, target)
    assert head.shares_target_embedding and head.draft_vocab_size == VD and rope_theta(head.config) == 10000.0
    g = torch.Generator().manual_seed(5)
    levels, tokens = torch.randn(6, 3 * H, generator=g), torch.tensor([3, 9, 14, 27, 40, 51])
    with torch.no_grad():
        out, kv = head(levels[None], tokens[None], torch.arange(6)[None], project=True)
        got = head.logits(out[0])
    expected = reference_eagle3(sd, target.model.get_input_embeddings().weight, levels, tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert kv.length == 6
    # d2t maps draft ids to the target ids the checkpoint keeps
    assert head.to_target(torch.arange(VD)).tolist() == KEPT
    assert torch.nonzero(head.t2d).flatten().tolist() == KEPT


def test_rope_theta_and_layer_ids_are_read_from_the_config(tmp_path):
    """A config that sets rope_theta (and the optional fused-layer ids) must be obeyed, not replaced by defaults"""
    target = tiny_target()
    published_eagle3_folder(tmp_path, {**PUBLISHED_CONFIG, "rope_theta": 500000.0,
                                       "eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    head = load_eagle3_head(tmp_path, target)
    assert rope_theta(head.config) == 500000.0
    assert Eagle3(target, Eagle3Options(top_k=3), head=head).hidden_layers == (0, 1, 2)


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.update({"layers.0.hidden_norm.weight": sd.pop("midlayer.hidden_norm.weight")}),
     r"missing keys: midlayer\.hidden_norm\.weight \(found layers\.0\.hidden_norm\.weight: renamed\?\)"),
    (lambda sd: sd.pop("d2t"), r"missing keys: d2t"),
    (lambda sd: sd.update({"lm_head.weight": torch.zeros(V, H)}),
     r"shape mismatches: lm_head\.weight: checkpoint \[128, 32\] vs expected \[16, 32\]"),
    (lambda sd: sd.update({"fc.bias": torch.zeros(H)}), r"unexpected keys: fc\.bias"),
    (lambda sd: sd["t2d"].__setitem__(2, True),
     r"d2t and t2d disagree: t2d marks 17 target ids, d2t maps 16 draft ids, first difference at draft id 1"),
    (lambda sd: sd.update({"t2d": sd["t2d"].float()}), r"t2d must be a bool mask"),
])
def test_a_wrong_checkpoint_fails_naming_the_key(tmp_path, edit, message):
    """Strict loading: a renamed, missing, mis-shaped or extra key, or inconsistent vocabulary maps, must fail with
    the key in the message (the released loader uses strict=False and would keep random weights)"""
    published_eagle3_folder(tmp_path, edit=edit)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3_head(tmp_path, tiny_target())


@pytest.mark.parametrize("config, message", [
    ({k: v for k, v in PUBLISHED_CONFIG.items() if k != "draft_vocab_size"}, r"missing field\(s\) draft_vocab_size"),
    ({**PUBLISHED_CONFIG, "vocab_size": 64}, r"vocab_size=64 do not match the target 'tiny-llama'"),
    ({**PUBLISHED_CONFIG, "num_hidden_layers": 2}, r"num_hidden_layers must be 1 for an EAGLE-3 head, got 2"),
    ({**PUBLISHED_CONFIG, "draft_vocab_size": 200}, r"draft_vocab_size=200 exceeds vocab_size=128"),
])
def test_a_wrong_config_fails_naming_the_field(tmp_path, config, message):
    """A config.json without draft_vocab_size, for another target's vocabulary, with two layers or a draft
    vocabulary larger than the target's must be refused naming the field, before any weight is read."""
    published_eagle3_folder(tmp_path, config)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3_head(tmp_path, tiny_target())


def test_check_vocab_maps_literal():
    """Docstring example: d2t [1, 3] with t2d marking {1, 4} is the vocabulary [1, 4]; d2t [1, 2] is not"""
    t2d = torch.tensor([False, True, False, False, True, False])
    assert check_vocab_maps(torch.tensor([1, 3]), t2d, "x").tolist() == [1, 4]
    with pytest.raises(CheckpointError, match="d2t and t2d disagree"):
        check_vocab_maps(torch.tensor([1, 2]), t2d, "x")


def test_save_writes_the_published_keys_and_round_trips(tmp_path):
    """What `draftbench train eagle3` writes must be the published layout (no embedding when it is the target's) and
    must load back to the same head"""
    target = tiny_target()
    torch.manual_seed(0)
    head = Eagle3Head.for_target(target, torch.tensor(KEPT)).eval()
    save_eagle3_head(head, tmp_path, (1, 1, 1))
    sd = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert {k: tuple(v.shape) for k, v in sd.items()} == PUBLISHED_SHAPES
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool and sd["fc.weight"].dtype == torch.float16
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draft_vocab_size"] == VD and config["eagle_aux_hidden_state_layer_ids"] == [1, 1, 1]
    back = load_eagle3_head(tmp_path, target)
    levels, tokens = torch.randn(1, 5, 3 * H), torch.tensor([[3, 9, 14, 27, 40]])
    with torch.no_grad():
        a = head.logits(head(levels, tokens, torch.arange(5)[None], project=True)[0])
        b = back.logits(back(levels, tokens, torch.arange(5)[None], project=True)[0])
    torch.testing.assert_close(a, b, rtol=0, atol=5e-3)  # fp16 storage
    assert torch.equal(back.d2t, head.d2t) and torch.equal(back.t2d, head.t2d)


# ------------------------------------------------------------------------------------------------ the method


def scratch_log_probs(head: Eagle3Head, levels: torch.Tensor, prompt: torch.Tensor, root: int,
                      chain: list[int]) -> torch.Tensor:
    """Draft log-probs over the TARGET vocabulary after ``prompt + root + chain``, recomputed from scratch with plain
    causal forwards: prompt positions read fc(levels), each chain position reads the previous position's output."""
    tokens = torch.cat([prompt[0, 1:], torch.tensor([root] + chain)])       # [P + len(chain)]
    hidden = head.project(levels[None])                                      # [1, P, H]
    for _ in range(len(chain) + 1):
        S = hidden.shape[1]
        out, _ = head(hidden, tokens[None, :S], torch.arange(S)[None])
        hidden = torch.cat([hidden, out[:, -1:]], dim=1)
    draft = torch.log_softmax(head.logits(out[0, -1]), -1)                   # [VD]
    full = torch.full((V,), float("-inf"))
    full[head.to_target(torch.arange(head.draft_vocab_size))] = draft
    return full


def test_candidates_equal_a_from_scratch_computation(tmp_path):
    """EAGLE-2's expansion on the EAGLE-3 head: every candidate's cumulative score must be what a from-scratch run
    along its ancestor chain gives, and its token a target id of the draft vocabulary. Pins the fc projection on
    the stable positions only, the feedback of the head's own outputs, the positions and the d2t mapping"""
    target = tiny_target(eos=False)
    published_eagle3_folder(tmp_path)
    method = Eagle3(target, Eagle3Options(head=str(tmp_path), depth=2, top_k=3, total_tokens=8))
    g = torch.Generator().manual_seed(2)
    levels = torch.randn(PROMPT.shape[1], 3 * H, generator=g)
    with torch.inference_mode():
        method.counters = {"draft_forwards": 0}
        method.begin(PROMPT, levels)
        cands = method.expand(root=17)
        assert cands.tokens.shape == (3 + 2 * 9,) and method.counters["draft_forwards"] == 3
        assert set(cands.tokens.tolist()) <= set(KEPT)
        for c in range(cands.tokens.shape[0]):
            chain, node = [], int(cands.parents[c])
            while node >= 0:
                chain.insert(0, int(cands.tokens[node]))
                node = int(cands.parents[node])
            parent = float(cands.scores[int(cands.parents[c])]) if cands.parents[c] >= 0 else 0.0
            lp = scratch_log_probs(method.head, levels, PROMPT, 17, chain)
            assert float(cands.scores[c]) == pytest.approx(parent + float(lp[cands.tokens[c]]), abs=1e-4)


def test_the_engine_hands_eagle3_the_three_levels_it_was_built_for():
    """On an 8-layer target the head reads the inputs of layers 2, 4 and 5 (2, L/2, L-3); the method must get exactly
    those, concatenated, for the prompt it begins with, and its greedy output is vanilla's"""
    target = tiny_target(eos=False, layers=8)
    method = get_method("eagle3").example(target, total_tokens=8, depth=2, top_k=3)
    assert method.hidden_layers == (2, 4, 5)
    seen = []
    begin = method.begin
    method.begin = lambda prompt_ids, hidden: (seen.append(hidden), begin(prompt_ids, hidden))
    gen = method.generate(PROMPT, 12, GREEDY)
    with torch.inference_mode():
        states = target.model(PROMPT, output_hidden_states=True).hidden_states
    torch.testing.assert_close(seen[0], torch.cat([states[2][0], states[4][0], states[5][0]], -1), rtol=1e-5,
                               atol=1e-5)
    assert gen.token_ids == get_method("vanilla").create(target).generate(PROMPT, 12, GREEDY).token_ids
    check_generation(gen, method, PROMPT.shape[1], 12)


def test_options_are_validated(tmp_path):
    """A top_k wider than the head's draft vocabulary cannot be filled; bad tree sizes are named"""
    target = tiny_target()
    published_eagle3_folder(tmp_path)
    with pytest.raises(OptionsError, match=r"top_k=17 exceeds the head's draft vocabulary \(16 tokens\)"):
        get_method("eagle3").create(target, {"head": str(tmp_path), "top_k": 17})
    with pytest.raises(OptionsError, match="depth must be >= 1, got 0"):
        get_method("eagle3").create(target, {"head": str(tmp_path), "depth": 0})
    with pytest.raises(CheckpointError, match="no eagle3 head is shipped for target 'tiny-llama'"):
        get_method("eagle3").create(target, {})


# ------------------------------------------------------------------------------------------------ training


def pattern_conversations(n: int) -> list[dict]:
    """Conversations whose answers repeat a short motif: learnable from the target's features in a few steps."""
    motifs = ["ab ", "xyz ", "hello ", "12 "]
    return [{"id": f"p{i}", "conversations": [
        {"from": "human", "value": f"repeat {motifs[i % 4].strip()} please {i}"},
        {"from": "gpt", "value": motifs[i % 4] * (6 + i % 3)}]} for i in range(n)]


def build_pattern_data(root: Path, target, layers: str | None, self_distill: bool = False) -> Path:
    from harness.train.features import build_dataset

    src = root / "convs.json"
    src.write_text(json.dumps(pattern_conversations(12)))
    build_dataset(target, [str(src)], root / "data", max_len=96, shard_size=6, eval_questions={"x": ["y/1"]},
                  progress=False, layers=layers, self_distill=self_distill, max_new_tokens=48)
    return root / "data"


def small_config(**kw):
    from harness.train.loop import TrainConfig

    base = dict(lr=3e-3, warmup_steps=3, batch_size=4, eval_fraction=0.25, eval_every=1000, log_every=1,
                save_every=1000, eval_positions=3, cpu=True, progress=False)
    return TrainConfig(**{**base, **kw})


@pytest.mark.slow
def test_train_eagle3_smoke(tmp_path):
    """`draftbench train eagle3` end to end on a tiny model: 100 steps of the training-time test (3 unrolled steps)
    over a 40-token draft vocabulary taken from the data's counts must lower the loss and lift the held-out top-1
    accuracy far above a random head's (0.04 / 0.0 / 0.0 at positions 1-3 on this data), write the head in the
    published format with its vocabulary maps and fused-layer ids, and the saved head must draft losslessly"""
    from harness.train.loop import LOG_FILE, train

    target = tiny_target(eos=False, init=0.3)  # peaked next-token distributions: something to learn
    data = build_pattern_data(tmp_path, target, "low,mid,high")
    recipe = train("eagle3", target, data, tmp_path / "run",
                   small_config(max_steps=100, options={"draft_vocab": 40, "length": 3}))
    rows = [json.loads(line) for line in (tmp_path / "run" / LOG_FILE).read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert {"ploss1", "ploss2", "ploss3"} <= set(rows[0])
    assert sum(losses[-10:]) < 0.85 * sum(losses[:10]), losses  # 3.23 -> 2.37 in the run that set this bound
    acc = recipe["final_eval"]["acc"]
    assert recipe["steps"] == 100 and acc[0] > 0.15 and acc[2] > 0.1, recipe["final_eval"]
    head_dir = tmp_path / "run" / "head"
    sd = torch.load(head_dir / "pytorch_model.bin", weights_only=True)
    assert set(sd) == set(PUBLISHED_SHAPES) and sd["lm_head.weight"].shape == (40, H)
    config = json.loads((head_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 40 and config["eagle_aux_hidden_state_layer_ids"] == [1, 1, 1]
    assert (head_dir / "token_counts.json").is_file()
    method = get_method("eagle3").create(target, {"head": str(head_dir), "total_tokens": 8, "depth": 2, "top_k": 3})
    prompt = target.render_chat([{"role": "user", "content": "repeat xyz please 3"}])
    gen = method.generate(prompt, 24, GREEDY)
    assert gen.token_ids == get_method("vanilla").create(target).generate(prompt, 24, GREEDY).token_ids
    check_generation(gen, method, prompt.shape[1], 24)


def test_train_eagle3_refuses_data_without_the_levels(tmp_path):
    """A dataset built without --layers has only the post-norm feature: training must stop at once, saying how to
    build the right one, not fail inside the loss"""
    from harness.train.loop import train

    target = tiny_target()
    data = build_pattern_data(tmp_path, target, None)
    with pytest.raises(ValueError, match=r"objective 'eagle3' reads 3 target feature levels, but this dataset "
                                         r"stores only the post-norm feature; build it with .*--layers low,mid,high"):
        train("eagle3", target, data, tmp_path / "run", small_config(max_steps=2))


def eagle3_objective_and_head(target, data: Path, length: int):
    """The eagle3 objective over a 40-token draft vocabulary counted on ``data``, and a fresh head (seed 0)."""
    from harness.train.features import dataset_token_counts, read_manifest
    from harness.train.objectives import get_objective

    obj = get_objective("eagle3").create(target, {"draft_vocab": 40, "length": length})
    obj.check_data(read_manifest(data), str(data))
    obj.set_token_counts(dataset_token_counts(data, V))
    torch.manual_seed(0)
    return obj, obj.build_head()


def test_eagle3_loss_of_one_step_is_the_restricted_soft_cross_entropy(tmp_path):
    """Length 1: the loss is -sum_v p_v log q_v averaged over loss positions whose target token is in the draft
    vocabulary, with p the target's softmax over the kept ids renormalised and q the draft's; computed by hand"""
    from harness.train.dataset import FeatureDataset, collate

    target = tiny_target()
    data = build_pattern_data(tmp_path, target, "low,mid,high")
    obj, head = eagle3_objective_and_head(target, data, 1)
    batch = collate([FeatureDataset(data, noise="none")[i] for i in range(2)])
    loss, parts = obj.loss(head, batch)
    B, S = batch["input_ids"].shape
    with torch.no_grad():
        out, _ = head(batch["levels"], batch["input_ids"], torch.arange(S).expand(B, S), project=True)
        logq = torch.log_softmax(head.logits(out), -1)                                   # [B, S, 40]
        full = target.model.lm_head(batch["target"])                                     # [B, S, V]
        p = torch.softmax(full[..., obj.kept], -1)
        inside = torch.isin(full.argmax(-1), obj.kept)
        ce = -(p * logq).sum(-1)
        m = batch["loss_mask"]
        expected = (ce * m * inside).sum() / m.sum()
    assert loss.item() == pytest.approx(float(expected), rel=1e-4) and parts["ploss1"] == pytest.approx(loss.item())
    assert 0 < int(inside[m > 0].sum()) < int((m > 0).sum())  # both cases occur: the mask is exercised


def test_eagle3_loss_and_accuracy_with_the_cached_greedy_tokens_equal_the_computed_ones(tmp_path):
    """With the target's greedy tokens carried by the batch (FeatureDataset.attach_greedy, what the loop does for
    eagle3), the loss runs only the draft vocabulary's rows of lm_head: the loss, its parts and the accuracy must be
    what the full-vocabulary computation gives, or the cache changes what a head learns; and a second read of an
    item must not run lm_head again, or the cache saves nothing"""
    from harness.train.dataset import FeatureDataset, collate

    target = tiny_target(init=0.3)
    data = build_pattern_data(tmp_path, target, "low,mid,high")
    obj, head = eagle3_objective_and_head(target, data, 3)
    plain = FeatureDataset(data, noise="none")
    cached = FeatureDataset(data, noise="none")
    calls = []
    cached.attach_greedy(counting_module(target.model.lm_head, calls))
    batch = collate([plain[i] for i in range(4)])
    with_greedy = collate([cached[i] for i in range(4)])
    assert set(with_greedy) == set(batch) | {"greedy"}
    assert torch.equal(with_greedy["greedy"], target.model.lm_head(batch["target"]).argmax(-1))
    in_vocab = torch.isin(with_greedy["greedy"][batch["loss_mask"] > 0], obj.kept)
    assert 0 < int(in_vocab.sum()) < in_vocab.numel()  # both sides of the in-vocabulary mask occur
    loss, parts = obj.loss(head, batch)
    loss_c, parts_c = obj.loss(head, with_greedy)
    assert loss_c.item() == pytest.approx(loss.item(), rel=1e-5)
    assert parts_c == pytest.approx(parts, rel=1e-5)
    hits = [[t.tolist() for t in obj.accuracy(head, b, 3)] for b in (with_greedy, batch)]
    assert hits[0] == hits[1] and sum(hits[0][0]) > 0
    assert len(calls) == 4
    collate([cached[i] for i in range(4)])
    assert len(calls) == 4


def counting_module(module: torch.nn.Module, calls: list) -> torch.nn.Module:
    """``module`` behind a wrapper that records each call (same weight and bias attributes)."""
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module
            self.weight, self.bias = module.weight, module.bias

        def forward(self, x):
            calls.append(tuple(x.shape))
            return self.inner(x)

    return Counting()
