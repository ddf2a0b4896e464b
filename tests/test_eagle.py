"""EAGLE head: published checkpoint format, architecture, draft KV handling; methods eagle1 / eagle2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engine.checkpoints import CheckpointError
from harness.engine.draftcache import DraftKV
from methods.eagle.checkpoint import load_eagle_head, save_eagle_head
from methods.eagle.head import EagleHead
from tests.support.helpers import assert_refused, tiny_target

H, V, I = 32, 128, 64  # tiny target: hidden, vocab, intermediate (see tests/support/helpers.py)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def published_eagle_folder(folder: Path, bias: bool = True, n_kv: int = 2, rope_theta: float | None = None,
                           with_embedding: bool = True, seed: int = 1, fmt: str = "bin") -> dict[str, torch.Tensor]:
    """Write an EAGLE checkpoint exactly as the EAGLE repository ships one (key names and shapes spelled out)."""
    g = torch.Generator().manual_seed(seed)
    n_heads, head_dim = 4, 8

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    sd = {
        "fc.weight": w(H, 2 * H),
        "layers.0.self_attn.q_proj.weight": w(n_heads * head_dim, H),
        "layers.0.self_attn.k_proj.weight": w(n_kv * head_dim, H),
        "layers.0.self_attn.v_proj.weight": w(n_kv * head_dim, H),
        "layers.0.self_attn.o_proj.weight": w(H, n_heads * head_dim),
        "layers.0.mlp.gate_proj.weight": w(I, H),
        "layers.0.mlp.up_proj.weight": w(I, H),
        "layers.0.mlp.down_proj.weight": w(H, I),
        "layers.0.post_attention_layernorm.weight": 1 + w(H),
    }
    if bias:
        sd["fc.bias"] = w(H)
    if with_embedding:
        sd["embed_tokens.weight"] = w(V, H)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": I,
              "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "num_hidden_layers": 1,
              "vocab_size": V, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "hidden_act": "silu"}
    if not bias:
        config["bias"] = False
    if rope_theta is not None:
        config["rope_theta"] = rope_theta
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "bin":
        torch.save(sd, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(sd, str(folder / "model.safetensors"))
    return sd


def reference_single_position(sd: dict[str, torch.Tensor], emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """The published head on ONE position (attention to itself only, so RoPE cancels), written out by hand:
    x = fc(cat(emb, f)); h = x + o(v(x)); out = h + down(silu(gate(n)) * up(n)), n = RMSNorm(h). No input norm,
    no final norm. With GQA each query head reads the value of its key head, which for one position is o(v) after
    repeating the value heads."""
    x = F.linear(torch.cat([emb, feature]), sd["fc.weight"], sd.get("fc.bias"))
    v = F.linear(x, sd["layers.0.self_attn.v_proj.weight"]).view(-1, 8)   # [n_kv, 8]
    n_heads = sd["layers.0.self_attn.q_proj.weight"].shape[0] // 8
    v = v.repeat_interleave(n_heads // v.shape[0], dim=0).reshape(-1)      # [n_heads * 8]
    h = x + F.linear(v, sd["layers.0.self_attn.o_proj.weight"])
    n = h * torch.rsqrt(h.pow(2).mean() + 1e-6) * sd["layers.0.post_attention_layernorm.weight"]
    gate = F.silu(F.linear(n, sd["layers.0.mlp.gate_proj.weight"]))
    mlp = F.linear(gate * F.linear(n, sd["layers.0.mlp.up_proj.weight"]), sd["layers.0.mlp.down_proj.weight"])
    return h + mlp


# ------------------------------------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("bias,n_kv,fmt", [(True, 2, "bin"), (False, 2, "safetensors"), (True, 4, "safetensors")])
def test_published_checkpoint_loads_and_matches_hand_written_head(tmp_path, bias, n_kv, fmt):
    """A published EAGLE folder (fc bias on/off, GQA 4 query heads over 2 KV heads or plain MHA) loads and the head
    computes fc(cat(EMBEDDING, feature)) -> attention -> post-attention norm + SwiGLU, no input/final norm. A swapped
    concat order, an input norm or a missing residual would change the output."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path, bias=bias, n_kv=n_kv, fmt=fmt)
    head = load_eagle_head(tmp_path, target)
    assert (head.fc.bias is not None) == bias
    assert not head.shares_target_embedding  # the shipped embedding differs from the tiny target's
    feature = torch.randn(H, generator=torch.Generator().manual_seed(5))
    out, kv = head(feature.view(1, 1, H), torch.tensor([[7]]), torch.tensor([[3]]))
    expected = reference_single_position(sd, sd["embed_tokens.weight"][7], feature)
    torch.testing.assert_close(out.view(H), expected, rtol=1e-5, atol=1e-5)
    assert kv.keys.shape == (1, n_kv, 1, 8)


def test_rope_theta_is_read_from_config(tmp_path):
    """LLaMA-3 heads set rope_theta=500000; ignoring it would rotate keys with the default base 10000."""
    target = tiny_target()
    published_eagle_folder(tmp_path, rope_theta=500000.0)
    head = load_eagle_head(tmp_path, target)
    # inv_freq[1] = base ** (-2 / head_dim) with head_dim 8
    assert head.rotary_emb.inv_freq[1].item() == pytest.approx(500000.0 ** (-0.25), rel=1e-6)


def test_missing_embedding_takes_the_targets(tmp_path):
    """EAGLE ships embed_tokens; draftbench heads do not. Without it the head must use the target's embedding."""
    target = tiny_target()
    published_eagle_folder(tmp_path, with_embedding=False)
    head = load_eagle_head(tmp_path, target)
    assert head.shares_target_embedding
    assert head.embed_tokens is target.model.get_input_embeddings()


def test_save_round_trip_without_embedding(tmp_path):
    """save_eagle_head writes the published keys (no embed_tokens when shared, fp16) and loads back to the same
    outputs up to fp16 rounding; a wrong key name or a dropped fc.bias would fail the strict load."""
    target = tiny_target()
    torch.manual_seed(3)
    head = EagleHead.for_target(target, bias=True)
    for p in head.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.2)
    save_eagle_head(head, tmp_path / "h")
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert "embed_tokens.weight" not in keys and "fc.bias" in keys and len(keys) == 10
    loaded = load_eagle_head(tmp_path / "h", target)
    f, ids, pos = torch.randn(1, 5, H), torch.tensor([[5, 6, 7, 8, 9]]), torch.arange(5).view(1, 5)
    torch.testing.assert_close(loaded(f, ids, pos)[0], head(f, ids, pos)[0], rtol=0, atol=2e-2)


def test_moving_a_head_leaves_the_shared_target_embedding_alone():
    """The default head shares the TARGET's embedding module; head.double() (or .half()) must not convert the
    target's embedding, or the target itself would break (a bf16 target fed fp32 embeddings)."""
    target = tiny_target()
    head = EagleHead.for_target(target).double()
    assert target.model.get_input_embeddings().weight.dtype == torch.float32
    assert head.fc.weight.dtype == torch.float64
    out, _ = head(torch.zeros(1, 2, H, dtype=torch.float64), torch.tensor([[1, 2]]), torch.tensor([[0, 1]]))
    assert out.dtype == torch.float64


def test_llama3_rope_scaling_round_trip(tmp_path):
    """A LLaMA-3.1-style head (rope_scaling llama3, rope_theta 500000) saves and loads with the same RoPE."""
    from methods.eagle.head import eagle_config_for

    target = tiny_target()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    config = eagle_config_for(target.config, rope_theta=500000.0, rope_scaling=scaling)
    head = EagleHead(config, target.model.get_input_embeddings())
    save_eagle_head(head, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_theta"] == 500000.0 and saved["rope_scaling"]["rope_type"] == "llama3"
    loaded = load_eagle_head(tmp_path, target)
    torch.testing.assert_close(loaded.rotary_emb.inv_freq, head.rotary_emb.inv_freq)


def test_renamed_key_is_named(tmp_path):
    """A renamed key must fail naming both the missing and the unexpected name (strict=False would keep random
    weights silently)."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    sd["layers.0.mlp.gate.weight"] = sd.pop("layers.0.mlp.gate_proj.weight")
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_eagle_head, target,
                   r"missing keys: layers\.0\.mlp\.gate_proj\.weight \(found "
                   r"layers\.0\.mlp\.gate\.weight: renamed\?\)")


def test_missing_key_is_named(tmp_path):
    """fc.bias is required unless config.json says bias: false."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    del sd["fc.bias"]
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_eagle_head, target,
                   r"missing keys: fc\.bias")


def test_shape_mismatch_is_named(tmp_path):
    """An MLP trained with another intermediate size must not load."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    sd["layers.0.mlp.up_proj.weight"] = torch.zeros(48, H)
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_eagle_head, target,
                   r"layers\.0\.mlp\.up_proj\.weight: checkpoint \[48, 32\] vs expected \[64, 32\]")


def test_head_for_another_target_fails(tmp_path):
    """A head whose hidden size differs from the target's must fail at load with both sizes in the message."""
    target = tiny_target()
    published_eagle_folder(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"hidden_size=64.*hidden_size=32"):
        load_eagle_head(tmp_path, target)


def test_missing_folder_and_weights(tmp_path):
    """No folder / no weights file: the error says which folder and which file names were expected."""
    target = tiny_target()
    with pytest.raises(CheckpointError, match="does not exist"):
        load_eagle_head(tmp_path / "nope", target)
    published_eagle_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match=r"expected one of: model\.safetensors, pytorch_model\.bin"):
        load_eagle_head(tmp_path, target)


class RunsCode:
    """A pickle payload: unpickling it would call os.system."""

    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


def test_unreadable_weights_are_one_checkpoint_error_naming_the_file(tmp_path):
    """A model.safetensors of random bytes and a pytorch_model.bin holding a pickle that would run code ended in a
    traceback from safetensors / torch.load (the second refused by weights_only, but still a traceback)."""
    import pickle

    target = tiny_target()
    published_eagle_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": RunsCode()}))
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: not a readable torch weights file "
                                              r"\(UnpicklingError: "):
        load_eagle_head(tmp_path, target)
    (tmp_path / "pytorch_model.bin").unlink()
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors weights file"):
        load_eagle_head(tmp_path, target)


# ------------------------------------------------------------------------------------------------ draft KV


def test_stable_kv_plus_tree_continuation_equals_full_sequence(tmp_path):
    """Pins the draft KV handling: committed positions run once into a stable KV, then two tree nodes (siblings at
    the same position, each seeing the prefix and itself) run on a temporary continuation. Each node's output must
    equal running the whole sequence prefix + that node from scratch, and the stable KV must be unchanged."""
    target = tiny_target()
    published_eagle_folder(tmp_path)
    head = load_eagle_head(tmp_path, target)
    g = torch.Generator().manual_seed(0)
    feats, ids = torch.randn(1, 6, H, generator=g), torch.tensor([[3, 9, 14, 27, 40, 51]])
    pos = torch.arange(6).view(1, 6)
    _, stable = head(feats[:, :4], ids[:, :4], pos[:, :4])
    stable_keys = stable.keys.clone()
    node_feats, node_ids = feats[:, 4:6], ids[:, 4:6]
    mask = torch.tensor([[True] * 4 + [True, False], [True] * 4 + [False, True]])  # siblings: prefix + self
    tree_out, cont = head(node_feats, node_ids, torch.tensor([[4, 4]]), stable, mask)
    assert cont.length == 6 and stable.length == 4
    torch.testing.assert_close(stable.keys, stable_keys, rtol=0, atol=0)
    for j in range(2):
        seq_f = torch.cat([feats[:, :4], node_feats[:, j:j + 1]], 1)
        seq_i = torch.cat([ids[:, :4], node_ids[:, j:j + 1]], 1)
        full, _ = head(seq_f, seq_i, pos[:, :5])
        torch.testing.assert_close(tree_out[:, j], full[:, 4], rtol=1e-5, atol=1e-5)


def test_draft_kv_crop_and_extend():
    """DraftKV is immutable: extend returns a longer copy; crop keeps the first positions; bad lengths fail."""
    kv = DraftKV(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    longer = kv.extend(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    assert (kv.length, longer.length, longer.crop(1).length) == (3, 5, 1)
    with pytest.raises(ValueError, match=r"length must be in \[0, 3\]"):
        kv.crop(4)


# ------------------------------------------------------------------------------------------------ methods

from harness.engine.autotune import (  # noqa: E402
    EAGLE_TREE_GAINS,
    AcceptanceCalibration,
    adaptive_sizes,
    bench_tree_parents,
    best_tree_size,
    choose_tree_size,
    expected_rate,
    time_tree_sizes,
    worth_another_level,
)
from harness.engine.method import OptionsError  # noqa: E402
from harness.engine.sampling import SamplingParams, logits_to_probs  # noqa: E402
from harness.registry import get_method  # noqa: E402
from methods.eagle.eagle1 import Eagle1, Eagle1Options  # noqa: E402
from methods.eagle.eagle2 import Eagle2, Eagle2Options  # noqa: E402
from methods.vanilla import Vanilla  # noqa: E402
from tests.support.helpers import GREEDY, bigram_target  # noqa: E402
from tests.support.helpers import random_eagle_head as random_head  # noqa: E402

PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])


def oracle_eagle_head(target) -> EagleHead:
    """fc = [10 I | 0] (keeps the EMBEDDING half), attention and MLP outputs zero: the head outputs 10 E[x_{t+1}],
    whose lm_head logits are 10 * onehot(g(x_{t+1})): the target's next token x_{t+2} with probability 0.9986
    (confident enough that EAGLE-2's re-ranking keeps the whole rank-0 chain)."""
    head = EagleHead.for_target(target)
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([10 * torch.eye(32), torch.zeros(32, 32)], dim=1))
        head.fc.bias.zero_()
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    return head.eval().requires_grad_(False)


def eagle1(target, head, **options) -> Eagle1:
    return Eagle1(target, Eagle1Options(**options), head=head)


def eagle2(target, head, **options) -> Eagle2:
    return Eagle2(target, Eagle2Options(**options), head=head)


@pytest.mark.parametrize("make", [eagle1, eagle2], ids=["eagle1", "eagle2"])
def test_greedy_equals_vanilla_with_a_random_head(make):
    """Whatever a random head proposes, greedy output must be vanilla's, token for token (lossless at T=0)."""
    target = tiny_target(eos=False)
    expected = Vanilla(target).generate(PROMPT, 40, GREEDY).token_ids
    gen = make(target, random_head(target)).generate(PROMPT, 40, GREEDY)
    assert gen.token_ids == expected


@pytest.mark.parametrize("make,per_step", [(eagle1, 6), (eagle2, 7)], ids=["eagle1", "eagle2"])
def test_oracle_head_is_fully_accepted(make, per_step):
    """With a head that predicts the bigram target exactly, every step accepts the whole rank-0 path: 5 drafts + 1
    bonus for eagle1's mc_sim_7b_63 (depth 5), 6 + 1 for eagle2 (depth 5 -> 6 levels). A wrong feature/token
    pairing, a wrong position or a wrong tree mask in the draft would break the chain."""
    target, _, g = bigram_target()
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    gen = make(target, oracle_eagle_head(target)).generate(prompt, 1 + 3 * per_step, GREEDY)
    x = int(prompt[0, -1])
    expected = []
    for _ in range(1 + 3 * per_step):
        x = g[x]
        expected.append(x)
    assert gen.token_ids == expected
    assert gen.accept_lengths == [1] + [per_step] * 3


def test_eagle2_runs_depth_plus_one_draft_forwards_per_cycle():
    """EAGLE-2: one stable-KV forward plus one per depth level, every cycle (arXiv:2406.16858 Sec. 4)."""
    target = tiny_target(eos=False)
    gen = eagle2(target, random_head(target), depth=3, top_k=4, total_tokens=20).generate(PROMPT, 12, GREEDY)
    cycles = gen.counters["target_forwards"] - 1  # the prefill proposes nothing
    assert gen.counters["draft_forwards"] == 4 * cycles


def test_eagle1_runs_one_draft_forward_per_expanded_level():
    """mc_sim_7b_63 has non-leaf nodes on levels 1-4, so a cycle is 1 stable forward + 4 tree forwards."""
    target = tiny_target(eos=False)
    gen = eagle1(target, random_head(target)).generate(PROMPT, 12, GREEDY)
    assert gen.counters["draft_forwards"] == 5 * (gen.counters["target_forwards"] - 1)


def scratch_log_probs(method, head, prompt_feats, prompt_ids, root, chain) -> torch.Tensor:
    """Draft log-probs after ``root`` followed by the draft tokens ``chain``, computed from scratch without any KV:
    the committed pairs (f_t, x_{t+1}) then, for each chain token, the pair (previous predicted feature, token)."""
    feats, ids = prompt_feats, torch.cat([prompt_ids[0, 1:], torch.tensor([root])])

    def forward():  # [S, H] predicted features for the pairs so far
        return head(feats[None], ids[None], torch.arange(ids.shape[0])[None])[0][0]

    out = forward()
    for tok in chain:
        feats = torch.cat([feats, out[-1:]])
        ids = torch.cat([ids, torch.tensor([tok])])
        out = forward()
    return method.log_probs(out[-1])


def test_eagle2_candidates_equal_a_from_scratch_computation():
    """Every candidate EAGLE-2 records (k + depth*k^2 of them) must carry the cumulative draft log-prob that a
    from-scratch run of the head along its ancestor chain gives, and its parent must be the frontier node it was
    expanded from. This pins the stable/temporary KV split, the draft-side tree mask, the position ids and the
    rule that a node's input feature is its parent's output."""
    target = tiny_target(eos=False)
    head = random_head(target, seed=4)
    method = eagle2(target, head, depth=2, top_k=3, total_tokens=8)
    with torch.inference_mode():
        hidden = target.model(PROMPT, output_hidden_states=True).hidden_states[-1][0]  # [P, H]
        method.counters = {"draft_forwards": 0}
        method.begin(PROMPT, hidden)
        cands = method.expand(root=17)
        assert cands.tokens.shape == (3 + 2 * 9,) and method.counters["draft_forwards"] == 3
        for c in range(cands.tokens.shape[0]):
            chain, node = [], int(cands.parents[c])
            while node >= 0:
                chain.insert(0, int(cands.tokens[node]))
                node = int(cands.parents[node])
            parent_score = float(cands.scores[int(cands.parents[c])]) if cands.parents[c] >= 0 else 0.0
            lp = scratch_log_probs(method, head, hidden, PROMPT, 17, chain)
            assert float(cands.scores[c]) == pytest.approx(parent_score + float(lp[cands.tokens[c]]), abs=1e-4)
        # level-2 candidates hang below level-1 candidates, level-3 ones below level-2 candidates
        assert cands.parents[:3].tolist() == [-1, -1, -1]
        assert set(cands.parents[3:12].tolist()) == {0, 1, 2}
        assert all(3 <= p < 12 for p in cands.parents[12:].tolist())


def test_eagle1_sampled_children_and_draft_probs():
    """At T>0 eagle1 draws each node's children without replacement from the draft distribution and reports that
    distribution in draft_probs (row 0 = the root's); siblings are distinct. With top_k=1 sampling the draft
    distribution has one token, so only the rank-0 path survives (a chain of depth 5)."""
    target = tiny_target(eos=False)
    head = random_head(target, seed=6)
    method = eagle1(target, head)
    sampling = SamplingParams(temperature=0.8)
    with torch.inference_mode():
        hidden = target.model(PROMPT, output_hidden_states=True).hidden_states[-1][0]
        method.counters = {"draft_forwards": 0}
        method.begin(PROMPT, hidden)
        tree = method.propose(17, sampling, torch.Generator().manual_seed(0))
        assert method.proposal == "sampled" and tree.draft_probs.shape == (26, V)
        h0 = scratch_log_probs(method, head, hidden, PROMPT, 17, [])
        torch.testing.assert_close(tree.draft_probs[0], logits_to_probs(h0, sampling), rtol=1e-4, atol=1e-6)
        root_kids = tree.tokens[tree.parents == -1]
        assert root_kids.unique().numel() == 4
        assert (tree.draft_probs[0][root_kids] > 0).all()

        method.begin(PROMPT, hidden)
        chain = method.propose(17, SamplingParams(temperature=0.8, top_k=1), torch.Generator().manual_seed(0))
        assert chain.parents.tolist() == [-1, 0, 1, 2, 3]
        assert chain.tokens[0] == h0.argmax()

        method.begin(PROMPT, hidden)
        greedy = method.propose(17, GREEDY, None)
        assert method.proposal == "deterministic" and greedy.draft_probs is None and len(greedy) == 25


def test_options_are_validated():
    """Bad options fail at construction naming the field."""
    with pytest.raises(OptionsError, match="total_tokens must be >= 2"):
        Eagle2.create(tiny_target(), {"total_tokens": 1})
    with pytest.raises(OptionsError, match="top_k must be >= 1"):
        Eagle2.create(tiny_target(), {"top_k": 0})
    with pytest.raises(OptionsError, match=r"children of node 0 have ranks \[1\]; they must be 0..0"):
        Eagle1.create(tiny_target(), {"tree": [[0], [0, 1]]})
    with pytest.raises(OptionsError, match="unknown tree 'nope'"):
        Eagle1.create(tiny_target(), {"tree": "nope"})


def test_missing_shipped_head_says_how_to_train_one():
    """No head option and no shipped head for this target: the error names the folder looked in and the command."""
    with pytest.raises(CheckpointError,
                       match=r"no eagle head is shipped for target 'tiny-llama'.*draftbench train eagle"):
        get_method("eagle2").create(tiny_target())


# ------------------------------------------------------------------------------------------------ sampling
# eagle1 and eagle2 at T > 0 (the joint of the first three tokens against the target's, chi-square): the registry-wide
# tests/test_lossless.py::test_sampling_matches_the_target_distribution, with the same small trees, head and samples.


# ------------------------------------------------------------------------------------------------ autotune


def test_choose_tree_size_is_eagles_rule():
    """argmin time/gain with EAGLE's gains {40: 1, 48: 1.05, 50: 1.07, 56: 1.1, 60: 1.13}: 60 wins when its forward
    costs less than 13% more than 40's, 40 wins otherwise; sizes without a gain are refused."""
    assert EAGLE_TREE_GAINS == {40: 1.0, 48: 1.05, 50: 1.07, 56: 1.1, 60: 1.13}
    assert choose_tree_size({40: 1.0, 48: 1.1, 50: 1.2, 56: 1.2, 60: 1.1}) == 60   # 1.1/1.13 = 0.973
    assert choose_tree_size({40: 1.0, 48: 1.2, 50: 1.2, 56: 1.2, 60: 1.2}) == 40   # 1.2/1.13 = 1.062
    assert choose_tree_size({8: 3.0, 16: 4.0}, gains={8: 1.0, 16: 1.5}) == 16
    with pytest.raises(ValueError, match=r"no gain for tree size\(s\) \[64\]"):
        choose_tree_size({40: 1.0, 64: 1.0})


def test_bench_tree_parents_literal():
    """Breadth-first tree with 10 children per node, like EAGLE's top_k=10 trees."""
    assert bench_tree_parents(5, branching=2).tolist() == [-1, -1, 0, 0]
    assert bench_tree_parents(13).tolist() == [-1] * 10 + [0, 0]


def test_time_tree_sizes_times_every_size_once_per_process():
    """Every requested size gets a positive time; a second call is served from the per-model cache (the model is
    not run again), so eagle2 with total_tokens=-1 times the target only once per process."""
    target = tiny_target(eos=False)
    first = time_tree_sizes(target, sizes=(4, 9), repeats=1, context_len=8)
    assert sorted(first) == [4, 9] and all(v > 0 for v in first.values())
    calls = []
    hook = target.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert time_tree_sizes(target, sizes=(4, 9), repeats=1, context_len=8) == first
    finally:
        hook.remove()
    assert calls == []


def test_eagle2_automatic_tree_size(monkeypatch):
    """total_tokens=-1 takes the size chosen from the timings and records it in the turn's counters."""
    import harness.engine.autotune as autotune

    monkeypatch.setattr(autotune, "time_tree_sizes",
                        lambda target, runtime="eager": {40: 1.0, 48: 1.0, 50: 1.0, 56: 1.0, 60: 1.02})
    target = tiny_target(eos=False)
    gen = eagle2(target, random_head(target), total_tokens=-1).generate(PROMPT, 4, GREEDY)
    assert gen.counters["total_tokens"] == 60
    assert gen.counters["tree_tokens"] <= 59 * (gen.counters["target_forwards"] - 1)


def test_best_tree_size_worked_example():
    """The docstring's example: (1 + sum of the n-1 best p) / (draft + verify(n)) -> size 2 (1.27 vs 1.25 for 4);
    doubling the calibration makes size 4 worth its cost; a size needing more candidates than exist is skipped."""
    verify = {1: 1.0, 2: 1.0, 4: 1.5}
    assert best_tree_size([0.9, 0.5, 0.1], verify, draft_s=0.5) == 2
    assert best_tree_size([0.9, 0.5, 0.1], verify, draft_s=0.5, calibration=2.0) == 4
    assert best_tree_size([0.9], verify, draft_s=0.5) == 2            # size 4 would need 3 candidates
    assert best_tree_size([0.0, 0.0, 0.0], verify, draft_s=0.5) == 1  # nothing expected: ties go to the smallest
    with pytest.raises(ValueError, match="no verification timings"):
        best_tree_size([0.5], {}, draft_s=0.1)


def test_adaptive_sizes_and_calibration_literal():
    """Sizes up to the cap (the cap included); the calibration is the ratio of totals with a prior of 4 predicted
    drafts at factor 1: after (2.0 predicted, 1 accepted) and (1.0, 0) it is (4 + 1) / (4 + 3)."""
    assert adaptive_sizes(7) == (1, 2, 3, 4, 5, 6, 7)
    assert adaptive_sizes(16) == (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
    calibration = AcceptanceCalibration()
    assert calibration.factor == 1.0
    calibration.update(2.0, 1)
    calibration.update(1.0, 0)
    assert calibration.factor == pytest.approx(5 / 7)


def adaptive_run(monkeypatch, timings, budget: int):
    """eagle2 (random head, cap 12 slots, depth 3, top-4, adaptive) on the tiny target with the verification timings
    ``timings(sizes) -> {size: seconds}`` in place of measured ones: (generation, vanilla's tokens, steps)."""
    import harness.engine.autotune as autotune

    monkeypatch.setattr(autotune, "time_tree_sizes", lambda target, sizes, runtime="eager": timings(sizes))
    target = tiny_target(eos=False)
    expected = Vanilla(target).generate(PROMPT, budget, GREEDY).token_ids
    gen = eagle2(target, random_head(target), total_tokens=12, depth=3, top_k=4, adaptive=True).generate(
        PROMPT, budget, GREEDY)
    return gen, expected, gen.counters["target_forwards"] - 1


@pytest.mark.parametrize("costs,per_step", [("flat", 11), ("steep", 0)], ids=["flat-costs", "steep-costs"])
def test_adaptive_tree_follows_the_measured_costs_and_stays_lossless(monkeypatch, costs, per_step):
    """adaptive=true with verification costs that do not grow with the size verifies the whole cap (12 slots, 11
    drafts) every step; with costs that make any draft slot 100x dearer it verifies the root alone (no draft
    token). Either way the output is vanilla's: the size decides what is verified, never what is emitted."""
    gen, expected, steps = adaptive_run(
        monkeypatch, lambda sizes: {s: 1.0 if costs == "flat" or s == 1 else 100.0 for s in sizes}, 30)
    assert gen.token_ids == expected
    assert gen.counters["tree_tokens"] == per_step * steps
    assert gen.counters["adaptive_slots"] == (per_step + 1) * steps


def test_lookup_options_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="lookup must be an integer >= 0"):
        Eagle2Options(lookup=-1)
    with pytest.raises(ValueError, match="lookup must be an integer >= 0"):
        Eagle2Options(lookup=True)
    with pytest.raises(ValueError, match="lookup_ngram must be an integer in 1..3"):
        Eagle2Options(lookup=4, lookup_ngram=4)
    with pytest.raises(ValueError, match="lookup_alone must be 0 .* in 2..3"):
        Eagle2Options(lookup=4, lookup_ngram=2, lookup_alone=1)
    with pytest.raises(ValueError, match="lookup_alone needs a lookup chain"):
        Eagle2Options(lookup_alone=2)
    assert Eagle2Options(lookup=10, lookup_ngram=2, lookup_alone=3).lookup_alone == 3


def test_adaptive_needs_an_explicit_cap():
    """adaptive sizes up to total_tokens, so the automatic total_tokens=-1 is refused with the reason."""
    with pytest.raises(ValueError, match="give total_tokens >= 2"):
        Eagle2Options(total_tokens=-1, adaptive=True)
    with pytest.raises(ValueError, match="adaptive must be true or false"):
        Eagle2Options(adaptive="yes")


def test_worth_another_level_and_expected_rate_literal():
    """The docstrings' examples: a level whose best case adds 0.4 tokens for 4 ms (100/s) beats a 50/s step, one
    adding 0.15 (37.5/s) does not; nothing measured yet always drafts on."""
    assert worth_another_level(0.4, 0.004, rate=50.0)
    assert not worth_another_level(0.15, 0.004, rate=50.0)
    assert worth_another_level(0.15, 0.004, rate=50.0, calibration=2.0)
    assert worth_another_level(0.0, 0.004, rate=None)
    assert expected_rate([0.9, 0.5, 0.1], 2, 1.0, 0.5) == pytest.approx(1.9 / 1.5)


def test_adaptive_depth_stops_drafting_when_a_level_cannot_pay(monkeypatch):
    """With an expected rate so high that no level can beat it (verification measured at 1 ns), eagle2 stops after
    the stable forward at every step but the first (nothing is measured before it): 1 draft forward per step
    instead of depth + 1 = 4. A rule that ignored the costs would run 4 every step; the output is still vanilla's."""
    gen, expected, steps = adaptive_run(monkeypatch, lambda sizes: {s: 1e-9 for s in sizes}, 20)
    assert gen.token_ids == expected
    assert gen.counters["draft_forwards"] == 4 + (steps - 1)
