"""Jakiro and Jakiro* checkpoints in the published format (the ``Hhaiduo/Jakiro-*`` folders; released code
github.com/haiduo/Jakiro
``jakiro/model/ea_model.py``): ``config.json`` (LLaMA fields, ``num_local_experts``, ``num_experts_per_tok``, optional
``bias``, ``rope_theta``, ``num_key_value_heads``; draftbench adds ``expert_intermediate_size`` when it is not H) and
``model.safetensors`` / ``pytorch_model.bin``::

    fc.weight [H, 2H], fc.bias [H] (absent when bias is false)
    layers.0.self_attn.{q,k,v,o}_proj.weight
    layers.0.post_attention_layernorm.weight [H]
    layers.0.mlp_moe.gate.weight [N+2, H]                                   (Jakiro*: [N, H])
    layers.0.mlp_moe.experts.{i}.{gate_proj,up_proj,down_proj}.weight       (Jakiro*: experts.{i}.{fc,proj}.weight)

There is no ``embed_tokens.weight``: the embedding is the target's. The only key allowed to be missing is the
embedding; every other difference (missing, unexpected, mis-shaped) is an error naming the key (the original loads
with ``strict=False`` and only prints). A uniform ``module.`` prefix (accelerate's ``save_state``) is stripped.
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
)
from harness.models import Target
from methods.eagle.checkpoint import (
    EAGLE_WEIGHT_FILES,
    check_head_fits_target,
    eagle_config_from_json,
    eagle_config_json,
    expected_eagle_shapes,
    head_embedding,
)
from methods.jakiro.head import JakiroHead


def jakiro_config_from_json(raw: dict, where: str) -> LlamaConfig:
    """The head config from a published Jakiro / Jakiro* ``config.json``; errors name the file and the field."""
    config = eagle_config_from_json(raw, where)
    for name in ("num_local_experts", "num_experts_per_tok"):
        if name not in raw:
            raise CheckpointError(f"{where}: missing field {name} (a Jakiro config.json has num_local_experts and "
                                  "num_experts_per_tok)")
        if not isinstance(raw[name], int) or raw[name] < 1:
            raise CheckpointError(f"{where}: {name} must be a positive integer, got {raw[name]!r}")
    if raw["num_experts_per_tok"] > raw["num_local_experts"]:
        raise CheckpointError(f"{where}: num_experts_per_tok={raw['num_experts_per_tok']} exceeds "
                              f"num_local_experts={raw['num_local_experts']}")
    config.num_local_experts = raw["num_local_experts"]
    config.num_experts_per_tok = raw["num_experts_per_tok"]
    config.expert_intermediate_size = raw.get("expert_intermediate_size") or config.hidden_size
    return config


def expected_jakiro_shapes(config: LlamaConfig, kind: str = "jakiro") -> dict[str, tuple[int, ...]]:
    """Published key -> shape (``embed_tokens.weight`` included; loaders treat it as optional): the EAGLE layer
    without its dense MLP, plus the router and the experts."""
    H, N = config.hidden_size, config.num_local_experts
    shapes = expected_eagle_shapes(config, mlp=False)
    shapes["layers.0.mlp_moe.gate.weight"] = (N + 2 if kind == "jakiro" else N, H)
    for i in range(N):
        e = f"layers.0.mlp_moe.experts.{i}."
        if kind == "jakiro":
            I = config.expert_intermediate_size
            shapes.update({e + "gate_proj.weight": (I, H), e + "up_proj.weight": (I, H),
                           e + "down_proj.weight": (H, I)})
        else:
            I = config.intermediate_size
            shapes.update({e + "fc.weight": (I, H), e + "proj.weight": (H, I)})
    return shapes


def strip_module_prefix(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop a ``module.`` prefix carried by EVERY key (accelerate/DDP saves); otherwise return ``sd`` unchanged."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def load_jakiro_head(folder: str | Path, target: Target, kind: str = "jakiro") -> JakiroHead:
    """Load a published-format Jakiro (or Jakiro*, ``kind="jakiro_star"``) head for ``target``.

    Asserts that the only key the file may lack is ``embed_tokens.weight`` (then the target's embedding is shared);
    every other missing, unexpected or mis-shaped key is a :class:`CheckpointError` naming it.
    """
    folder = Path(folder)
    what = "Jakiro head" if kind == "jakiro" else "Jakiro* head"
    config = jakiro_config_from_json(read_config(folder, what), str(folder / "config.json"))
    check_head_fits_target(config, target, folder)
    sd, path = read_weights(folder, EAGLE_WEIGHT_FILES, what)
    sd = strip_module_prefix(sd)
    check_state_dict(sd, expected_jakiro_shapes(config, kind), f"{what} {path}",
                     optional=frozenset({"embed_tokens.weight"}))
    embed, share = head_embedding(sd, target)
    head = JakiroHead(config, embed, shares_target_embedding=share, kind=kind)
    missing, unexpected = head.load_state_dict(sd, strict=False)
    leftover = sorted(set(missing) - {"embed_tokens.weight"}) + sorted(unexpected)
    if leftover:  # cannot happen after check_state_dict unless the module and the key list disagree
        raise CheckpointError(f"{what} {path}: keys not matched by the module: {', '.join(leftover)}")
    return head.to(device=target.output_device, dtype=target.dtype).eval().requires_grad_(False)


def jakiro_config_json(head: JakiroHead) -> dict:
    """The published ``config.json`` of ``head`` (EAGLE's fields plus the expert counts)."""
    raw = eagle_config_json(head.config)
    raw["num_local_experts"] = head.moe.num_experts
    raw["num_experts_per_tok"] = head.config.num_experts_per_tok
    width = getattr(head.config, "expert_intermediate_size", None)
    if head.kind == "jakiro" and width and width != head.config.hidden_size:
        raw["expert_intermediate_size"] = width  # draftbench extension; absent = H, as released
    return raw


def save_jakiro_head(head: JakiroHead, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``head`` in the published format (config.json + fp16 model.safetensors, no embedding); return folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    skip = ("rotary_emb.", "embed_tokens.")
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items() if not k.startswith(skip)}
    (folder / "config.json").write_text(json.dumps(jakiro_config_json(head), indent=2) + "\n")
    save_file(sd, str(folder / "model.safetensors"))
    return folder
