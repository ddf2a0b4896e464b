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
so they load into the untied blocks used here.

Hydra++ (``hydra_head_arch: prefix-mlp``, arXiv:2402.05109 Sec. 4 "Hydra++"; released code
``hydra/model/hydra_heads/prefix_mlp_head.py``, the published ``ankner/hydra-vicuna-7b-v1.3`` with 4 heads x 4
layers): the heads read, instead of f_t, the output at t of one extra decoder layer run causally over the target's
features f_0..f_t: the released code builds it as a one-layer ``LlamaModel`` of the base model's config (input
RMSNorm, self-attention with its own KV cache, post-attention RMSNorm, SwiGLU MLP, residuals, then the final RMSNorm;
:class:`HydraPrefix`). Its checkpoint keys differ from the mlp arch's because every block sits behind a Dropout:
    prefix_embeding_layer.layers.0.{input_layernorm, post_attention_layernorm}.weight [H],
    prefix_embeding_layer.layers.0.self_attn.{q,k,v,o}_proj.weight, .mlp.{gate,up,down}_proj.weight (the target's
    attention heads, key/value heads and intermediate size), prefix_embeding_layer.norm.weight [H],
    hydra_mlp.{i}.{2j+1}.* for block j (hydra_mlp.{i}.1.* is block 0), hydra_lm_head.{i}.1.{weight, bias};
and, read and checked but never used: ``prefix_embeding_layer.embed_tokens.weight`` [V, H] (the LlamaModel's unused
embedding), ``prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq`` (a persistent buffer in transformers
4.36's Llama) and ``input_embed_fn.weight``. Other ``hydra_head_arch`` values (cross-attn, eagle-attn),
``grounded_heads: false`` (plain Medusa heads) and ``hidden_state_offset`` != 0 are refused in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    check_target_sizes,
    int_field,
    read_config,
    read_weights,
)
from harness.engine.draftcache import DraftKV, default_draft_mask
from harness.models import Target
from methods.eagle.head import EagleDecoderLayer, eagle_config_for
from methods.medusa.heads import ResBlock

HYDRA_WEIGHT_FILES = ("hydra_lm_head.pt", "hydra_lm_head.safetensors")
HEAD_ARCHS = ("mlp", "prefix-mlp")
PREFIX = "prefix_embeding_layer"  # sic, the released code's attribute name
# keys of the released prefix-mlp checkpoints that are read and checked but never used (see the module docstring)
UNUSED_PREFIX_KEYS = (f"{PREFIX}.embed_tokens.weight", f"{PREFIX}.layers.0.self_attn.rotary_emb.inv_freq")


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


def published_key(key: str, arch: str) -> str:
    """draftbench's state-dict key -> the released checkpoint's for ``arch``: prefix-mlp puts a Dropout before every
    block and lm_head, so block j is ``hydra_mlp.{i}.{2j+1}`` and the lm_head ``hydra_lm_head.{i}.1``.
    Example: ("hydra_mlp.0.1.linear.weight", "prefix-mlp") -> "hydra_mlp.0.3.linear.weight"."""
    if arch != "prefix-mlp":
        return key
    if m := re.fullmatch(r"hydra_mlp\.(\d+)\.(\d+)\.(.+)", key):
        return f"hydra_mlp.{m[1]}.{2 * int(m[2]) + 1}.{m[3]}"
    if m := re.fullmatch(r"hydra_lm_head\.(\d+)\.(.+)", key):
        return f"hydra_lm_head.{m[1]}.1.{m[2]}"
    return key


class HydraHeads(nn.Module):
    """``num_heads`` Hydra heads. ``forward(i, x [..., (i+2)H], lm_head) -> logits [..., V]`` of head ``i``;
    :meth:`context` gives the feature they read (f_t itself, or with ``prefix`` (a config, :func:`prefix_config`)
    Hydra++'s prefix layer's output, ``hydra_head_arch: prefix-mlp``).

    ``lm_head`` (the target's) is used only when ``share_lm_head``; it is never registered here, so the state dict
    holds exactly the published keys up to :func:`published_key` (``hydra_mlp.*``, ``hydra_lm_head.*``,
    ``prefix_embeding_layer.*``).
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


def expected_hydra_shapes(H: int, V: int, num_heads: int, num_layers: int, share_lm_head: bool,
                          prefix: LlamaConfig | None = None) -> dict[str, tuple]:
    """Published key -> shape for these heads (without the unused keys), read off heads built on the meta device."""
    with torch.device("meta"):
        heads = HydraHeads(H, V, num_heads, num_layers, share_lm_head, prefix)
    return {published_key(k, heads.head_arch): tuple(v.shape) for k, v in heads.state_dict().items()}


def _check_config(raw: dict, where: str) -> None:
    """The published fields draftbench runs only at one value (and the two head archs it runs): anything else is
    refused in one line."""
    try:
        check_head_arch(raw.get("hydra_head_arch", "mlp"))
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    for key, want in (("grounded_heads", True), ("hidden_state_offset", 0)):
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
    arch = raw.get("hydra_head_arch", "mlp")
    prefix = prefix_config(target) if arch == "prefix-mlp" else None
    sd, path = read_weights(folder, HYDRA_WEIGHT_FILES, "Hydra heads")
    shapes = expected_hydra_shapes(H, V, num_heads, num_layers, share, prefix)
    unused = {"input_embed_fn.weight": (V, H)}
    if prefix is not None:
        unused.update(zip(UNUSED_PREFIX_KEYS, [(V, H), (prefix.head_dim // 2,)], strict=True))
    check_state_dict(sd, {**shapes, **unused}, f"Hydra heads {path} (target {target.name!r}: hidden {H}, vocab {V})",
                     optional=frozenset(unused))
    heads = HydraHeads(H, V, num_heads, num_layers, share, prefix)
    internal = {published_key(k, arch): k for k in heads.state_dict()}
    heads.load_state_dict({internal[k]: v for k, v in sd.items() if k not in unused}, strict=True)
    return heads.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def save_hydra_heads(heads: HydraHeads, folder: str | Path, base_model: str,
                     dtype: torch.dtype = torch.float16) -> Path:
    """Write ``heads`` in the published format (``config.json`` + ``hydra_lm_head.pt``, what the Hydra loader
    reads)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"hydra_num_heads": heads.num_heads, "hydra_num_layers": heads.num_layers,
              "hydra_head_arch": heads.head_arch,
              "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": base_model,
              "hydra_share_lm_head": heads.share_lm_head, "hidden_size": heads.hidden_size,
              "vocab_size": heads.vocab_size}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sd = {published_key(k, heads.head_arch): v.detach().to("cpu", dtype).contiguous()
          for k, v in heads.state_dict().items()}
    torch.save(sd, folder / "hydra_lm_head.pt")
    return folder
