"""Hydra heads: sequentially dependent Medusa heads, and their published checkpoint format.

Heads (Hydra, arXiv:2402.05109 Sec. 3; released code ``hydra/model/hydra_heads/mlp_head.py``, ``grounded_heads``):
head i (0-based) reads the target's post-norm feature h at the last committed position together with the input
embeddings of the i + 1 tokens after it on the candidate path (the pending root and the i tokens drafted by heads
0..i-1) and predicts the next one:
``head_i([h, E(root), E(d_1), ..., E(d_i)]) -> logits over d_{i+1}``. A head is
``ResBlock(in=(i+2)H -> H)`` (its skip path a learned ``res_connection`` Linear, since input and output widths
differ) then ``ResBlock(H) x (hydra_num_layers - 1)``, then its own ``Linear(H -> V, bias)``. With
``hydra_share_lm_head: true`` (draftbench's own flag, as for Medusa: a small target's V x H heads would outweigh the
model) every head ends in the target's lm_head instead.

Checkpoint format, a folder with (as ``HydraConfig.save_pretrained`` and the Hydra trainer's ``_save`` write it)
    config.json          hydra_num_heads, hydra_num_layers, hydra_head_arch ("mlp"), grounded_heads (true),
                         hidden_state_offset (0), base_model_name_or_path (+ draftbench's hydra_share_lm_head,
                         default false, hidden_size, vocab_size)
    hydra_lm_head.pt     the heads' state dict: for head i and block j (1 <= j < L)
                         hydra_mlp.{i}.0.linear.{weight [H, (i+2)H], bias [H]},
                         hydra_mlp.{i}.0.res_connection.{weight [H, (i+2)H], bias [H]},
                         hydra_mlp.{i}.{j}.linear.{weight [H, H], bias [H]},
                         hydra_lm_head.{i}.{weight [V, H], bias [V]} (absent when the lm_head is shared),
                         and, in the released trainer's files, input_embed_fn.weight [V, H] (the base model's input
                         embedding, registered by accident as a submodule; read and checked here, never used, not
                         written).
The original repeats one ResBlock module for blocks 1..L-1 (weights tied when L > 2); its checkpoints list every key,
so they load into the untied blocks used here. Other ``hydra_head_arch`` values (prefix-mlp, cross-attn,
eagle-attn), ``grounded_heads: false`` (plain Medusa heads) and ``hidden_state_offset`` != 0 are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
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
from methods.medusa.heads import ResBlock

HYDRA_WEIGHT_FILES = ("hydra_lm_head.pt", "hydra_lm_head.safetensors")


class HydraHeads(nn.Module):
    """``num_heads`` Hydra heads. ``forward(i, x [..., (i+2)H], lm_head) -> logits [..., V]`` of head ``i``.

    ``lm_head`` (the target's) is used only when ``share_lm_head``; it is never registered here, so the state dict
    holds exactly the published keys (``hydra_mlp.*``, ``hydra_lm_head.*``).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"HydraHeads: need num_heads >= 1 and num_layers >= 1, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.share_lm_head = num_heads, num_layers, share_lm_head
        H = hidden_size
        self.hydra_mlp = nn.ModuleList([
            nn.Sequential(ResBlock(H, (i + 2) * H), *[ResBlock(H) for _ in range(num_layers - 1)])
            for i in range(num_heads)])
        if not share_lm_head:
            self.hydra_lm_head = nn.ModuleList([nn.Linear(H, vocab_size) for _ in range(num_heads)])

    def own_lm_heads(self) -> list[nn.Module]:
        """The heads' own ``Linear(H -> V)`` layers (none when they share the target's lm_head)."""
        return [] if self.share_lm_head else list(self.hydra_lm_head)

    def forward(self, i: int, x: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Logits ``[..., V]`` (or the lm_head's width) of head ``i`` on x ``[..., (i+2)H]``."""
        hidden = self.hydra_mlp[i](x)  # [..., H]
        if self.share_lm_head:
            if lm_head is None:
                raise ValueError("HydraHeads: share_lm_head is set, so forward needs the target's lm_head")
            return lm_head(hidden)
        return self.hydra_lm_head[i](hidden)


def expected_hydra_shapes(H: int, V: int, num_heads: int, num_layers: int, share_lm_head: bool) -> dict[str, tuple]:
    """Published key -> shape for these heads (without the unused ``input_embed_fn.weight``)."""
    shapes: dict[str, tuple] = {}
    for i in range(num_heads):
        for part in ("linear", "res_connection"):
            shapes[f"hydra_mlp.{i}.0.{part}.weight"] = (H, (i + 2) * H)
            shapes[f"hydra_mlp.{i}.0.{part}.bias"] = (H,)
        for j in range(1, num_layers):
            shapes[f"hydra_mlp.{i}.{j}.linear.weight"] = (H, H)
            shapes[f"hydra_mlp.{i}.{j}.linear.bias"] = (H,)
        if not share_lm_head:
            shapes[f"hydra_lm_head.{i}.weight"] = (V, H)
            shapes[f"hydra_lm_head.{i}.bias"] = (V,)
    return shapes


def _check_config(raw: dict, where: str) -> None:
    """The published fields draftbench runs only at one value: anything else is refused in one line."""
    for key, want in (("hydra_head_arch", "mlp"), ("grounded_heads", True), ("hidden_state_offset", 0)):
        if raw.get(key, want) != want:
            raise CheckpointError(f"{where}: {key}={raw[key]!r} is not supported (draftbench runs Hydra's "
                                  f"{key}={json.dumps(want)} heads only)")


def load_hydra_heads(folder: str | Path, target: Target) -> HydraHeads:
    """Load published-format Hydra heads for ``target`` (on its device and dtype); strict key and shape check; a
    checkpoint for another hidden size or vocabulary is refused in one line naming both."""
    folder = Path(folder)
    where = str(folder / "config.json")
    raw = read_config(folder, "Hydra heads")
    num_heads = int_field(raw, "hydra_num_heads", where, 1)
    num_layers = int_field(raw, "hydra_num_layers", where, 1)
    _check_config(raw, where)
    share = raw.get("hydra_share_lm_head", False)
    if not isinstance(share, bool):
        raise CheckpointError(f"{where}: hydra_share_lm_head must be true or false, got {share!r}")
    V, H = check_target_sizes(raw, target, where)
    sd, path = read_weights(folder, HYDRA_WEIGHT_FILES, "Hydra heads")
    shapes = {**expected_hydra_shapes(H, V, num_heads, num_layers, share), "input_embed_fn.weight": (V, H)}
    check_state_dict(sd, shapes, f"Hydra heads {path} (target {target.name!r}: hidden {H}, vocab {V})",
                     optional=frozenset({"input_embed_fn.weight"}))
    sd.pop("input_embed_fn.weight", None)
    heads = HydraHeads(H, V, num_heads, num_layers, share)
    heads.load_state_dict(sd, strict=True)
    return heads.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def save_hydra_heads(heads: HydraHeads, folder: str | Path, base_model: str,
                     dtype: torch.dtype = torch.float16) -> Path:
    """Write ``heads`` in the published format (``config.json`` + ``hydra_lm_head.pt``, what the Hydra loader
    reads)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"hydra_num_heads": heads.num_heads, "hydra_num_layers": heads.num_layers, "hydra_head_arch": "mlp",
              "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": base_model,
              "hydra_share_lm_head": heads.share_lm_head, "hidden_size": heads.hidden_size,
              "vocab_size": heads.vocab_size}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in heads.state_dict().items()}
    torch.save(sd, folder / "hydra_lm_head.pt")
    return folder
