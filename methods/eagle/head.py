"""The EAGLE-1/2 draft head: ``fc(concat(embed(x_{t+1}), f_t))`` (embedding FIRST), one LLaMA decoder layer without
the input RMSNorm, ``post_attention_layernorm`` + SwiGLU MLP with residuals, no final norm (EAGLE-1, arXiv:2401.15077
Sec. 3.1 and Fig. 6; released code ``eagle/model/cnets.py``). Its output is the predicted next feature ``f̂_{t+1}``;
logits come from the target's frozen ``lm_head``. ``f_t`` is the target's last hidden state AFTER the final norm.

:meth:`EagleHead.forward` never mutates its ``kv`` argument (a :class:`harness.engine.draftcache.DraftKV`), it
returns a new one: tree expansion runs on a temporary continuation of the stable KV that is simply dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from harness.engine.draftcache import DraftKV, default_draft_mask
from harness.models import Target


class EagleAttention(nn.Module):
    """LLaMA self-attention (RoPE, GQA, no biases) over explicit K/V tensors, with a boolean mask."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        H = config.hidden_size
        self.q_proj = nn.Linear(H, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: DraftKV | None,
                attn_mask: torch.Tensor) -> tuple[torch.Tensor, DraftKV]:
        """x [B, S, H], cos/sin [B, S, D], attn_mask bool [S, kv_len + S] (True = may attend) -> ([B, S, H], kv + S)."""
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # [B, h, S, D]
        k = self.k_proj(x).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)     # [B, h_kv, S, D]
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)     # [B, h_kv, S, D]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        new_kv = DraftKV(k, v) if kv is None else kv.extend(k, v)
        out = F.scaled_dot_product_attention(q, new_kv.keys, new_kv.values, attn_mask=attn_mask,
                                             enable_gqa=self.n_kv != self.n_heads)  # [B, h, S, D]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1)), new_kv


class EagleDecoderLayer(nn.Module):
    """The draft's single decoder layer: attention (no input norm), post-attention RMSNorm, SwiGLU ``mlp``.

    ``mlp`` is a replaceable submodule; Jakiro replaces it with a mixture of experts (and overrides
    :meth:`EagleHead.feed_forward`).
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = EagleAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)


class EagleHead(nn.Module):
    """The EAGLE-1/2 draft head (see the module docstring). Parameter names match the published checkpoints.

    ``embed_tokens`` is frozen; it is usually the target's own module (``shares_target_embedding``), so the head
    must be kept on the target's device and dtype. Logits are ``target lm_head(output)`` (see :meth:`logits`).
    """

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding, shares_target_embedding: bool = True):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.embed_tokens.weight.requires_grad_(False)
        self.shares_target_embedding = shares_target_embedding
        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=bool(getattr(config, "bias", True)))
        self.layers = nn.ModuleList([EagleDecoderLayer(config)])
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.float()``, ``.half()`` ... leave a shared embedding alone: it is the TARGET's module, and
        converting it would change the target (e.g. ``head.float()`` on a bf16 target). :meth:`fuse` casts."""
        if not self.shares_target_embedding:
            return super()._apply(fn, recurse)
        modules = self._modules
        object.__setattr__(self, "_modules", {k: m for k, m in modules.items() if k != "embed_tokens"})
        try:
            return super()._apply(fn, recurse)
        finally:
            object.__setattr__(self, "_modules", modules)

    @classmethod
    def for_target(cls, target: Target, bias: bool = True, **overrides) -> EagleHead:
        """A randomly initialised head shaped for ``target`` that shares its embedding (for training and tests)."""
        head = cls(eagle_config_for(target.config, bias=bias, **overrides), target.model.get_input_embeddings())
        return head.to(device=target.device, dtype=target.dtype)

    def fuse(self, features: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``fc(concat(embed(x_{t+1}), f_t))``: features [B, S, H], token_ids [B, S] -> [B, S, H]."""
        emb = self.embed_tokens(token_ids).to(features.dtype)  # [B, S, H]
        return self.fc(torch.cat([emb, features], dim=-1))

    def attend(self, x: torch.Tensor, position_ids: torch.Tensor, kv: DraftKV | None,
               attn_mask: torch.Tensor | None) -> tuple[torch.Tensor, DraftKV]:
        """Residual attention block: x [B, S, H] -> (x + Attn(x) [B, S, H], kv extended by S positions)."""
        kv_len = 0 if kv is None else kv.length
        if attn_mask is None:
            attn_mask = default_draft_mask(x.shape[1], kv_len, x.device)
        elif attn_mask.shape != (x.shape[1], kv_len + x.shape[1]):
            raise ValueError(f"EagleHead: attn_mask must be [S, kv_len + S] = [{x.shape[1]}, {kv_len + x.shape[1]}], "
                             f"got {list(attn_mask.shape)}")
        cos, sin = self.rotary_emb(x, position_ids)  # [B, S, D]
        out, new_kv = self.layers[0].self_attn(x, cos, sin, kv, attn_mask)
        return x + out, new_kv

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual MLP block: h [B, S, H] -> h + MLP(RMSNorm(h)) [B, S, H]. Jakiro overrides this."""
        layer = self.layers[0]
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward(self, features: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor,
                kv: DraftKV | None = None, attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, DraftKV]:
        """Predicted next features [B, S, H] for the pairs ``(features[:, s], token_ids[:, s])``, and the new KV.

        features [B, S, H]: f_t (or, inside a tree, the parent's predicted feature); token_ids [B, S]: x_{t+1};
        position_ids [B, S]; kv: K/V of earlier positions (not modified); attn_mask bool [S, kv_len + S] or None
        (causal). The returned KV is ``kv`` followed by these S positions.
        """
        h, new_kv = self.attend(self.fuse(features, token_ids), position_ids, kv, attn_mask)
        return self.feed_forward(h), new_kv


def eagle_config_for(target_config, bias: bool = True, **overrides) -> LlamaConfig:
    """A one-layer EAGLE head config shaped like ``target_config`` (a LLaMA-style transformers config)."""
    tc = target_config
    fields = dict(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6), hidden_act=getattr(tc, "hidden_act", "silu"),
        max_position_embeddings=tc.max_position_embeddings,
        rope_theta=rope_theta(tc),
    )
    fields.update(overrides)
    return LlamaConfig(num_hidden_layers=1, bias=bias, **fields)


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
