"""The Jakiro / Jakiro* draft head: :class:`methods.eagle.head.EagleHead` with ``layers.0.mlp`` replaced by
``layers.0.mlp_moe`` (:class:`methods.jakiro.moe.JakiroMoE`); see :mod:`methods.jakiro` for the maths.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig

from harness.engine.draftcache import DraftKV
from harness.models import Target
from methods.eagle.head import EagleHead, eagle_config_for
from methods.jakiro.moe import GeluExpert, JakiroMoE, SwiGLUExpert

KINDS = ("jakiro", "jakiro_star")


@dataclass
class JakiroOutputs:
    """Head outputs WITH the attention residual: ``mixture [..., H]`` (M), ``contrast [..., H]`` (C) or None,
    ``experts [..., K, H]`` (h + e of each selected expert, best first) or None, and the router's choice."""

    mixture: torch.Tensor
    contrast: torch.Tensor | None
    experts: torch.Tensor | None
    expert_ids: torch.Tensor
    weights: torch.Tensor

    def unbatch(self) -> JakiroOutputs:
        """Drop the batch dimension of every output."""
        return self.rows(0)

    def rows(self, index) -> JakiroOutputs:
        """Every output indexed by ``index`` along its first dimension."""
        return JakiroOutputs(self.mixture[index], None if self.contrast is None else self.contrast[index],
                             None if self.experts is None else self.experts[index], self.expert_ids[index],
                             self.weights[index])


class JakiroHead(EagleHead):
    """The EAGLE head with ``layers.0.mlp`` replaced by ``layers.0.mlp_moe`` (see the module docstring).

    ``kind`` "jakiro": SwiGLU experts of width ``config.expert_intermediate_size`` (default H, as released) and an
    N + 2 router; "jakiro_star": GeLU experts of width ``config.intermediate_size`` and an N router.
    """

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding, shares_target_embedding: bool = True,
                 kind: str = "jakiro"):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        # EagleHead builds a dense MLP of config.intermediate_size that is deleted below; build it 1 wide instead
        # (for a 7B config it would be 0.5 GB of fp32 initialised for nothing)
        narrow = copy.copy(config)
        narrow.intermediate_size = 1
        super().__init__(narrow, embed_tokens, shares_target_embedding)
        self.config = config
        self.kind = kind
        H = config.hidden_size
        if kind == "jakiro":
            width = getattr(config, "expert_intermediate_size", None) or H
            make = lambda: SwiGLUExpert(H, width, config.hidden_act)  # noqa: E731
        else:
            make = lambda: GeluExpert(H, config.intermediate_size)  # noqa: E731
        layer = self.layers[0]
        del layer.mlp
        layer.mlp_moe = JakiroMoE(H, config.num_local_experts, config.num_experts_per_tok, make,
                                  contrastive_router=kind == "jakiro")

    @classmethod
    def for_target(cls, target: Target, bias: bool = True, kind: str = "jakiro", num_experts: int = 2,
                   experts_per_tok: int = 2, expert_intermediate_size: int | None = None,
                   **overrides) -> JakiroHead:
        """A randomly initialised head shaped for ``target`` sharing its embedding (training, tests)."""
        overrides.setdefault("hidden_size", target.model.get_output_embeddings().weight.shape[1])
        config = eagle_config_for(target.config, bias=bias, num_local_experts=num_experts,
                                  num_experts_per_tok=experts_per_tok,
                                  expert_intermediate_size=expert_intermediate_size or overrides["hidden_size"],
                                  **overrides)
        head = cls(config, target.model.get_input_embeddings(), kind=kind)
        return head.to(device=target.output_device, dtype=target.dtype)

    @property
    def moe(self) -> JakiroMoE:
        return self.layers[0].mlp_moe

    def moe_outputs(self, h: torch.Tensor, contrast: bool = False, experts: bool = False) -> JakiroOutputs:
        """h [..., H] = attention block output (x + Attn(x)) -> :class:`JakiroOutputs` (residual added to all)."""
        o = self.moe(self.layers[0].post_attention_layernorm(h), contrast=contrast, experts=experts)
        return JakiroOutputs(
            mixture=h + o.mixture,
            contrast=h + o.contrast if o.contrast is not None else None,
            experts=h[..., None, :] + o.experts if o.experts is not None else None,
            expert_ids=o.ids, weights=o.weights)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The EAGLE contract: h [B, S, H] -> M [B, S, H]."""
        return self.moe_outputs(h).mixture

    def forward_outputs(self, features: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor,
                        kv: DraftKV | None = None, attn_mask: torch.Tensor | None = None, contrast: bool = False,
                        experts: bool = False, last_only: bool = False) -> tuple[JakiroOutputs, DraftKV]:
        """Like ``forward`` (same arguments, the KV of all S positions is returned) but with the outputs asked for.

        ``last_only``: the MoE runs only on the last position (outputs ``[B, 1, ...]``), as the released
        ``first_forward``; the K/V of every position come from attention and are complete either way.
        """
        h, new_kv = self.attend(self.fuse(features, token_ids), position_ids, kv, attn_mask)
        if last_only:
            h = h[:, -1:]
        return self.moe_outputs(h, contrast=contrast, experts=experts), new_kv
