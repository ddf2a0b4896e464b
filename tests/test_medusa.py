"""Medusa heads: published checkpoint format (own and shared lm_head, .pt and .safetensors); method medusa."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from methods.eagle import CheckpointError
from methods.medusa import MedusaHeads, ResBlock, load_medusa_heads, save_medusa_heads
from tests.tiny import tiny_target

H, V = 32, 128  # tiny target: hidden, vocab


def published_medusa_folder(folder: Path, num_heads: int = 3, num_layers: int = 1, shared: bool = False,
                            fmt: str = "pt", seed: int = 1) -> dict[str, torch.Tensor]:
    """Write Medusa heads as the Medusa repository ships them (legacy ``medusa_lm_head.pt`` + config.json)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(num_heads):
        for j in range(num_layers):
            sd[f"{i}.{j}.linear.weight"] = torch.randn(H, H, generator=g) * 0.2
            sd[f"{i}.{j}.linear.bias"] = torch.randn(H, generator=g) * 0.2
        if not shared:
            sd[f"{i}.{num_layers}.weight"] = torch.randn(V, H, generator=g) * 0.2
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "tiny-llama"}
    if shared:
        config["medusa_share_lm_head"] = True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "pt":
        torch.save(sd, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file(sd, str(folder / "medusa_lm_head.safetensors"))
    return sd


@pytest.mark.parametrize("shared,fmt,num_layers", [(False, "pt", 1), (False, "safetensors", 2), (True, "pt", 1),
                                                   (True, "safetensors", 1)])
def test_published_heads_load_and_compute(tmp_path, shared, fmt, num_layers):
    """Head i = ResBlock^L then its own Linear(H->V) (or the target's lm_head when shared). Logits are compared
    with the formula written out; a missing residual, a wrong activation or using the wrong lm_head would differ."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path, num_layers=num_layers, shared=shared, fmt=fmt)
    heads = load_medusa_heads(tmp_path, target)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(9))
    logits = heads(x, target.model.lm_head)
    assert logits.shape == (3, 1, V)
    for i in range(3):
        h = x
        for j in range(num_layers):
            h = h + F.silu(F.linear(h, sd[f"{i}.{j}.linear.weight"], sd[f"{i}.{j}.linear.bias"]))
        w = target.model.lm_head.weight if shared else sd[f"{i}.{num_layers}.weight"]
        torch.testing.assert_close(logits[i], F.linear(h, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared,fmt", [(False, "safetensors"), (True, "pt")])
def test_save_round_trip(tmp_path, shared, fmt):
    """save_medusa_heads writes the published names (no lm_head weights when shared) and loads back equal."""
    target = tiny_target()
    torch.manual_seed(2)
    heads = MedusaHeads(H, V, num_heads=2, num_layers=1, share_lm_head=shared)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.2)
    save_medusa_heads(heads, tmp_path, base_model="tiny-llama", dtype=torch.float32, fmt=fmt)
    weights = "medusa_lm_head.safetensors" if fmt == "safetensors" else "medusa_lm_head.pt"
    assert (tmp_path / weights).is_file()
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"], cfg["base_model_name_or_path"]) == (2, 1, "tiny-llama")
    loaded = load_medusa_heads(tmp_path, target)
    x = torch.randn(3, H)
    torch.testing.assert_close(loaded(x, target.model.lm_head), heads(x, target.model.lm_head))


def test_fresh_resblock_is_identity():
    """The ResBlock weight is zero-initialised (Medusa's init), so a fresh head starts as the base lm_head on x +
    SiLU(bias); with the bias zeroed too the block must return x exactly."""
    block = ResBlock(4)
    torch.nn.init.zeros_(block.linear.bias)
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    assert torch.equal(block(x), x)
    assert torch.count_nonzero(block.linear.weight) == 0


def test_renamed_key_is_named(tmp_path):
    """A renamed key fails naming the missing and the unexpected key."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path)
    sd["1.0.lin.weight"] = sd.pop("1.0.linear.weight")
    torch.save(sd, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(CheckpointError, match=r"missing keys: 1\.0\.linear\.weight \(found 1\.0\.lin\.weight: renamed\?\)"):
        load_medusa_heads(tmp_path, target)


def test_missing_head_is_named(tmp_path):
    """config.json says 3 heads but the weights hold 2: the third head's keys are named as missing."""
    target = tiny_target()
    published_medusa_folder(tmp_path, num_heads=2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["medusa_num_heads"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing keys: 2\.0\.linear\.bias, 2\.0\.linear\.weight, 2\.1\.weight"):
        load_medusa_heads(tmp_path, target)


def test_shared_flag_with_own_lm_heads_fails(tmp_path):
    """Own lm_head weights in a folder that declares medusa_share_lm_head are unexpected keys, not silently ignored."""
    target = tiny_target()
    published_medusa_folder(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["medusa_share_lm_head"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unexpected keys: 0\.1\.weight, 1\.1\.weight, 2\.1\.weight"):
        load_medusa_heads(tmp_path, target)


def test_shape_mismatch_is_named(tmp_path):
    """Heads trained for a model with another vocabulary must not load; the message names the key and both shapes."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path)
    sd["0.1.weight"] = torch.zeros(100, H)
    torch.save(sd, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(CheckpointError, match=r"0\.1\.weight: checkpoint \[100, 32\] vs expected \[128, 32\]"):
        load_medusa_heads(tmp_path, target)


def test_bad_config_field_is_named(tmp_path):
    """A config without medusa_num_heads, or with a non-integer, fails naming the field."""
    target = tiny_target()
    published_medusa_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_layers": 1}))
    with pytest.raises(CheckpointError, match="missing field medusa_num_heads"):
        load_medusa_heads(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": "3", "medusa_num_layers": 1}))
    with pytest.raises(CheckpointError, match="medusa_num_heads must be an integer >= 1"):
        load_medusa_heads(tmp_path, target)
