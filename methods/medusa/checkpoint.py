"""Medusa-1 heads' published checkpoint format (the heads: :mod:`methods.medusa.head`).

Checkpoint format, a folder with
    config.json                     medusa_num_heads, medusa_num_layers, base_model_name_or_path
                                    (+ medusa_share_lm_head, draftbench's, default false; + medusa_fc_bias: true,
                                    vLLM's name for the ResBlock bias, which it drops without it)
    medusa_lm_head.safetensors      (or medusa_lm_head.pt) with keys, for head i and ResBlock j < L:
                                    {i}.{j}.linear.weight [H, H], {i}.{j}.linear.bias [H], {i}.{L}.weight [V, H]
                                    (the last one absent when the lm_head is shared)
The original builds ``[ResBlock] * L``, one module repeated (weights tied when L > 1); its checkpoints still list every
``{i}.{j}`` key, so they load into the untied blocks used here. Loading is strict (names every bad key).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    check_target_sizes,
    int_field,
    read_config,
    read_weights,
)
from harness.models import Target
from methods.medusa.head import MedusaHeads

MEDUSA_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


def published_state_dict(heads: MedusaHeads) -> dict[str, torch.Tensor]:
    """The heads' weights under the published key names (``{i}.{j}.linear.weight`` ...)."""
    return {k.removeprefix("heads."): v for k, v in heads.state_dict().items()}


def expected_medusa_shapes(H: int, V: int, num_heads: int, num_layers: int, share_lm_head: bool) -> dict[str, tuple]:
    """Published key -> shape for these heads."""
    shapes: dict[str, tuple] = {}
    for i in range(num_heads):
        for j in range(num_layers):
            shapes[f"{i}.{j}.linear.weight"] = (H, H)
            shapes[f"{i}.{j}.linear.bias"] = (H,)
        if not share_lm_head:
            shapes[f"{i}.{num_layers}.weight"] = (V, H)
    return shapes


def load_medusa_heads(folder: str | Path, target: Target) -> MedusaHeads:
    """Load published-format Medusa heads for ``target`` (on its device and dtype); strict key and shape check."""
    folder = Path(folder)
    where = str(folder / "config.json")
    raw = read_config(folder, "Medusa heads")
    num_heads = int_field(raw, "medusa_num_heads", where, 1)
    num_layers = int_field(raw, "medusa_num_layers", where, 0)
    share = raw.get("medusa_share_lm_head", False)
    if not isinstance(share, bool):
        raise CheckpointError(f"{where}: medusa_share_lm_head must be true or false, got {share!r}")
    if raw.get("medusa_fc_bias", True) is not True:
        raise CheckpointError(f"{where}: medusa_fc_bias must be true (every ResBlock has a bias), got "
                              f"{raw['medusa_fc_bias']!r}")
    V, H = check_target_sizes(raw, target, where)
    sd, path = read_weights(folder, MEDUSA_WEIGHT_FILES, "Medusa heads")
    check_state_dict(sd, expected_medusa_shapes(H, V, num_heads, num_layers, share),
                     f"Medusa heads {path} (target {target.name!r}: hidden {H}, vocab {V})")
    heads = MedusaHeads(H, V, num_heads, num_layers, share)
    heads.heads.load_state_dict(sd, strict=True)
    return heads.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def save_medusa_heads(heads: MedusaHeads, folder: str | Path, base_model: str, dtype: torch.dtype = torch.float16,
                      fmt: str = "safetensors") -> Path:
    """Write ``heads`` in the published format; ``fmt`` = "safetensors" (as the Medusa trainer) or "pt" (legacy)."""
    if fmt not in ("safetensors", "pt"):
        raise ValueError(f"save_medusa_heads: fmt must be 'safetensors' or 'pt', got {fmt!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": base_model, "medusa_share_lm_head": heads.share_lm_head,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "medusa_fc_bias": True}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in published_state_dict(heads).items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(sd, folder / "medusa_lm_head.pt")
    return folder

