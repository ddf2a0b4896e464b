"""EAGLE-3 checkpoints in the published format (the ``yuhuili/EAGLE3-*`` folders on the Hugging Face Hub, e.g.
``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``):

    config.json         LLaMA config of the one-layer draft: hidden_size, intermediate_size, num_attention_heads,
                        num_key_value_heads, vocab_size (the TARGET's), draft_vocab_size, rms_norm_eps,
                        max_position_embeddings, optionally head_dim, rope_theta, rope_scaling and
                        target_hidden_size (when the draft is narrower than the target)
    pytorch_model.bin   (or model.safetensors) with keys
                        fc.weight                                   [H, 3 H_t]
                        midlayer.self_attn.{q,k,v}_proj.weight      [heads * head_dim | kv_heads * head_dim, 2H]
                        midlayer.self_attn.o_proj.weight            [H, heads * head_dim]
                        midlayer.mlp.{gate,up}_proj.weight          [I, H];  midlayer.mlp.down_proj.weight [H, I]
                        midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight   [H]
                        norm.weight                                 [H]
                        lm_head.weight                              [draft_vocab_size, H]
                        d2t                                         int64 [draft_vocab_size]
                        t2d                                         bool  [vocab_size]
                        embed_tokens.weight                         [V, H]  optional: absent -> the target's

Where the key names come from: the released training code (``eagle/traineagle3/cnets.py``) holds the layer as
``self.midlayer`` with ``hidden_norm``/``input_layernorm``/``post_attention_layernorm``, the final ``self.norm``,
``self.fc`` (no bias), ``self.lm_head`` over ``draft_vocab_size`` and the buffers ``d2t``/``t2d``, and saves with
DeepSpeed's ``save_16bit_model(exclude_frozen_parameters=True)``, which leaves out the frozen embedding and target.
The names above are read off that module structure and agree with the keys other loaders of these checkpoints
expect (``midlayer.*``, ``d2t``, ``t2d``); we have not opened a downloaded ``pytorch_model.bin`` here (offline), so
a checkpoint that differs fails loudly, naming every key, rather than loading partially.

Not in the published configs but read when present: ``eagle_aux_hidden_state_layer_ids`` (the three target hidden
state indices fused by ``fc``; default: the inputs of layers 2, L/2 and L-3). :func:`save_eagle3_head` always writes
it. RoPE: a config without ``rope_theta`` uses base 10000, the released code's default (the published LLaMA-3.1
config has none, whatever the target's base), so the draft's positions match its training.

Loading is strict (:func:`harness.engine.checkpoints.check_state_dict`), and ``d2t``/``t2d`` must describe the same
sorted vocabulary (:func:`check_vocab_maps`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    read_config,
    read_weights,
    target_vocab_hidden,
)
from harness.engine.speculative import resolve_hidden_layers
from harness.models import Target
from methods.eagle.checkpoint import head_embedding
from methods.eagle.head import rope_theta
from methods.eagle3.head import LEVELS, Eagle3Head, target_residual_width

EAGLE3_WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")
EAGLE3_REQUIRED_CONFIG = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_vocab_size")
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
DEFAULT_ROPE_THETA = 10000.0  # the released code's LlamaRotaryEmbedding base when config.json has no rope_theta


def eagle3_config_from_json(raw: dict, where: str) -> LlamaConfig:
    """The head's LlamaConfig (with ``draft_vocab_size``, ``target_hidden_size`` and, when given, the layer ids) from
    a published EAGLE-3 ``config.json`` dict; errors name the file and field."""
    missing = [k for k in EAGLE3_REQUIRED_CONFIG if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: missing field(s) {', '.join(missing)} (an EAGLE-3 config.json is a LLaMA "
                              "config with draft_vocab_size)")
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise CheckpointError(f"{where}: num_hidden_layers must be 1 for an EAGLE-3 head, got {layers}")
    for name in ("draft_vocab_size", "vocab_size", "hidden_size"):
        if not isinstance(raw[name], int) or isinstance(raw[name], bool) or raw[name] < 1:
            raise CheckpointError(f"{where}: {name} must be a positive integer, got {raw[name]!r}")
    if raw["draft_vocab_size"] > raw["vocab_size"]:
        raise CheckpointError(f"{where}: draft_vocab_size={raw['draft_vocab_size']} exceeds vocab_size="
                              f"{raw['vocab_size']}")
    ids = raw.get(LAYER_IDS)
    if ids is not None and (not isinstance(ids, list) or len(ids) != LEVELS or
                            not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise CheckpointError(f"{where}: {LAYER_IDS} must be a list of {LEVELS} integers, got {ids!r}")
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_scaling")
    fields = {k: raw[k] for k in keep if raw.get(k) is not None}
    fields.setdefault("max_position_embeddings", 2048)
    fields["rope_theta"] = float(raw.get("rope_theta") or DEFAULT_ROPE_THETA)
    return LlamaConfig(num_hidden_layers=1, draft_vocab_size=raw["draft_vocab_size"],
                       target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
                       **{LAYER_IDS: ids}, **fields)


def expected_eagle3_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Published key -> shape for a head with this config (``embed_tokens.weight`` included; it is optional)."""
    H, I, Ht = config.hidden_size, config.intermediate_size, config.target_hidden_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    return {
        "embed_tokens.weight": (config.vocab_size, H),
        "fc.weight": (H, LEVELS * Ht),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (config.draft_vocab_size, H),
        "d2t": (config.draft_vocab_size,),
        "t2d": (config.vocab_size,),
    }


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> torch.Tensor:
    """The sorted target ids of the draft vocabulary, after checking that ``d2t`` and ``t2d`` agree: ``d2t`` integer,
    ``t2d`` bool (or 0/1 integers), ``t2d`` marks exactly ``draft_vocab_size`` ids and ``arange + d2t`` lists them in
    increasing order. Example: d2t [1, 3], t2d [F, T, F, F, T, F] -> [1, 4]; d2t [1, 2] with that t2d -> error."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise CheckpointError(f"{where}: d2t must hold integers (draft id -> target id offset), got {d2t.dtype}")
    if t2d.dtype != torch.bool:
        if t2d.dtype.is_floating_point or not bool(((t2d == 0) | (t2d == 1)).all()):
            raise CheckpointError(f"{where}: t2d must be a bool mask over the target vocabulary, got {t2d.dtype}")
        t2d = t2d.bool()
    kept = d2t.long().cpu() + torch.arange(d2t.shape[0])
    marked = torch.nonzero(t2d.cpu()).flatten()
    if not torch.equal(kept, marked):
        bad = next((i for i in range(min(len(kept), len(marked))) if kept[i] != marked[i]), min(len(kept), len(marked)))
        raise CheckpointError(f"{where}: d2t and t2d disagree: t2d marks {len(marked)} target ids, d2t maps "
                              f"{len(kept)} draft ids, first difference at draft id {bad} (d2t gives "
                              f"{int(kept[bad]) if bad < len(kept) else None}, t2d's id "
                              f"{int(marked[bad]) if bad < len(marked) else None})")
    return kept


def default_layer_ids(target: Target) -> tuple[int, ...]:
    """EAGLE-3's three feature levels for ``target``: the inputs of layers 2, L/2 and L-3."""
    layers = target.model.config.get_text_config(decoder=True).num_hidden_layers
    return resolve_hidden_layers("low,mid,high", layers)


def load_eagle3_head(folder: str | Path, target: Target) -> Eagle3Head:
    """Load a published-format EAGLE-3 head for ``target`` (on the target's output device and dtype).

    The target must have the head's ``vocab_size`` and a hidden size equal to ``target_hidden_size`` (default
    ``hidden_size``). A draft of another width than the target's token embedding must ship its own
    ``embed_tokens.weight``.
    """
    folder = Path(folder)
    where = str(folder / "config.json")
    config = eagle3_config_from_json(read_config(folder, "EAGLE-3 head"), where)
    V, _ = target_vocab_hidden(target)
    H, E = target_residual_width(target), target.model.get_input_embeddings().weight.shape[1]
    if (config.target_hidden_size, config.vocab_size) != (H, V):
        raise CheckpointError(
            f"{where}: head target_hidden_size={config.target_hidden_size}, vocab_size={config.vocab_size} do not "
            f"match the target {target.name!r} (hidden_size={H}, vocab_size={V}); this head was trained for another "
            "model")
    ids = getattr(config, LAYER_IDS, None)
    if ids is not None:
        try:
            config.eagle_aux_hidden_state_layer_ids = list(
                resolve_hidden_layers(ids, target.model.config.get_text_config(decoder=True).num_hidden_layers))
        except ValueError as e:
            raise CheckpointError(f"{where}: {LAYER_IDS}: {e}") from None
    sd, path = read_weights(folder, EAGLE3_WEIGHT_FILES, "EAGLE-3 head")
    own_width = config.hidden_size != E  # the target's embedding cannot be shared
    check_state_dict(sd, expected_eagle3_shapes(config), f"EAGLE-3 head {path}",
                     optional=frozenset() if own_width else frozenset({"embed_tokens.weight"}))
    kept = check_vocab_maps(sd["d2t"], sd["t2d"], f"EAGLE-3 head {path}")
    if own_width:  # its own embedding, of the draft's width
        embed, share = torch.nn.Embedding.from_pretrained(sd.pop("embed_tokens.weight").to(target.dtype)), False
    else:
        embed, share = head_embedding(sd, target)
    head = Eagle3Head(config, embed, shares_target_embedding=share)
    sd.pop("d2t"), sd.pop("t2d")
    head.load_state_dict(sd, strict=False)  # strictness was checked above; the maps and the embedding are set apart
    head.set_vocabulary(kept)
    return head.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def head_layer_ids(head: Eagle3Head, target: Target) -> tuple[int, ...]:
    """The target hidden states ``head`` fuses: its config's ``eagle_aux_hidden_state_layer_ids``, else the default."""
    ids = getattr(head.config, LAYER_IDS, None)
    return tuple(ids) if ids else default_layer_ids(target)


def eagle3_config_json(config: LlamaConfig, layer_ids: tuple[int, ...]) -> dict:
    """The published EAGLE-3 ``config.json`` fields of ``config``, plus ``rope_theta``, ``head_dim``,
    ``target_hidden_size`` and ``eagle_aux_hidden_state_layer_ids`` (``rope_scaling`` for non-default RoPE)."""
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "vocab_size": config.vocab_size, "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size, "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": config.hidden_act, "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": rope_theta(config), "tie_word_embeddings": False, LAYER_IDS: list(layer_ids),
    }
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


def save_eagle3_head(head: Eagle3Head, folder: str | Path, layer_ids: tuple[int, ...],
                     dtype: torch.dtype = torch.float16) -> Path:
    """Write ``head`` in the published format: ``config.json`` + ``pytorch_model.bin`` (weights in ``dtype``, ``d2t``
    int64, ``t2d`` bool; no ``embed_tokens.weight`` when the head shares the target's embedding). ``layer_ids``: the
    target hidden states it was trained on, recorded as ``eagle_aux_hidden_state_layer_ids``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    skip = ("rotary_emb.",) + (("embed_tokens.",) if head.shares_target_embedding else ())
    sd = {}
    for k, v in head.state_dict().items():
        if k.startswith(skip):
            continue
        sd[k] = v.detach().to("cpu", dtype if v.dtype.is_floating_point else v.dtype).contiguous()
    (folder / "config.json").write_text(json.dumps(eagle3_config_json(head.config, layer_ids), indent=2) + "\n")
    torch.save(sd, folder / "pytorch_model.bin")
    return folder
