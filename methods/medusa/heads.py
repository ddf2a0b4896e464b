"""Medusa-1: extra heads on the target's last feature and their published checkpoint format.

Heads (Medusa-1, arXiv:2401.10774 Sec. 2.1.1; released code ``medusa/model/medusa_model.py``): head i = ``ResBlock ×
medusa_num_layers`` then ``Linear(H -> V, no bias)``, with
``ResBlock(x) = x + SiLU(Linear_HxH(x))`` (weight zero-initialised). With ``medusa_share_lm_head: true`` (draftbench's
own flag, for small targets whose V x H heads would outweigh the model) every head ends in the target's lm_head
instead. Head i reads the target's post-norm feature at the last committed position and predicts the token i+1
places after the pending root.

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
import torch.nn.functional as F
from torch import nn

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    check_target_sizes,
    int_field,
    read_config,
    read_weights,
)
from harness.models import Target

MEDUSA_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class ResBlock(nn.Module):
    """``x + SiLU(linear(x))`` with the linear weight zero-initialised (so a fresh block is the identity).

    With ``in_features`` != ``hidden_size`` (Hydra's first block, whose input is wider than its output) the skip
    path is a learned ``res_connection = Linear(in_features -> hidden_size)``: ``res_connection(x) + SiLU(linear(x))``.
    """

    def __init__(self, hidden_size: int, in_features: int | None = None):
        super().__init__()
        in_features = hidden_size if in_features is None else in_features
        self.linear = nn.Linear(in_features, hidden_size)
        nn.init.zeros_(self.linear.weight)
        if in_features != hidden_size:
            self.res_connection = nn.Linear(in_features, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.res_connection(x) if hasattr(self, "res_connection") else x
        return skip + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads. ``forward(hidden [B, H], lm_head) -> logits [num_heads, B, V]``.

    ``lm_head`` (the target's) is used only when ``share_lm_head``; it is never registered here, so the state dict
    holds only the heads' own weights (under ``heads.``; :func:`published_state_dict` drops that prefix).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"MedusaHeads: need num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.share_lm_head = num_heads, num_layers, share_lm_head

        def head() -> nn.Sequential:
            blocks: list[nn.Module] = [ResBlock(hidden_size) for _ in range(num_layers)]
            if not share_lm_head:
                blocks.append(nn.Linear(hidden_size, vocab_size, bias=False))
            return nn.Sequential(*blocks)

        self.heads = nn.ModuleList([head() for _ in range(num_heads)])

    def own_lm_heads(self) -> list[nn.Module]:
        """The heads' own ``Linear(H -> V)`` layers (none when they share the target's lm_head)."""
        return [] if self.share_lm_head else [h[-1] for h in self.heads]

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Logits [num_heads, B, V] of every head on hidden [B, H]."""
        if self.share_lm_head and lm_head is None:
            raise ValueError("MedusaHeads: share_lm_head is set, so forward needs the target's lm_head")
        outs = [h(hidden) for h in self.heads]  # each [B, V] or [B, H]
        if self.share_lm_head:
            outs = [lm_head(o) for o in outs]
        return torch.stack(outs)


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

