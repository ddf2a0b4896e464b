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
    """LLaMA self-attention (RoPE, GQA, no biases) over explicit K/V tensors, with a boolean mask.

    ``input_size``: the width the q/k/v projections read (default ``hidden_size``; EAGLE-3's layer reads the
    normed embedding and the normed feature side by side, ``2 * hidden_size``, arXiv:2503.01840 Sec. 3)."""

    def __init__(self, config: LlamaConfig, input_size: int | None = None):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        H = config.hidden_size
        width = input_size or H
        self.q_proj = nn.Linear(width, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: DraftKV | None,
                attn_mask: torch.Tensor) -> tuple[torch.Tensor, DraftKV]:
        """x [B, S, input_size], cos/sin [B, S, D], attn_mask bool [S, kv_len + S] (True = may attend) ->
        ([B, S, H], kv + S)."""
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


class SharesTargetEmbedding(nn.Module):
    """A draft module whose ``embed_tokens`` is usually the TARGET's own embedding (``shares_target_embedding``):
    ``.to()``, ``.float()``, ``.half()`` ... leave that shared module alone, since converting it would change the
    target (e.g. ``head.float()`` on a bf16 target); the head casts the embeddings it reads instead."""

    shares_target_embedding: bool = True

    def _apply(self, fn, recurse=True):
        if not self.shares_target_embedding:
            return super()._apply(fn, recurse)
        modules = self._modules
        object.__setattr__(self, "_modules", {k: m for k, m in modules.items() if k != "embed_tokens"})
        try:
            return super()._apply(fn, recurse)
        finally:
            object.__setattr__(self, "_modules", modules)


class EagleHead(SharesTargetEmbedding):
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

    @classmethod
    def for_target(cls, target: Target, bias: bool = True, **overrides) -> EagleHead:
        """A randomly initialised head shaped for ``target`` that shares its embedding (for training and tests)."""
        overrides.setdefault("hidden_size", target.model.get_output_embeddings().weight.shape[1])
        head = cls(eagle_config_for(target.config, bias=bias, **overrides), target.model.get_input_embeddings())
        return head.to(device=target.output_device, dtype=target.dtype)

    def fuse(self, features: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``fc(concat(embed(x_{t+1}), f_t))``: features [B, S, H], token_ids [B, S] -> [B, S, H]."""
        table = self.embed_tokens.weight
        if table.device != token_ids.device and table.device.type != "meta":  # device map: the embedding's GPU
            token_ids = token_ids.to(table.device)
        emb = self.embed_tokens(token_ids).to(features.device, features.dtype)  # [B, S, H]
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


class HeadConfigError(ValueError):
    """A target config lacks a field a draft head cannot do without; the message names it."""


def _field(config, names: tuple[str, ...]):
    """The first of ``names`` that ``config`` sets (not None), else None."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def default_heads(hidden: int) -> int:
    """A head count for a draft attention of width ``hidden`` when the target has none that fits: 64-wide heads
    when ``hidden`` allows, else the largest of 16, 8, 4, 2, 1 dividing it. Example: 4096 -> 64; 48 -> 16."""
    for h in (hidden // 64 if hidden % 64 == 0 else 0, 16, 8, 4, 2, 1):
        if h >= 1 and hidden % h == 0:
            return h
    return 1


def eagle_config_for(target_config, bias: bool = True, hidden_size: int | None = None, **overrides) -> LlamaConfig:
    """A one-layer EAGLE head config shaped like ``target_config``, any causal LM's config.

    The head reads only the target's last hidden state, so it needs: ``hidden_size`` (the width of the features
    and embeddings; pass the ``lm_head`` input width when it differs from the config's, as OPT's
    ``word_embed_proj_dim``), ``vocab_size``, and, with defaults when the target has none: attention heads
    (``num_attention_heads``/``n_head``, else :func:`default_heads`), ``head_dim``, key/value heads,
    ``intermediate_size`` (``ffn_dim`` for OPT, ``n_inner``, else 4 x hidden), the norm epsilon
    (``rms_norm_eps``/``layer_norm_eps``/``layer_norm_epsilon``, else 1e-6), the activation (``hidden_act``/
    ``hidden_activation``, else SiLU), ``max_position_embeddings`` (``n_positions``, else 4096) and the RoPE base
    (:func:`rope_theta`). A missing hidden size or vocabulary size raises :class:`HeadConfigError` naming it.
    """
    from transformers.activations import ACT2FN

    tc = target_config.get_text_config(decoder=True) if hasattr(target_config, "get_text_config") else target_config
    kind = type(tc).__name__
    config_hidden = _field(tc, ("hidden_size", "n_embd", "d_model", "dim"))
    width = hidden_size or config_hidden
    if width is None:
        raise HeadConfigError(f"cannot shape a draft head for {kind}: it has no hidden_size (nor n_embd, d_model)")
    V = _field(tc, ("vocab_size",))
    if V is None:
        raise HeadConfigError(f"cannot shape a draft head for {kind}: it has no vocab_size")
    heads = _field(tc, ("num_attention_heads", "n_head", "num_heads"))
    head_dim = _field(tc, ("head_dim",)) if width == config_hidden else None
    if heads is None or (head_dim is None and width % heads):
        heads, head_dim = default_heads(width), None
    head_dim = head_dim or width // heads
    kv = _field(tc, ("num_key_value_heads", "num_kv_heads")) if heads == _field(tc, ("num_attention_heads",)) else None
    if kv is None or heads % kv:
        kv = heads
    act = _field(tc, ("hidden_act", "hidden_activation"))
    fields = dict(
        vocab_size=V, hidden_size=width,
        intermediate_size=_field(tc, ("intermediate_size", "ffn_dim", "n_inner")) or 4 * width,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        rms_norm_eps=_field(tc, ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")) or 1e-6,
        hidden_act=act if isinstance(act, str) and act in ACT2FN else "silu",
        max_position_embeddings=_field(tc, ("max_position_embeddings", "n_positions")) or 4096,
        rope_theta=rope_theta(tc),
    )
    fields.update(overrides)
    return LlamaConfig(num_hidden_layers=1, bias=bias, **fields)


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
