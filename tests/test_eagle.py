"""EAGLE head: published checkpoint format, architecture, draft KV handling; methods eagle1 / eagle2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from methods.eagle import CheckpointError, DraftKV, EagleHead, load_eagle_head, save_eagle_head
from tests.tiny import tiny_target

H, V, I = 32, 128, 64  # tiny target: hidden, vocab, intermediate (see tests/tiny.py)


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
    mlp = F.linear(F.silu(F.linear(n, sd["layers.0.mlp.gate_proj.weight"])) * F.linear(n, sd["layers.0.mlp.up_proj.weight"]),
                   sd["layers.0.mlp.down_proj.weight"])
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


def test_renamed_key_is_named(tmp_path):
    """A renamed key must fail naming both the missing and the unexpected name (strict=False would keep random
    weights silently)."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    sd["layers.0.mlp.gate.weight"] = sd.pop("layers.0.mlp.gate_proj.weight")
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"missing keys: layers\.0\.mlp\.gate_proj\.weight \(found "
                                              r"layers\.0\.mlp\.gate\.weight: renamed\?\)"):
        load_eagle_head(tmp_path, target)


def test_missing_key_is_named(tmp_path):
    """fc.bias is required unless config.json says bias: false."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    del sd["fc.bias"]
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"missing keys: fc\.bias"):
        load_eagle_head(tmp_path, target)


def test_shape_mismatch_is_named(tmp_path):
    """An MLP trained with another intermediate size must not load."""
    target = tiny_target()
    sd = published_eagle_folder(tmp_path)
    sd["layers.0.mlp.up_proj.weight"] = torch.zeros(48, H)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"layers\.0\.mlp\.up_proj\.weight: checkpoint \[48, 32\] vs expected \[64, 32\]"):
        load_eagle_head(tmp_path, target)


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
