"""EAGLE-1/2 checkpoints in the published format (the ``yuhuili/EAGLE-*`` folders on the Hugging Face Hub):

    config.json            LLaMA config, ``num_hidden_layers: 1``, optional ``bias`` (fc bias, default true),
                           ``rope_theta``, ``num_key_value_heads``
    model.safetensors      (or pytorch_model.bin) with keys
                           embed_tokens.weight [V, H]       optional: EAGLE ships it; absent -> the target's
                           fc.weight [H, 2H], fc.bias [H]   (no fc.bias when ``bias`` is false)
                           layers.0.self_attn.{q,k,v,o}_proj.weight
                           layers.0.mlp.{gate,up,down}_proj.weight
                           layers.0.post_attention_layernorm.weight

Loading is strict (:func:`harness.engine.checkpoints.check_state_dict`). :func:`save_eagle_head` writes the same
format without ``embed_tokens.weight`` when the head shares the target's embedding (shipped heads stay small).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    read_config,
    read_weights,
    target_vocab_hidden,
)
from harness.models import Target
from methods.eagle.head import EagleHead, rope_theta

EAGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
EAGLE_REQUIRED_CONFIG = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def eagle_config_from_json(raw: dict, where: str) -> LlamaConfig:
    """The head's LlamaConfig from a published EAGLE ``config.json`` dict; errors name the file and field."""
    missing = [k for k in EAGLE_REQUIRED_CONFIG if k not in raw]
    if missing:
        raise CheckpointError(
            f"{where}: missing field(s) {', '.join(missing)} (an EAGLE config.json is a LLaMA config)")
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
            f"match the target {target.name!r} (hidden_size={H}, vocab_size={V}); "
            "this head was trained for another model")


def head_embedding(sd: dict[str, torch.Tensor], target: Target) -> tuple[nn.Embedding, bool]:
    """Pop ``embed_tokens.weight`` from ``sd``: ``(embedding, shares_target)``. A shipped embedding is used only when
    it differs from the target's (cast to the target dtype); otherwise, or when absent, the target's is shared."""
    target_embed = target.model.get_input_embeddings()
    shipped = sd.pop("embed_tokens.weight", None)
    share = shipped is None or torch.equal(shipped.to(target_embed.weight), target_embed.weight)
    if share:
        return target_embed, share
    return nn.Embedding.from_pretrained(shipped.to(target_embed.weight), freeze=True), share


def load_eagle_head(folder: str | Path, target: Target, head_cls: type[EagleHead] = EagleHead) -> EagleHead:
    """Load a published-format EAGLE head for ``target`` (on the target's device and dtype).

    The shipped ``embed_tokens.weight`` is used only when it differs from the target's embedding (cast to the
    target dtype); otherwise, or when absent, the head shares the target's embedding module.
    """
    folder = Path(folder)
    config = eagle_config_from_json(read_config(folder, "EAGLE head"), str(folder / "config.json"))
    check_head_fits_target(config, target, folder)
    sd, path = read_weights(folder, EAGLE_WEIGHT_FILES, "EAGLE head")
    check_state_dict(sd, expected_eagle_shapes(config), f"EAGLE head {path}",
                     optional=frozenset({"embed_tokens.weight"}))
    embed, share = head_embedding(sd, target)
    head = head_cls(config, embed, shares_target_embedding=share)
    head.load_state_dict(sd, strict=False)  # strictness was checked above; embed_tokens is set separately
    return head.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def eagle_config_json(config: LlamaConfig) -> dict:
    """The published EAGLE ``config.json`` fields of ``config`` (plus ``rope_scaling`` for non-default RoPE)."""
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "vocab_size": config.vocab_size, "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": config.hidden_act, "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": rope_theta(config), "bias": bool(getattr(config, "bias", True)),
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
