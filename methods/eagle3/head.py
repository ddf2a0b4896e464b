"""The EAGLE-3 draft head (EAGLE-3, Li et al., arXiv:2503.01840 Sec. 3; released code github.com/SafeAILab/EAGLE,
``eagle/model/cnets.py`` and ``eagle/traineagle3/cnets.py``).

Differences from the EAGLE-1/2 head (:mod:`methods.eagle.head`):

- **Input.** Three feature levels of the target, the hidden states entering layers 2, L/2 and L-3
  (:func:`harness.engine.speculative.resolve_hidden_layers` ``"low,mid,high"``), concatenated ``[.., 3 H_t]``, are
  projected by ``fc`` (``Linear(3 H_t -> H)``, no bias) to one feature ``g``. After the first draft step the head feeds
  its own pre-norm output (H wide) back as the feature of the next position; ``fc`` is not applied again.
- **Layer.** One LLaMA decoder layer (``midlayer``) whose attention reads the token embedding (``input_layernorm``)
  and the feature (``hidden_norm``) side by side: q/k/v take ``2H`` inputs; the residual stream is the feature.
- **Output.** A final ``norm`` and the head's OWN ``lm_head`` over a reduced draft vocabulary of ``draft_vocab_size``
  tokens; ``d2t [draft_vocab_size]`` maps a draft id to its target id (``target = draft + d2t[draft]``) and
  ``t2d [V]`` (bool) marks the target ids that are in the draft vocabulary. Feature regression is gone: training
  only matches token distributions (:mod:`methods.eagle3.objective`).

The head never touches the target's lm_head; the token embedding is the target's (shared, frozen), unless the
checkpoint ships its own (a draft narrower than the target, ``target_hidden_size``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from harness.engine.draftcache import DraftKV, default_draft_mask
from harness.models import Target
from methods.eagle.head import EagleAttention, SharesTargetEmbedding, eagle_config_for

LEVELS = 3  # feature levels fused by fc (low, mid, high)


def target_residual_width(target: Target) -> int:
    """Width of the target's decoder residual stream (its hidden states entering the layers): ``hidden_size``."""
    text = target.model.config.get_text_config(decoder=True)
    for name in ("hidden_size", "n_embd", "d_model", "dim"):
        if getattr(text, name, None):
            return int(getattr(text, name))
    raise ValueError(f"cannot tell the hidden size of {type(text).__name__} (no hidden_size, n_embd, d_model)")


class Eagle3DecoderLayer(nn.Module):
    """EAGLE-3's ``midlayer``: RMSNorm'd embedding and feature concatenated into a ``2H``-input attention, residual on
    the feature, then ``post_attention_layernorm`` + SwiGLU MLP with a residual. Parameter names as published."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        H = config.hidden_size
        self.self_attn = EagleAttention(config, input_size=2 * H)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)


class Eagle3Head(SharesTargetEmbedding):
    """The EAGLE-3 draft head (see the module docstring). ``config`` is a one-layer LlamaConfig with two extra
    fields: ``draft_vocab_size`` (Vd) and ``target_hidden_size`` (H_t, the width of each fused target level).

    Buffers ``d2t`` (int64 ``[Vd]``) and ``t2d`` (bool ``[V]``) are saved with the weights, as published; set them
    with :meth:`set_vocabulary`. :meth:`forward` never mutates its ``kv`` argument (a
    :class:`harness.engine.draftcache.DraftKV`); it returns a new one.
    """

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding, shares_target_embedding: bool = True):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.embed_tokens.weight.requires_grad_(False)
        self.shares_target_embedding = shares_target_embedding
        H, Vd, V = config.hidden_size, config.draft_vocab_size, config.vocab_size
        self.fc = nn.Linear(LEVELS * config.target_hidden_size, H, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.set_vocabulary(torch.arange(Vd))

    @property
    def draft_vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @classmethod
    def for_target(cls, target: Target, kept: torch.Tensor | None = None, **overrides) -> Eagle3Head:
        """A randomly initialised head shaped for ``target`` that shares its embedding (training and tests).

        ``kept``: the sorted target ids of the draft vocabulary (default: all of them, Vd = V). The head is as wide
        as the target's token embedding (it shares it); ``fc`` reads three levels of the decoder's residual stream,
        ``target_hidden_size`` wide (the same width except for models that project their embeddings, as OPT).
        """
        V = target.model.get_output_embeddings().weight.shape[0]
        width = target.model.get_input_embeddings().weight.shape[1]
        kept = torch.arange(V) if kept is None else torch.as_tensor(kept, dtype=torch.long)
        overrides.setdefault("hidden_size", width)
        config = eagle_config_for(target.config, draft_vocab_size=int(kept.shape[0]),
                                  target_hidden_size=target_residual_width(target), **overrides)
        head = cls(config, target.model.get_input_embeddings())
        head.set_vocabulary(kept)
        return head.to(device=target.output_device, dtype=target.dtype)

    def set_vocabulary(self, kept: torch.Tensor) -> None:
        """Make the draft vocabulary the sorted target ids ``kept [Vd]``: ``d2t = kept - arange(Vd)``,
        ``t2d[kept] = True``. Example: V = 6, kept [1, 4] -> d2t [1, 3], t2d [F, T, F, F, T, F]."""
        kept = torch.as_tensor(kept, dtype=torch.long).cpu()
        Vd, V = self.d2t.shape[0], self.t2d.shape[0]
        if kept.shape != (Vd,) or (Vd > 1 and not bool((kept[1:] > kept[:-1]).all())) or \
                (Vd and (int(kept.min()) < 0 or int(kept.max()) >= V)):
            raise ValueError(f"the draft vocabulary must be {Vd} distinct sorted ids in [0, {V}), got "
                             f"{kept.tolist()[:8]}{'...' if Vd > 8 else ''}")
        with torch.no_grad():
            self.d2t.copy_(kept - torch.arange(Vd))
            self.t2d.zero_()
            self.t2d[kept.to(self.t2d.device)] = True

    def project(self, levels: torch.Tensor) -> torch.Tensor:
        """``fc``: the concatenated target levels ``[..., 3 H_t]`` -> the fused feature ``g [..., H]``."""
        return self.fc(levels)

    def embed(self, token_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[B, S, H]`` on ``like``'s device and dtype (the shared table may live elsewhere)."""
        table = self.embed_tokens.weight
        if table.device != token_ids.device and table.device.type != "meta":  # device map: the embedding's GPU
            token_ids = token_ids.to(table.device)
        return self.embed_tokens(token_ids).to(like.device, like.dtype)

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor,
                kv: DraftKV | None = None, attn_mask: torch.Tensor | None = None,
                project: bool = False) -> tuple[torch.Tensor, DraftKV]:
        """The head's pre-norm outputs ``[B, S, H]`` for the pairs ``(hidden[:, s], token_ids[:, s])``, and the KV.

        hidden [B, S, H]: the fused target feature or, after the first draft step, the head's own previous output
        (``project=True``: hidden is the concatenated target levels [B, S, 3 H_t] and :meth:`project` is applied
        first); token_ids [B, S]: the next token x_{t+1}; position_ids [B, S]; kv: earlier positions (not
        modified); attn_mask bool [S, kv_len + S] or None (causal). The output is fed back as the next ``hidden``;
        :meth:`logits` turns it into draft-vocabulary logits.
        """
        if project:
            hidden = self.project(hidden)
        layer = self.midlayer
        kv_len = 0 if kv is None else kv.length
        if attn_mask is None:
            attn_mask = default_draft_mask(hidden.shape[1], kv_len, hidden.device)
        elif attn_mask.shape != (hidden.shape[1], kv_len + hidden.shape[1]):
            raise ValueError(f"Eagle3Head: attn_mask must be [S, kv_len + S] = [{hidden.shape[1]}, "
                             f"{kv_len + hidden.shape[1]}], got {list(attn_mask.shape)}")
        x = torch.cat([layer.input_layernorm(self.embed(token_ids, hidden)), layer.hidden_norm(hidden)], dim=-1)
        cos, sin = self.rotary_emb(hidden, position_ids)  # [B, S, D]
        attn, new_kv = layer.self_attn(x, cos, sin, kv, attn_mask)
        h = hidden + attn
        return h + layer.mlp(layer.post_attention_layernorm(h)), new_kv

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` of outputs ``[..., H]``: ``lm_head(norm(out))``."""
        return self.lm_head(self.norm(out))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of draft ids: ``draft + d2t[draft]``. Example: d2t [1, 3] -> draft [0, 1] -> target [1, 4]."""
        return draft_ids + self.d2t[draft_ids]

    def draft_argmax(self, out: torch.Tensor) -> torch.Tensor:
        """The draft's top-1 token (a target id) after each output ``[..., H]`` -> ``[...]``."""
        return self.to_target(self.logits(out).argmax(-1))
