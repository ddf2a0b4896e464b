"""Medusa-1: extra heads on the target's last feature.

Heads (Medusa-1, arXiv:2401.10774 Sec. 2.1.1; released code ``medusa/model/medusa_model.py``): head i = ``ResBlock ×
medusa_num_layers`` then ``Linear(H -> V, no bias)``, with
``ResBlock(x) = x + SiLU(Linear_HxH(x))`` (weight zero-initialised). With ``medusa_share_lm_head: true`` (draftbench's
own flag, for small targets whose V x H heads would outweigh the model) every head ends in the target's lm_head
instead. Head i reads the target's post-norm feature at the last committed position and predicts the token i+1
places after the pending root. Their published checkpoint format: :mod:`methods.medusa.checkpoint`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
    holds only the heads' own weights (under ``heads.``; :func:`methods.medusa.checkpoint.published_state_dict` drops
    that prefix).
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
