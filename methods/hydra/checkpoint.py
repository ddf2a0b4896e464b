"""Hydra heads' published checkpoint format (the heads: :mod:`methods.hydra.head`).

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

Hydra++ (``hydra_head_arch: prefix-mlp``, the prefix layer :class:`methods.hydra.head.HydraPrefix`): its checkpoint
keys differ from the mlp arch's because every block sits behind a Dropout:
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
from transformers import LlamaConfig

from harness.engine.checkpoints import (
    CheckpointError,
    check_state_dict,
    check_target_sizes,
    int_field,
    read_config,
    read_weights,
)
from harness.models import Target
from methods.hydra.head import HydraHeads, check_head_arch, prefix_config

HYDRA_WEIGHT_FILES = ("hydra_lm_head.pt", "hydra_lm_head.safetensors")
PREFIX = "prefix_embeding_layer"  # sic, the released code's attribute name
# keys of the released prefix-mlp checkpoints that are read and checked but never used (see the module docstring)
UNUSED_PREFIX_KEYS = (f"{PREFIX}.embed_tokens.weight", f"{PREFIX}.layers.0.self_attn.rotary_emb.inv_freq")


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
