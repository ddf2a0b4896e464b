"""EAGLE-1 and EAGLE-2: a one-layer draft head on the target's features, its published checkpoint format, and the
methods ``eagle1`` (static tree) and ``eagle2`` (dynamic tree).

The head (reference §1.3): ``fc(concat(embed(x_{t+1}), f_t))`` (embedding FIRST), one LLaMA decoder layer without
the input RMSNorm, ``post_attention_layernorm`` + SwiGLU MLP with residuals, no final norm. Its output is the
predicted next feature ``f̂_{t+1}``; logits come from the target's frozen ``lm_head``. ``f_t`` is the target's
last hidden state AFTER the final norm.

Draft KV (reference §1.2): the head keeps K/V for committed positions (the *stable* KV, a :class:`DraftKV`). Each
cycle it first runs over the positions committed since the last cycle (one forward), then expands the tree on a
temporary continuation of that KV which is simply dropped: :meth:`EagleHead.forward` never mutates its ``kv``
argument, it returns a new one.

Checkpoint format (reference §2.4), a folder with
    config.json            LLaMA config, ``num_hidden_layers: 1``, optional ``bias`` (fc bias, default true),
                           ``rope_theta``, ``num_key_value_heads``
    model.safetensors      (or pytorch_model.bin) with keys
                           embed_tokens.weight [V, H]       optional: EAGLE ships it; absent -> the target's
                           fc.weight [H, 2H], fc.bias [H]   (no fc.bias when ``bias`` is false)
                           layers.0.self_attn.{q,k,v,o}_proj.weight
                           layers.0.mlp.{gate,up,down}_proj.weight
                           layers.0.post_attention_layernorm.weight
Loading is strict: a missing, unexpected or mis-shaped key is an error naming it (the original loads with
``strict=False`` and silently keeps random weights for a mis-named key). :func:`save_eagle_head` writes the same
format without ``embed_tokens.weight`` when the head shares the target's embedding (shipped heads stay small).

Methods (both need the target's post-norm features, ``needs_hidden_states``; option ``head`` = checkpoint folder,
default ``methods/heads/<target>/eagle``):
    eagle1   static tree (``harness.tree`` ``eagle_mc_sim_7b_63`` by default); T=0 top-k children, T>0 children
             sampled without replacement with ``draft_probs`` (``proposal`` is then "sampled")
    eagle2   dynamic tree: ``total_tokens`` (root included, 60; -1 = timed choice), ``depth`` 5, ``top_k`` 10;
             deterministic top-k drafts at every temperature, as published
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from harness.draftvocab import check_draft_vocab, draft_lm_head
from harness.engine import SpeculativeMethod
from harness.method import OptionsError
from harness.models import Target
from harness.registry import register_method
from harness.sampling import SamplingParams, logits_to_probs
from harness.tree import DraftTree, STATIC_TREES, children_lists, depths, select_dynamic_tree, tree_from_choices

EAGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
EAGLE_REQUIRED_CONFIG = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


class CheckpointError(ValueError):
    """A draft checkpoint that is missing, malformed or does not fit the target; the message names the file/key."""


# ----------------------------------------------------------------------------------------------------------------
# Draft KV
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftKV:
    """Keys and values of the draft layer for ``length`` positions (keys already rotated by RoPE).

    keys, values: [B, n_kv_heads, length, head_dim]. Immutable: extending returns a new object, so a tree expansion
    built on the stable KV leaves the stable KV untouched.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> "DraftKV":
        """This KV followed by ``keys``/``values`` [B, n_kv, S, D] (new tensors; ``self`` is unchanged)."""
        return DraftKV(torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2))

    def crop(self, length: int) -> "DraftKV":
        """The first ``length`` positions."""
        if not 0 <= length <= self.length:
            raise ValueError(f"DraftKV.crop: length must be in [0, {self.length}], got {length}")
        return DraftKV(self.keys[:, :, :length], self.values[:, :, :length])


def default_draft_mask(new_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Bool mask [new_len, kv_len + new_len]: every new position sees the whole KV and is causal inside its block.

    Example: new_len=2, kv_len=1 -> [[1, 1, 0], [1, 1, 1]].
    """
    return torch.ones(new_len, kv_len + new_len, dtype=torch.bool, device=device).tril(kv_len)


# ----------------------------------------------------------------------------------------------------------------
# The head
# ----------------------------------------------------------------------------------------------------------------


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
    """The EAGLE-1/2 draft head (reference §1.3). Parameter names match the published checkpoints.

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
    def for_target(cls, target: Target, bias: bool = True, **overrides) -> "EagleHead":
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


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints (shared with methods/medusa.py)
# ----------------------------------------------------------------------------------------------------------------


def read_weights(folder: Path, names: tuple[str, ...], what: str) -> tuple[dict[str, torch.Tensor], Path]:
    """The state dict in the first of ``names`` that exists in ``folder`` (safetensors, or a torch pickle)."""
    for name in names:
        path = folder / name
        if path.is_file():
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                return load_file(str(path)), path
            sd = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(sd, Mapping):
                raise CheckpointError(f"{path}: expected a state dict (name -> tensor), got {type(sd).__name__}")
            return dict(sd), path
    raise CheckpointError(f"{what} folder {folder} has no weights file; expected one of: {', '.join(names)}")


def read_config(folder: Path, what: str) -> dict:
    """``folder/config.json`` as a dict, with errors that name the file."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{what} checkpoint folder {folder} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint folder {folder} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return raw


def check_state_dict(got: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], where: str,
                     optional: frozenset[str] = frozenset()) -> None:
    """Raise :class:`CheckpointError` naming every missing, unexpected and mis-shaped key of ``got``.

    ``expected`` maps key -> shape; keys in ``optional`` may be absent. A missing key with a close unexpected key
    is reported as a probable rename, e.g. ``missing: fc.weight (found fc_weight: renamed?)``.
    """
    missing = sorted(k for k in expected if k not in got and k not in optional)
    unexpected = sorted(k for k in got if k not in expected)
    problems = []
    if missing:
        described = []
        for k in missing:
            close = difflib.get_close_matches(k, unexpected, n=1, cutoff=0.6)
            described.append(f"{k} (found {close[0]}: renamed?)" if close else k)
        problems.append("missing keys: " + ", ".join(described))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    bad = [f"{k}: checkpoint {list(got[k].shape)} vs expected {list(shape)}"
           for k, shape in expected.items() if k in got and tuple(got[k].shape) != tuple(shape)]
    if bad:
        problems.append("shape mismatches: " + "; ".join(bad))
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))


def target_vocab_hidden(target: Target) -> tuple[int, int]:
    """(V, H) of the target's lm_head, the space every draft head predicts in."""
    w = target.model.get_output_embeddings().weight
    return w.shape[0], w.shape[1]


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
        rope_theta=_rope_theta(tc),
    )
    fields.update(overrides)
    return LlamaConfig(num_hidden_layers=1, bias=bias, **fields)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def eagle_config_from_json(raw: dict, where: str) -> LlamaConfig:
    """The head's LlamaConfig from a published EAGLE ``config.json`` dict; errors name the file and field."""
    missing = [k for k in EAGLE_REQUIRED_CONFIG if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: missing field(s) {', '.join(missing)} (an EAGLE config.json is a LLaMA config)")
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise CheckpointError(f"{where}: num_hidden_layers must be 1 for an EAGLE-1/2 head, got {layers}")
    bias = raw.get("bias", True)
    if not isinstance(bias, bool):
        raise CheckpointError(f"{where}: bias must be true or false, got {bias!r}")
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_theta", "rope_scaling")
    fields = {k: raw[k] for k in keep if raw.get(k) is not None}
    fields.setdefault("max_position_embeddings", 2048)
    return LlamaConfig(num_hidden_layers=1, bias=bias, **fields)


def expected_eagle_shapes(config: LlamaConfig, mlp: bool = True) -> dict[str, tuple[int, ...]]:
    """Published key -> shape for a head with this config (``embed_tokens.weight`` included). ``mlp=False`` leaves
    out the dense MLP, for heads that replace it (Jakiro's experts)."""
    H, I = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    shapes = {
        "embed_tokens.weight": (config.vocab_size, H),
        "fc.weight": (H, 2 * H),
        "layers.0.self_attn.q_proj.weight": (q, H),
        "layers.0.self_attn.k_proj.weight": (kv, H),
        "layers.0.self_attn.v_proj.weight": (kv, H),
        "layers.0.self_attn.o_proj.weight": (H, q),
        "layers.0.post_attention_layernorm.weight": (H,),
    }
    if mlp:
        shapes.update({"layers.0.mlp.gate_proj.weight": (I, H), "layers.0.mlp.up_proj.weight": (I, H),
                       "layers.0.mlp.down_proj.weight": (H, I)})
    if getattr(config, "bias", True):
        shapes["fc.bias"] = (H,)
    return shapes


def check_head_fits_target(config: LlamaConfig, target: Target, folder: Path) -> None:
    """A head's hidden size and vocabulary must be the target's."""
    V, H = target_vocab_hidden(target)
    if (config.hidden_size, config.vocab_size) != (H, V):
        raise CheckpointError(
            f"{folder / 'config.json'}: head hidden_size={config.hidden_size}, vocab_size={config.vocab_size} do not "
            f"match the target {target.name!r} (hidden_size={H}, vocab_size={V}); this head was trained for another model")


def head_embedding(sd: dict[str, torch.Tensor], target: Target) -> tuple[nn.Embedding, bool]:
    """Pop ``embed_tokens.weight`` from ``sd``: ``(embedding, shares_target)``. A shipped embedding is used only when
    it differs from the target's (cast to the target dtype); otherwise, or when absent, the target's is shared."""
    target_embed = target.model.get_input_embeddings()
    shipped = sd.pop("embed_tokens.weight", None)
    share = shipped is None or torch.equal(shipped.to(target_embed.weight), target_embed.weight)
    return (target_embed if share else nn.Embedding.from_pretrained(shipped.to(target_embed.weight), freeze=True)), share


def load_eagle_head(folder: str | Path, target: Target, head_cls: type[EagleHead] = EagleHead) -> EagleHead:
    """Load a published-format EAGLE head for ``target`` (on the target's device and dtype).

    The shipped ``embed_tokens.weight`` is used only when it differs from the target's embedding (cast to the
    target dtype); otherwise, or when absent, the head shares the target's embedding module.
    """
    folder = Path(folder)
    config = eagle_config_from_json(read_config(folder, "EAGLE head"), str(folder / "config.json"))
    check_head_fits_target(config, target, folder)
    sd, path = read_weights(folder, EAGLE_WEIGHT_FILES, "EAGLE head")
    check_state_dict(sd, expected_eagle_shapes(config), f"EAGLE head {path}", optional=frozenset({"embed_tokens.weight"}))
    embed, share = head_embedding(sd, target)
    head = head_cls(config, embed, shares_target_embedding=share)
    head.load_state_dict(sd, strict=False)  # strictness was checked above; embed_tokens is set separately
    return head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


def eagle_config_json(config: LlamaConfig) -> dict:
    """The published EAGLE ``config.json`` fields of ``config`` (plus ``rope_scaling`` for non-default RoPE)."""
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "vocab_size": config.vocab_size, "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": config.hidden_act, "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": _rope_theta(config), "bias": bool(getattr(config, "bias", True)),
    }
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


def save_eagle_head(head: EagleHead, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``head`` in the published format (``config.json`` + ``model.safetensors`` in ``dtype``); return folder.

    ``embed_tokens.weight`` is written only when the head does NOT share the target's embedding: a shipped head
    stays small and the loader takes the embedding from the target (EAGLE's own checkpoints include it; both load).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    skip = ("rotary_emb.",) + (("embed_tokens.",) if head.shares_target_embedding else ())
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items() if not k.startswith(skip)}
    (folder / "config.json").write_text(json.dumps(eagle_config_json(head.config), indent=2) + "\n")
    save_file(sd, str(folder / "model.safetensors"))
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Shipped heads
# ----------------------------------------------------------------------------------------------------------------

SHIPPED_HEADS = Path(__file__).resolve().parent / "heads"


def resolve_head_folder(option: str | None, target: Target, kind: str) -> Path:
    """The checkpoint folder for option ``head`` (``kind`` = "eagle" or "medusa"): the given path, or by default
    the head shipped for the target in ``methods/heads/<target>/<kind>``; the error says how to get one."""
    train = (f"train one with `draftbench train {kind}` (see `draftbench train --help`) and pass its folder as the "
             f"method option head=<folder>")
    if option is not None:
        folder = Path(option).expanduser()
        if not folder.is_dir():
            raise CheckpointError(f"option head: {kind} checkpoint folder {folder} does not exist; {train}")
        return folder
    folder = SHIPPED_HEADS / target.name / kind
    if not folder.is_dir():
        raise CheckpointError(f"no {kind} head is shipped for target {target.name!r} (looked in {folder}); {train}")
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------------------------------


def _check_head_option(head) -> None:
    if head is not None and not isinstance(head, str):
        raise ValueError(f"head must be a checkpoint folder path (string), got {type(head).__name__}")


@dataclass
class Eagle1Options:
    """``tree``: a name in ``harness.tree.STATIC_TREES`` or explicit rank paths (``[[0], [1], [0, 0], ...]``); every
    node's children must have ranks 0..c-1 (sampled children are the first c draws). ``head``: checkpoint folder
    (default: the head shipped for the target). ``draft_vocab``: 0 = the draft scores the full vocabulary (as
    published); N > 0 = only the N most frequent tokens of the head's training data (:mod:`harness.draftvocab`)."""

    head: str | None = None
    tree: str | list = "eagle_mc_sim_7b_63"
    draft_vocab: int = 0

    def __post_init__(self):
        _check_head_option(self.head)
        static_tree_choices(self.tree, "tree")
        check_draft_vocab(self.draft_vocab)


@dataclass
class Eagle2Options:
    """EAGLE-2's dynamic tree. ``total_tokens`` counts the root, as EAGLE's ``total_token`` (60 in its evaluation
    scripts); -1 chooses it from timed target forwards (:mod:`harness.autotune`). ``draft_vocab``: as eagle1's."""

    head: str | None = None
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    draft_vocab: int = 0

    def __post_init__(self):
        _check_head_option(self.head)
        check_draft_vocab(self.draft_vocab, self.top_k)
        if self.total_tokens != -1 and self.total_tokens < 2:
            raise ValueError(f"total_tokens must be >= 2 (root included) or -1 (automatic), got {self.total_tokens}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


def static_tree_choices(tree: str | list, field: str) -> list[list[int]]:
    """The rank paths of option ``tree`` (a ``STATIC_TREES`` name or explicit paths), validated: children of every
    node have ranks 0..c-1. Example: [[0], [1], [0, 0]] is fine; [[0], [2]] is not (rank 1 is missing)."""
    if isinstance(tree, str):
        if tree not in STATIC_TREES:
            raise ValueError(f"{field}: unknown tree {tree!r}; known: {', '.join(sorted(STATIC_TREES))}")
        tree = STATIC_TREES[tree]
    if not isinstance(tree, list) or not tree or not all(isinstance(c, list) for c in tree):
        raise ValueError(f"{field}: expected a tree name or a non-empty list of rank paths, got {tree!r}")
    parents, ranks = tree_from_choices(tree)
    for slot, kids in enumerate(children_lists(parents)):
        got = sorted(ranks[kids].tolist())
        if got != list(range(len(kids))):
            raise ValueError(f"{field}: the children of {'the root' if slot == 0 else f'node {slot - 1}'} have ranks "
                             f"{got}; they must be 0..{len(kids) - 1}")
    return tree


class EagleMethodBase(SpeculativeMethod):
    """What eagle1 and eagle2 share: the head, the stable draft KV and its update from committed positions.

    ``head`` may be passed directly (tests, training loops); otherwise it is loaded from ``options.head``.
    """

    needs_hidden_states = True

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options)
        if head is None:
            folder = resolve_head_folder(self.options.head, target, "eagle")
            head = load_eagle_head(folder, target)
        self.head = head
        # the draft's view of the target's lm_head: all rows, or the draft_vocab most frequent tokens
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), getattr(self.options, "draft_vocab", 0),
                                     folder, self.name)
        self.kv: DraftKV | None = None
        self.pending_features: torch.Tensor | None = None  # [n, H] target features not yet run through the head
        self.pending_tokens: torch.Tensor | None = None    # [n - 1] the tokens that follow them (root excluded)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.kv = None
        self.pending_features = hidden              # [P, H]: f_0 .. f_{P-1}
        self.pending_tokens = prompt_ids[0, 1:]      # [P-1]: x_1 .. x_{P-1}; x_P (the root) comes with propose

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.pending_features = hidden              # [A, H]: features of root + accepted drafts
        self.pending_tokens = torch.tensor(tokens[1:], dtype=torch.long, device=hidden.device)

    def extend_stable(self, root: int) -> torch.Tensor:
        """Run the head over the positions committed since the last cycle (pairs ``(f_t, x_{t+1})``, the last one
        paired with ``root``), append them to the stable KV, and return the last output feature ``[H]``."""
        feats = self.pending_features  # [n, H]
        root_t = torch.tensor([root], dtype=torch.long, device=feats.device)
        tokens = torch.cat([self.pending_tokens.to(feats.device), root_t])  # [n]
        start = 0 if self.kv is None else self.kv.length
        pos = torch.arange(start, start + feats.shape[0], device=feats.device)  # [n]
        out, self.kv = self.head(feats[None].to(self.target.dtype), tokens[None], pos[None], self.kv)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return out[0, -1]

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities ``[..., V]`` (fp32) of predicted features ``[..., H]`` through the target lm_head."""
        return torch.log_softmax(self.lm_head(features).float(), dim=-1)

    def tree_forward(self, features: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor,
                     kv: DraftKV, tree_cols: torch.Tensor) -> tuple[torch.Tensor, DraftKV]:
        """One draft forward over tree nodes on a temporary continuation of the stable KV.

        features [n, H] (each node's parent's predicted feature), tokens [n], position [n], kv = stable KV
        followed by the tree nodes run so far, tree_cols bool [n, kv.length - stable_len + n] = which of those
        tree nodes (and itself) each node may see. Returns (out [n, H], kv extended by n).
        """
        stable = torch.ones(tokens.shape[0], self.kv.length, dtype=torch.bool, device=tokens.device)
        out, kv = self.head(features[None], tokens[None], position[None], kv, torch.cat([stable, tree_cols], 1))
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return out[0], kv


@register_method("eagle1")
class Eagle1(EagleMethodBase):
    """EAGLE-1: a static tree (default ``mc_sim_7b_63``, 25 nodes, depth 5) filled level by level.

    At T=0 node c-th child = the c-th of the draft's top-k; at T>0 the children are drawn WITHOUT replacement from
    the draft distribution (``logits_to_probs`` of the draft logits with the run's sampling params), and the tree
    carries ``draft_probs`` so that verification can use the q-corrected rule (lossless). ``proposal`` is
    therefore "sampled" exactly when the last proposal was made at T>0. One draft forward runs per level that has
    non-leaf nodes (plus the stable-KV update): 5 per cycle for the default tree. A node whose draft distribution
    has fewer non-zero tokens than it has children (top-p / top-k sampling) loses its trailing children.
    """

    Options = Eagle1Options

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options, head, folder)
        self.parents, self.ranks = tree_from_choices(static_tree_choices(self.options.tree, "tree"))
        self.children = children_lists(self.parents)
        self.node_depths = depths(self.parents).tolist()
        widest = max(len(kids) for kids in self.children)
        vocab = self.lm_head.size
        if widest > vocab:
            raise OptionsError(f"method {self.name!r}: option tree has a node with {widest} children, more than the "
                               f"draft vocabulary ({vocab})")
        self._proposal = "deterministic"

    @property
    def proposal(self) -> str:  # type: ignore[override]
        return self._proposal

    def pick_children(self, logits: torch.Tensor, count: int, sampling: SamplingParams,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``count`` child tokens from draft ``logits [V]``: top-k at T=0, else draws without replacement from
        q = logits_to_probs(logits) (fewer when q has fewer non-zero tokens). Returns (tokens [<=count], q or None)."""
        if sampling.greedy:
            return torch.topk(logits, count).indices, None
        q = logits_to_probs(logits, sampling)  # [V]
        count = min(count, int(torch.count_nonzero(q)))
        on = generator.device if generator is not None else q.device  # draw where the generator lives
        drawn = torch.multinomial(q.to(on), count, replacement=False, generator=generator)
        return drawn.to(q.device), q

    def level_batch(self, level: int, alive: list[bool]) -> list[int]:
        """Nodes at ``level`` that were filled and have children: the rows of that level's draft forward."""
        return [i for i, d in enumerate(self.node_depths) if d == level and alive[i] and self.children[i + 1]]

    def level_mask(self, batch: list[int], col_of: dict[int, int], device: torch.device) -> torch.Tensor:
        """Draft-side mask over the temporary KV continuation, bool ``[b, len(col_of) + b]``: row r sees the columns
        of ``batch[r]``'s ancestors (``col_of``: node -> column) and its own new column.

        Example: parents [-1, 0, 0], col_of {0: 0}, batch [1, 2] -> [[T, T, F], [T, F, T]].
        """
        cols = torch.zeros(len(batch), len(col_of) + len(batch), dtype=torch.bool, device=device)
        for r, i in enumerate(batch):
            a = int(self.parents[i])
            while a >= 0:
                cols[r, col_of[a]] = True
                a = int(self.parents[a])
            cols[r, len(col_of) + r] = True
        return cols

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        n = len(self.node_depths)
        device = self.target.device
        tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        alive = [False] * n
        rows: list[torch.Tensor | None] = [None] * (n + 1)  # q per slot (sampled only)
        h0 = self.extend_stable(root)  # [H]
        stable_len = self.kv.length

        def fill(slot: int, logits: torch.Tensor) -> None:
            kids = self.children[slot]
            if not kids:
                return
            chosen, q = self.pick_children(logits, len(kids), sampling, generator)
            rows[slot] = q
            for rank_pos, node in enumerate(kids):  # kids are in rank order with ranks 0..c-1
                if rank_pos < chosen.shape[0]:
                    tokens[node] = chosen[rank_pos]
                    alive[node] = True

        fill(0, self.lm_head(h0).float())

        def draft_level(feats, toks, pos, kv, cols):
            out, kv = self.tree_forward(feats, toks, pos, kv, cols)
            return out, self.lm_head(out).float(), kv  # [b, H], [b, V]

        self.expand_levels(h0, tokens, alive, fill, stable_len, draft_level)
        return self._compact(tokens, alive, rows)

    def expand_levels(self, root_feature: torch.Tensor, tokens: torch.Tensor, alive: list[bool], fill,
                      stable_len: int, draft_level) -> None:
        """Grow the static tree level by level: one draft forward per level over its filled nodes that have
        children, each fed its parent's predicted feature, on a temporary KV continuation of the stable cache.

        ``draft_level(feats [b, H], tokens [b], positions [b], kv, mask) -> (features [b, H], logits [b, ...], kv)``
        is the head-specific forward; ``fill(slot, logits)`` chooses the children of the node in ``slot``.
        """
        device = tokens.device
        out_of: dict[int, torch.Tensor] = {-1: root_feature}  # node -> its predicted feature (root = -1)
        col_of: dict[int, int] = {}                            # node -> its column in the temporary KV continuation
        kv = self.kv
        for level in range(1, max(self.node_depths, default=0)):
            batch = self.level_batch(level, alive)
            if not batch:
                break
            cols = self.level_mask(batch, col_of, device)
            feats = torch.stack([out_of[int(self.parents[i])] for i in batch])  # [b, H]
            pos = torch.full((len(batch),), stable_len + level - 1, dtype=torch.long, device=device)
            out, logits, kv = draft_level(feats, tokens[batch], pos, kv, cols)
            for r, i in enumerate(batch):
                col_of[i] = len(col_of)
                out_of[i] = out[r]
                fill(i + 1, logits[r])

    def _compact(self, tokens: torch.Tensor, alive: list[bool], rows: list[torch.Tensor | None]) -> DraftTree:
        """The tree restricted to the nodes that got a token, with ``draft_probs`` rows (zero for leaves) if sampled."""
        ordered = [i for i, a in enumerate(alive) if a]  # a dead node is never expanded: its subtree is dead too
        new_index = {old: j for j, old in enumerate(ordered)}
        parents = torch.tensor([new_index.get(int(self.parents[i]), -1) for i in ordered], dtype=torch.long)
        tree_tokens = tokens[ordered] if ordered else tokens[:0]
        probs = None
        if self._proposal == "sampled":
            V = self.lm_head.weight.shape[0]
            zero = torch.zeros(V, device=tokens.device)
            probs = torch.stack([rows[0] if rows[0] is not None else zero] +
                                [rows[i + 1] if rows[i + 1] is not None else zero for i in ordered])  # [N'+1, V]
        return DraftTree(tokens=tree_tokens, parents=parents.to(tokens.device), draft_probs=probs)


@dataclass
class DynamicCandidates:
    """Every candidate EAGLE-2 records in one cycle: ``tokens [M]``, cumulative log-probs ``scores [M]``,
    ``parents [M]`` (index of an earlier candidate, -1 = root). M = top_k + depth * top_k**2."""

    tokens: torch.Tensor
    scores: torch.Tensor
    parents: torch.Tensor


@register_method("eagle2")
class Eagle2(EagleMethodBase):
    """EAGLE-2: a dynamic tree grown by beam-like expansion, then re-ranked (reference §2.2).

    One stable-KV forward gives the root's top-k (level 1); then ``depth`` forwards each expand the k frontier
    nodes into k*k children, keep the k best by cumulative log-prob as the next frontier, and record all k*k. The
    ``total_tokens - 1`` best candidates (root excluded) form the tree (:func:`harness.tree.select_dynamic_tree`).
    Draft forwards per cycle: depth + 1. The draft is deterministic top-k even at T>0, as published, so
    verification uses the deterministic-proposal rule (lossless).
    """

    Options = Eagle2Options

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options, head, folder)
        vocab = self.lm_head.size
        if self.options.top_k > vocab:
            raise OptionsError(f"method {self.name!r}: option top_k={self.options.top_k} exceeds the draft vocabulary "
                               f"({vocab})")
        self.total_tokens = self.options.total_tokens  # resolved at the first turn when -1

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        super().begin(prompt_ids, hidden)
        if self.total_tokens == -1:
            from harness.autotune import choose_tree_size, time_tree_sizes

            self.total_tokens = choose_tree_size(time_tree_sizes(self.target))
        self.counters["total_tokens"] = self.total_tokens

    def expand(self, root: int) -> DynamicCandidates:
        """The k + depth*k*k candidates of one cycle (see the class docstring); runs depth + 1 draft forwards."""
        k, depth = self.options.top_k, self.options.depth
        h0 = self.extend_stable(root)  # [H]
        stable_len = self.kv.length
        device = h0.device
        scores, frontier_tok = torch.topk(self.log_probs(h0), k)  # [k], [k] level 1; scores = cumulative log-probs
        rec_tokens, rec_scores = [frontier_tok], [scores]
        rec_parents = [torch.full((k,), -1, dtype=torch.long, device=device)]
        frontier_idx = torch.arange(k, device=device)  # [k] candidate index of each frontier node
        frontier_in = h0.expand(k, -1)                 # [k, H] input feature = the parent's output
        tree_cols = torch.eye(k, dtype=torch.bool, device=device)  # [k, k*(i+1)] ancestors-or-self per frontier node
        recorded = k
        kv = self.kv
        for i in range(depth):
            pos = torch.full((k,), stable_len + i, dtype=torch.long, device=device)
            out, kv = self.tree_forward(frontier_in, frontier_tok, pos, kv, tree_cols)  # [k, H]
            child_lp, child_tok = torch.topk(self.log_probs(out), k, dim=-1)  # [k, k]
            cum = (child_lp + scores[:, None]).flatten()  # [k*k] row r = children of frontier node r
            rec_tokens.append(child_tok.flatten())
            rec_scores.append(cum)
            rec_parents.append(frontier_idx.repeat_interleave(k))
            sel = torch.topk(cum, k).indices  # [k] the next frontier, best first
            parent_row = sel // k
            frontier_idx = recorded + sel
            recorded += k * k
            frontier_tok, scores = child_tok.flatten()[sel], cum[sel]
            frontier_in = out[parent_row]
            tree_cols = torch.cat([tree_cols[parent_row], torch.eye(k, dtype=torch.bool, device=device)], dim=1)
        return DynamicCandidates(torch.cat(rec_tokens), torch.cat(rec_scores), torch.cat(rec_parents))

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        c = self.expand(root)
        return select_dynamic_tree(c.tokens, c.scores, c.parents, self.total_tokens - 1)
