"""Hydra heads: sequentially dependent Medusa heads.

Heads (Hydra, arXiv:2402.05109 Sec. 3; released code ``hydra/model/hydra_heads/mlp_head.py``, ``grounded_heads``):
head i (0-based) reads the target's post-norm feature h at the last committed position together with the input
embeddings of the i + 1 tokens after it on the candidate path (the pending root and the i tokens drafted by heads
0..i-1) and predicts the next one:
``head_i([h, E(root), E(d_1), ..., E(d_i)]) -> logits over d_{i+1}``. A head is
``ResBlock(in=(i+2)H -> H)`` (its skip path a learned ``res_connection`` Linear, since input and output widths
differ) then ``ResBlock(H) x (hydra_num_layers - 1)``, then its own ``Linear(H -> V, bias)``. With
``hydra_share_lm_head: true`` (draftbench's own flag, as for Medusa: a small target's V x H heads would outweigh the
model) every head ends in the target's lm_head instead.

Hydra++ (``hydra_head_arch: prefix-mlp``, arXiv:2402.05109 Sec. 4 "Hydra++"; released code
``hydra/model/hydra_heads/prefix_mlp_head.py``, the published ``ankner/hydra-vicuna-7b-v1.3`` with 4 heads x 4
layers): the heads read, instead of f_t, the output at t of one extra decoder layer run causally over the target's
features f_0..f_t: the released code builds it as a one-layer ``LlamaModel`` of the base model's config (input
RMSNorm, self-attention with its own KV cache, post-attention RMSNorm, SwiGLU MLP, residuals, then the final RMSNorm;
:class:`HydraPrefix`). Their published checkpoint format: :mod:`methods.hydra.checkpoint`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from harness.engine.draftcache import DraftKV, default_draft_mask
from harness.models import Target
from methods.eagle.head import EagleDecoderLayer, eagle_config_for
from methods.medusa.head import ResBlock

HEAD_ARCHS = ("mlp", "prefix-mlp")


def check_head_arch(arch) -> None:
    """``hydra_head_arch`` / option ``head_arch``: one of :data:`HEAD_ARCHS`, else one line."""
    if arch not in HEAD_ARCHS:
        raise ValueError(f"hydra_head_arch={arch!r} is not supported (draftbench runs Hydra's "
                         f"{' and '.join(HEAD_ARCHS)} heads)")


def prefix_config(target: Target) -> LlamaConfig:
    """The prefix layer's config: the target's own attention and MLP shapes (the released code deep-copies the base
    model's config with one hidden layer)."""
    return eagle_config_for(target.config, bias=False,
                            hidden_size=target.model.get_output_embeddings().weight.shape[1])


class PrefixDecoderLayer(EagleDecoderLayer):
    """A full LLaMA decoder layer: EAGLE's layer (attention, post-attention RMSNorm, SwiGLU) plus the input RMSNorm."""

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class HydraPrefix(nn.Module):
    """Hydra++'s prefix layer (names as the released ``prefix_embeding_layer``, a one-layer ``LlamaModel``):
    ``forward(features [B, S, H], kv) -> (norm(layer(features)) [B, S, H], kv + S)``, causal, at positions
    ``kv.length ..``; ``kv`` (a :class:`harness.engine.draftcache.DraftKV`, keys after RoPE) is not modified."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.layers = nn.ModuleList([PrefixDecoderLayer(config)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, features: torch.Tensor, kv: DraftKV | None = None) -> tuple[torch.Tensor, DraftKV]:
        layer = self.layers[0]
        kv_len, S = (0 if kv is None else kv.length), features.shape[1]
        position_ids = torch.arange(kv_len, kv_len + S, device=features.device)[None]  # [1, S]
        cos, sin = self.rotary_emb(features, position_ids)
        attn, new_kv = layer.self_attn(layer.input_layernorm(features), cos, sin, kv,
                                       default_draft_mask(S, kv_len, features.device))
        h = features + attn
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h), new_kv


class HydraHeads(nn.Module):
    """``num_heads`` Hydra heads. ``forward(i, x [..., (i+2)H], lm_head) -> logits [..., V]`` of head ``i``;
    :meth:`context` gives the feature they read (f_t itself, or with ``prefix`` (a config, :func:`prefix_config`)
    Hydra++'s prefix layer's output, ``hydra_head_arch: prefix-mlp``).

    ``lm_head`` (the target's) is used only when ``share_lm_head``; it is never registered here, so the state dict
    holds exactly the published keys up to :func:`methods.hydra.checkpoint.published_key` (``hydra_mlp.*``,
    ``hydra_lm_head.*``, ``prefix_embeding_layer.*``).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = False, prefix: LlamaConfig | None = None):
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
        self.prefix_embeding_layer = None if prefix is None else HydraPrefix(prefix)

    @property
    def head_arch(self) -> str:
        return "mlp" if self.prefix_embeding_layer is None else "prefix-mlp"

    def context(self, features: torch.Tensor, kv: DraftKV | None = None) -> tuple[torch.Tensor, DraftKV | None]:
        """What the heads read in place of f_t: ``features [B, S, H]`` (f for S consecutive positions after the
        ``kv.length`` ones already run) -> (``[B, S, H]``, the prefix KV extended by S positions). The mlp arch
        returns both unchanged."""
        if self.prefix_embeding_layer is None:
            return features, kv
        weight = self.prefix_embeding_layer.norm.weight
        return self.prefix_embeding_layer(features.to(weight.device, weight.dtype), kv)

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
