"""Jakiro and Jakiro*: EAGLE draft heads whose MLP is a mixture of experts, their published checkpoint formats, the
methods ``jakiro`` (EAGLE-2 dynamic tree, hybrid autoregressive/parallel decoding) and ``jakiro_star`` (EAGLE-1
static tree, per-expert sampling), and the training objective ``jakiro`` (reference §3, §4, §8).

The head (:class:`JakiroHead`) is :class:`methods.eagle.EagleHead` with ``layers.0.mlp`` replaced by
``layers.0.mlp_moe`` (:class:`JakiroMoE`). With ``u = post_attention_layernorm(h)`` and ``h = x + Attn(x)``:

- router logits ``r = gate(u)``: N + 2 of them for Jakiro (N for Jakiro*, which has no contrast);
- the K selected experts are the top-K of ``r[:N]``, weighted by the softmax over their own logits
  (:func:`select_experts`; the released N > 2 code weights them by ``softmax(r[:2])`` whatever was picked, §8.4);
- mixture ``M = h + sum_j w_j e_{s_j}(u)``;
- contrast ``C = h + v_hi e_hi - v_lo e_lo`` with ``v = softmax(r[N:N+2])`` (:func:`contrast_coefficients`);
- expert features ``h + e_{s_j}(u)`` (unweighted, as Jakiro* uses them at inference).

Training and inference run the same module: :meth:`JakiroHead.forward_outputs` computes what its arguments ask
for (``contrast``, ``experts``, ``last_only``); the plain ``forward`` returns M, so EAGLE's machinery (stable KV,
unrolled accuracy) works unchanged.

Checkpoint format (reference §3.9), a folder with ``config.json`` (LLaMA fields, ``num_local_experts``,
``num_experts_per_tok``, optional ``bias``, ``rope_theta``, ``num_key_value_heads``; draftbench adds
``expert_intermediate_size`` when it is not H) and ``model.safetensors`` / ``pytorch_model.bin``::

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

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN

from harness.models import Target
from harness.registry import register_method
from harness.sampling import SamplingParams, logits_to_probs
from harness.train import Objective, eagle_losses, eagle_unrolled_hits, register_objective
from harness.tree import EAGLE_MC_SIM_7B_63, DraftTree
from harness.verify import walk_tree
from harness.draftvocab import check_draft_vocab
from methods.eagle import (
    EAGLE_WEIGHT_FILES, CheckpointError, DraftKV, DynamicCandidates, Eagle1, Eagle2, EagleHead, _check_head_option,
    check_head_fits_target, check_state_dict, eagle_config_for, eagle_config_from_json, eagle_config_json,
    expected_eagle_shapes, head_embedding, read_config, read_weights, resolve_head_folder, static_tree_choices,
)

KINDS = ("jakiro", "jakiro_star")
# Jakiro*'s tree: EAGLE-1's mc_sim_7b_63 plus one depth-6 node (J `jakiro_star/model/choices.py`): 26 nodes.
JAKIRO_STAR_TREE = EAGLE_MC_SIM_7B_63 + [[0, 0, 0, 0, 0, 0]]


# ----------------------------------------------------------------------------------------------------------------
# Mixture-of-experts maths (pure functions)
# ----------------------------------------------------------------------------------------------------------------


def select_experts(router_logits: torch.Tensor, num_experts: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``k`` experts by ``router_logits[..., :num_experts]`` and their mixture weights.

    Returns ``(ids [..., k], weights [..., k])``, best first; the weights are the softmax over the SELECTED experts'
    logits (so they sum to 1 whatever k is). Any trailing router logits (Jakiro's contrast pair) are ignored.
    Example: logits [0.0, 2.0, 1.0] (N = 3), k = 2 -> ids [1, 2], weights softmax([2, 1]) = [.731, .269].
    """
    top = torch.topk(router_logits[..., :num_experts], k, dim=-1)
    return top.indices, torch.softmax(top.values.float(), dim=-1).to(router_logits.dtype)


def contrast_pair(router_logits: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The two experts the contrast output combines, ``[..., 2]``.

    N = 2 (as released): experts (0, 1). N > 2: the two experts with the largest mixture logits ``r[:N]``, in
    expert-index order (which reduces to (0, 1) for N = 2). N = 1: (0, 0), so C = h + (v_hi - v_lo) e_0.
    Example: N = 3, r[:3] = [0.5, -1.0, 2.0] -> (0, 2).
    """
    lead = router_logits.shape[:-1]
    if num_experts == 1:
        return torch.zeros(*lead, 2, dtype=torch.long, device=router_logits.device)
    top2 = torch.topk(router_logits[..., :num_experts], 2, dim=-1).indices  # [..., 2]
    return torch.sort(top2, dim=-1).values


def contrast_coefficients(router_logits: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Signed coefficients ``[..., 2]`` of the contrast pair: ``C - h = c_0 e_{pair_0} + c_1 e_{pair_1}``.

    ``v = softmax(r[N:N+2])``; the pair member with the larger v enters with +v, the other with -v (reference
    §3.3: ``C = v_hi e_hi - v_lo e_lo``). Ties give the plus sign to pair member 0.
    Example: r[N:N+2] = [1, 0] -> v = [.731, .269] -> [+.731, -.269]; r[N:N+2] = [0, 1] -> [-.269, +.731].
    """
    v = torch.softmax(router_logits[..., num_experts:num_experts + 2].float(), dim=-1)  # [..., 2]
    hi = v.argmax(dim=-1, keepdim=True)  # [..., 1]
    sign = torch.where(torch.arange(2, device=v.device) == hi, 1.0, -1.0)  # [..., 2]
    return (sign * v).to(router_logits.dtype)


def gather_experts(all_out: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-position expert outputs: ``all_out [N, ..., H]`` (expert-major) and ``ids [..., J]`` -> ``[..., J, H]``."""
    per_pos = all_out.movedim(0, -2)  # [..., N, H]
    index = ids[..., None].expand(*ids.shape, per_pos.shape[-1])
    return torch.gather(per_pos, -2, index)


# ----------------------------------------------------------------------------------------------------------------
# The head
# ----------------------------------------------------------------------------------------------------------------


class SwiGLUExpert(nn.Module):
    """A Jakiro expert: ``down(act(gate(u)) * up(u))``, no biases (LlamaMLP with its own intermediate size)."""

    def __init__(self, hidden: int, intermediate: int, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = ACT2FN[act]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(u)) * self.up_proj(u))


class GeluExpert(nn.Module):
    """A Jakiro* expert (its ``GptNeoxMLP``): ``proj(gelu(fc(u)))``, no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.fc = nn.Linear(hidden, intermediate, bias=False)
        self.proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.nn.functional.gelu(self.fc(u)))


@dataclass
class MoEOutput:
    """What one :class:`JakiroMoE` call computed (no residual). ``ids``/``weights [..., K]`` always; ``mixture``
    ``[..., H]``; ``contrast [..., H]`` and ``experts [..., K, H]`` (selected experts, best first) when asked."""

    ids: torch.Tensor
    weights: torch.Tensor
    mixture: torch.Tensor
    contrast: torch.Tensor | None = None
    experts: torch.Tensor | None = None


class JakiroMoE(nn.Module):
    """``gate`` (router, ``num_experts + 2`` outputs when ``contrastive_router``) and ``experts``.

    ``experts_per_tok`` (K) may be changed after loading (an inference-time ablation), 1 <= K <= N. Only the
    experts some position needs are run (each densely over all positions).
    """

    def __init__(self, hidden: int, num_experts: int, experts_per_tok: int, make_expert, contrastive_router: bool):
        super().__init__()
        if num_experts < 1 or not 1 <= experts_per_tok <= num_experts:
            raise ValueError(f"need num_experts >= 1 and 1 <= experts_per_tok <= num_experts, got "
                             f"num_experts={num_experts}, experts_per_tok={experts_per_tok}")
        self.num_experts, self.experts_per_tok = num_experts, experts_per_tok
        self.contrastive_router = contrastive_router
        self.gate = nn.Linear(hidden, num_experts + (2 if contrastive_router else 0), bias=False)
        self.experts = nn.ModuleList([make_expert() for _ in range(num_experts)])

    def forward(self, u: torch.Tensor, contrast: bool = False, experts: bool = False) -> MoEOutput:
        """u [..., H] (the post-attention-normed hidden) -> :class:`MoEOutput`."""
        if contrast and not self.contrastive_router:
            raise ValueError("this head has no contrast router outputs (a Jakiro* head); contrast=True is invalid")
        r = self.gate(u)  # [..., N(+2)]
        ids, weights = select_experts(r, self.num_experts, self.experts_per_tok)  # [..., K]
        pair = contrast_pair(r, self.num_experts) if contrast else None          # [..., 2]
        needed = set(ids.unique().tolist()) | (set(pair.unique().tolist()) if pair is not None else set())
        all_out = torch.stack([self.experts[i](u) if i in needed else torch.zeros_like(u)
                               for i in range(self.num_experts)])  # [N, ..., H]
        chosen = gather_experts(all_out, ids)  # [..., K, H]
        mixture = (weights[..., None] * chosen).sum(-2)  # [..., H]
        c = None
        if pair is not None:
            coef = contrast_coefficients(r, self.num_experts)  # [..., 2]
            c = (coef[..., None] * gather_experts(all_out, pair)).sum(-2)  # [..., H]
        return MoEOutput(ids=ids, weights=weights, mixture=mixture, contrast=c, experts=chosen if experts else None)


@dataclass
class JakiroOutputs:
    """Head outputs WITH the attention residual: ``mixture [..., H]`` (M), ``contrast [..., H]`` (C) or None,
    ``experts [..., K, H]`` (h + e of each selected expert, best first) or None, and the router's choice."""

    mixture: torch.Tensor
    contrast: torch.Tensor | None
    experts: torch.Tensor | None
    expert_ids: torch.Tensor
    weights: torch.Tensor


class JakiroHead(EagleHead):
    """The EAGLE head with ``layers.0.mlp`` replaced by ``layers.0.mlp_moe`` (see the module docstring).

    ``kind`` "jakiro": SwiGLU experts of width ``config.expert_intermediate_size`` (default H, as released) and an
    N + 2 router; "jakiro_star": GeLU experts of width ``config.intermediate_size`` and an N router.
    """

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding, shares_target_embedding: bool = True,
                 kind: str = "jakiro"):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        # EagleHead builds a dense MLP of config.intermediate_size that is deleted below; build it 1 wide instead
        # (for a 7B config it would be 0.5 GB of fp32 initialised for nothing)
        narrow = copy.copy(config)
        narrow.intermediate_size = 1
        super().__init__(narrow, embed_tokens, shares_target_embedding)
        self.config = config
        self.kind = kind
        H = config.hidden_size
        if kind == "jakiro":
            width = getattr(config, "expert_intermediate_size", None) or H
            make = lambda: SwiGLUExpert(H, width, config.hidden_act)  # noqa: E731
        else:
            make = lambda: GeluExpert(H, config.intermediate_size)  # noqa: E731
        layer = self.layers[0]
        del layer.mlp
        layer.mlp_moe = JakiroMoE(H, config.num_local_experts, config.num_experts_per_tok, make,
                                  contrastive_router=kind == "jakiro")

    @classmethod
    def for_target(cls, target: Target, bias: bool = True, kind: str = "jakiro", num_experts: int = 2,
                   experts_per_tok: int = 2, expert_intermediate_size: int | None = None,
                   **overrides) -> "JakiroHead":
        """A randomly initialised head shaped for ``target`` sharing its embedding (training, tests)."""
        config = eagle_config_for(target.config, bias=bias, num_local_experts=num_experts,
                                  num_experts_per_tok=experts_per_tok,
                                  expert_intermediate_size=expert_intermediate_size or target.config.hidden_size,
                                  **overrides)
        head = cls(config, target.model.get_input_embeddings(), kind=kind)
        return head.to(device=target.device, dtype=target.dtype)

    @property
    def moe(self) -> JakiroMoE:
        return self.layers[0].mlp_moe

    def moe_outputs(self, h: torch.Tensor, contrast: bool = False, experts: bool = False) -> JakiroOutputs:
        """h [..., H] = attention block output (x + Attn(x)) -> :class:`JakiroOutputs` (residual added to all)."""
        o = self.moe(self.layers[0].post_attention_layernorm(h), contrast=contrast, experts=experts)
        return JakiroOutputs(
            mixture=h + o.mixture,
            contrast=h + o.contrast if o.contrast is not None else None,
            experts=h[..., None, :] + o.experts if o.experts is not None else None,
            expert_ids=o.ids, weights=o.weights)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The EAGLE contract: h [B, S, H] -> M [B, S, H]."""
        return self.moe_outputs(h).mixture

    def forward_outputs(self, features: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor,
                        kv: DraftKV | None = None, attn_mask: torch.Tensor | None = None, contrast: bool = False,
                        experts: bool = False, last_only: bool = False) -> tuple[JakiroOutputs, DraftKV]:
        """Like ``forward`` (same arguments, the KV of all S positions is returned) but with the outputs asked for.

        ``last_only``: the MoE runs only on the last position (outputs ``[B, 1, ...]``), as the released
        ``first_forward``; the K/V of every position come from attention and are complete either way.
        """
        h, new_kv = self.attend(self.fuse(features, token_ids), position_ids, kv, attn_mask)
        if last_only:
            h = h[:, -1:]
        return self.moe_outputs(h, contrast=contrast, experts=experts), new_kv


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------------


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
            shapes.update({e + "gate_proj.weight": (I, H), e + "up_proj.weight": (I, H), e + "down_proj.weight": (H, I)})
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
    return head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


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


# ----------------------------------------------------------------------------------------------------------------
# Candidate generation (pure functions)
# ----------------------------------------------------------------------------------------------------------------


def round_robin_children(log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k distinct children per row from R representations, taken in turn: rank 0 of representation 0, rank 0 of
    representation 1, ..., rank 1 of representation 0, ...; a token already taken is skipped.

    log_probs [n, R, V] -> (tokens [n, k], scores [n, k] = the proposing representation's log-prob, source [n, k] =
    which representation proposed it). R = 1 is plain top-k.
    Example (one row, R = 2, k = 3): rep 0 ranks tokens [5, 7, 2], rep 1 ranks [7, 9, 5] -> order 5, 7, 7(skip),
    9, 2 -> tokens [5, 7, 9] with sources [0, 1, 1] (7 first comes from rep 1: rank 0 of rep 1 precedes rank 1 of
    rep 0).
    """
    n, R, _ = log_probs.shape
    lp, tok = torch.topk(log_probs, k, dim=-1)  # [n, R, k]
    lp, tok = lp.transpose(1, 2).reshape(n, k * R), tok.transpose(1, 2).reshape(n, k * R)  # rank-major
    src = torch.arange(R, device=tok.device).repeat(k).expand(n, -1)  # [n, k*R]
    same = tok[:, :, None] == tok[:, None, :]  # [n, kR, kR]
    dup = (same & torch.ones_like(same[0]).tril(-1)).any(-1)  # [n, kR] an earlier slot has the same token
    order = torch.sort(dup.to(torch.int8), dim=-1, stable=True).indices[:, :k]  # first k distinct, in turn order
    return tok.gather(1, order), lp.gather(1, order), src.gather(1, order)


def second_rows(num_selected: int, parent_row: torch.Tensor, num_rows: int, alignment: str) -> torch.Tensor:
    """Which row's two-step prediction becomes the children of each selected node, ``[num_selected]``.

    The frontier rows ran one forward; their children were re-ranked and ``num_selected`` kept, the j-th with
    parent row ``parent_row[j]``. ``fixed``: node j's children are its OWN parent row's two-step prediction (its
    grandparent's C, which skipped node j's token). ``released``: node j gets row j (the released code attaches the
    C-predictions of level-4 node r under the r-th selected level-5 node, reference §3.4); at the root there is a
    single row, and every node gets it (j mod rows).
    Example: parent_row [2, 0, 2], 3 rows -> fixed [2, 0, 2], released [0, 1, 2].
    """
    if alignment == "fixed":
        return parent_row
    return torch.arange(num_selected, device=parent_row.device) % num_rows


# ----------------------------------------------------------------------------------------------------------------
# Methods: shared draft plumbing
# ----------------------------------------------------------------------------------------------------------------


class _MoEDraft:
    """Forwards of a :class:`JakiroHead` on the stable KV and on tree continuations, asking for extra outputs."""

    head: JakiroHead
    kv: DraftKV | None
    counters: dict[str, int]

    def stable_outputs(self, root: int, contrast: bool = False, experts: bool = False) -> JakiroOutputs:
        """Run the positions committed since the last cycle (the last paired with ``root``) into the stable KV; the
        outputs of the last position only (``mixture [1, H]`` etc.)."""
        feats = self.pending_features  # [n, H]
        root_t = torch.tensor([root], dtype=torch.long, device=feats.device)
        tokens = torch.cat([self.pending_tokens.to(feats.device), root_t])  # [n]
        start = 0 if self.kv is None else self.kv.length
        pos = torch.arange(start, start + feats.shape[0], device=feats.device)  # [n]
        out, self.kv = self.head.forward_outputs(feats[None].to(self.target.dtype), tokens[None], pos[None], self.kv,
                                                 contrast=contrast, experts=experts, last_only=True)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return _first(out)

    def tree_outputs(self, features: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor, kv: DraftKV,
                     tree_cols: torch.Tensor, contrast: bool = False,
                     experts: bool = False) -> tuple[JakiroOutputs, DraftKV]:
        """One draft forward over tree nodes (as :meth:`EagleMethodBase.tree_forward`) with the outputs asked for."""
        stable = torch.ones(tokens.shape[0], self.kv.length, dtype=torch.bool, device=tokens.device)
        out, kv = self.head.forward_outputs(features[None], tokens[None], position[None], kv,
                                            torch.cat([stable, tree_cols], 1), contrast=contrast, experts=experts)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return _first(out), kv


def _first(out: JakiroOutputs) -> JakiroOutputs:
    """Drop the batch dimension of every output."""
    return JakiroOutputs(out.mixture[0], None if out.contrast is None else out.contrast[0],
                         None if out.experts is None else out.experts[0], out.expert_ids[0], out.weights[0])


def _rows(out: JakiroOutputs, index: slice) -> JakiroOutputs:
    return JakiroOutputs(out.mixture[index], None if out.contrast is None else out.contrast[index],
                         None if out.experts is None else out.experts[index], out.expert_ids[index],
                         out.weights[index])


def _on_off(value, field: str) -> str:
    """Option values ``on``/``off`` (YAML may deliver them as booleans)."""
    if value is True or value == "on":
        return "on"
    if value is False or value == "off":
        return "off"
    raise ValueError(f"{field} must be 'on' or 'off', got {value!r}")


def _check_experts(options, head: JakiroHead) -> None:
    """Options num_experts / experts_per_tok against the checkpoint: N must match; K may be lowered or raised
    (None restores the checkpoint's K, so a head shared by several methods never keeps another's setting)."""
    N = head.moe.num_experts
    if options.num_experts is not None and options.num_experts != N:
        raise CheckpointError(f"option num_experts={options.num_experts} but the checkpoint has num_local_experts={N}")
    if options.experts_per_tok is not None and not 1 <= options.experts_per_tok <= N:
        raise ValueError(f"option experts_per_tok must be in [1, {N}] (num_local_experts of the checkpoint), "
                         f"got {options.experts_per_tok}")
    head.moe.experts_per_tok = options.experts_per_tok or head.config.num_experts_per_tok


# ----------------------------------------------------------------------------------------------------------------
# jakiro
# ----------------------------------------------------------------------------------------------------------------

MODES = ("hybrid", "ar", "parallel")


@dataclass
class JakiroOptions:
    """Options of ``jakiro`` (see :class:`Jakiro` for what each mode computes).

    ``total_tokens`` counts the root (Jakiro's evaluation uses 60); ``depth`` d: the tree has d + 1 levels;
    ``top_k``: candidates per node and frontier width. ``num_experts`` / ``experts_per_tok``: None = the
    checkpoint's ``num_local_experts`` / ``num_experts_per_tok``; num_experts must match the checkpoint, K may be
    changed at inference (1 <= K <= N). ``draft_vocab``: as eagle1's (0 = full vocabulary).
    """

    head: str | None = None
    mode: str = "hybrid"
    contrastive: str = "on"
    alignment: str = "released"
    candidates: str = "mixed"
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    num_experts: int | None = None
    experts_per_tok: int | None = None
    draft_vocab: int = 0

    def __post_init__(self):
        _check_head_option(self.head)
        check_draft_vocab(self.draft_vocab, self.top_k)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.contrastive = _on_off(self.contrastive, "contrastive")
        if self.alignment not in ("released", "fixed"):
            raise ValueError(f"alignment must be 'released' or 'fixed', got {self.alignment!r}")
        if self.candidates not in ("mixed", "decoupled"):
            raise ValueError(f"candidates must be 'mixed' or 'decoupled', got {self.candidates!r}")
        if self.total_tokens != -1 and self.total_tokens < 2:
            raise ValueError(f"total_tokens must be >= 2 (root included) or -1 (automatic), got {self.total_tokens}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        for name in ("num_experts", "experts_per_tok"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or null (read from the checkpoint), got {value!r}")
        if self.num_experts is not None and self.experts_per_tok is not None and self.experts_per_tok > self.num_experts:
            raise ValueError(f"experts_per_tok={self.experts_per_tok} exceeds num_experts={self.num_experts}")


class _Candidates:
    """Every candidate recorded in one cycle: token, cumulative log-prob, parent (candidate index, -1 = root) and
    level, plus the draft-KV column of the candidates that have been run through the head."""

    def __init__(self):
        self.tokens: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.parents: list[int] = []
        self.levels: list[int] = []
        self.column: dict[int, int] = {}

    def add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: list[int], level: int) -> int:
        """Record ``tokens [m]`` / ``scores [m]`` with their parents; returns the index of the first one."""
        first = len(self.parents)
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.extend(parents)
        self.levels.extend([level] * len(parents))
        return first

    def ancestry(self, nodes: list[int], device: torch.device) -> torch.Tensor:
        """Assign KV columns to ``nodes`` (run next, in this order) and return their masks over all run nodes,
        ``[n, columns]``: each sees its ancestors and itself (every ancestor must have been run already or be in
        ``nodes``)."""
        base = len(self.column)
        for r, c in enumerate(nodes):
            self.column[c] = base + r
        cols = torch.zeros(len(nodes), base + len(nodes), dtype=torch.bool)
        for r, c in enumerate(nodes):
            a = c
            while a >= 0:
                cols[r, self.column[a]] = True
                a = self.parents[a]
        return cols.to(device)


@dataclass
class _Frontier:
    """The nodes kept at one level: candidate ``index`` list, ``tokens [n]``, cumulative ``scores [n]`` and the
    feature each was proposed from, which is its input feature when it is run (``features [n, H]``)."""

    index: list[int]
    tokens: torch.Tensor
    scores: torch.Tensor
    features: torch.Tensor


@register_method("jakiro")
class Jakiro(_MoEDraft, Eagle2):
    """Jakiro (reference §3): EAGLE-2's dynamic tree drafted by a MoE head, with d + 1 levels.

    Every node's children come from one forward output of the node's own position: ``first`` = the next level,
    from M (``candidates=mixed``, as released) or from the K selected experts' own features h + e taken in turn
    (``candidates=decoupled``, the paper's description: siblings come from different representations; each child's
    input feature is the expert feature that proposed it); ``second`` = the level after next, the node's
    two-step prediction: C (``contrastive=on``), or M used as a two-step predictor (``contrastive=off``: the
    children of a node are re-proposed from its parent's M, no contrast). Candidates are recorded with cumulative
    log-probs exactly as EAGLE-2 (k*k per level, the k best form the next frontier), and the ``total_tokens - 1``
    best make the tree. ``alignment`` decides which row's second output a selected node gets
    (:func:`second_rows`).

    Modes (d = ``depth``; draft forwards per cycle, stable-KV forward included):

    - ``hybrid`` (as released): levels 1..d from ``first``; the forward over the level-(d-1) frontier (the
      penultimate one; the stable forward when d = 1) also computes ``second``, which supplies level d + 1. d forwards.
    - ``ar``: every level from ``first`` (EAGLE-2 with a MoE head; ``contrastive`` and ``alignment`` unused).
      d + 1 forwards.
    - ``parallel``: ``second`` replaces a forward wherever it can: every forward over the level-L frontier gives
      levels L+1 (``first``) and L+2 (``second``, when at least two levels remain); the next forward runs the
      level-(L+1) and level-(L+2) frontiers together (2k rows; the former only to put their K/V in place), and the
      level-(L+2) rows continue. ceil((d+1)/2) forwards.

    Table 4 of the paper (without parallel decoding / without the contrastive mechanism / without both) maps to:
    ``mode=ar`` / ``mode=hybrid contrastive=off`` / ``mode=ar`` with a head trained with objective option
    ``contrast_weight=0`` (at inference "without both" equals ``ar``; the difference is in training). Comparing
    ``hybrid`` with ``ar`` on the same head separates the acceptance effect from the saved forward.

    The draft is deterministic top-k in every mode (also at T>0), so verification is the deterministic-proposal
    rule and every mode is lossless.
    """

    Options = JakiroOptions

    def __init__(self, target: Target, options=None, head: JakiroHead | None = None):
        options = options if options is not None else self.Options()
        folder = None
        if head is None:
            folder = resolve_head_folder(options.head, target, "jakiro")
            head = load_jakiro_head(folder, target)
        _check_experts(options, head)
        super().__init__(target, options, head, folder)

    # ---- what each forward must compute ---------------------------------------------------------------------------
    def _wants_second(self, level: int) -> bool:
        """Does the forward over the level-``level`` frontier (0 = the stable forward) compute the second output?"""
        levels = self.options.depth + 1
        if self.options.mode == "hybrid":
            return levels - level == 2
        if self.options.mode == "parallel":
            return levels - level >= 2
        return False

    def _outputs_needed(self, level: int) -> dict[str, bool]:
        second = self._wants_second(level)
        return {"contrast": second and self.options.contrastive == "on",
                "experts": self.options.candidates == "decoupled"}

    def _first_reps(self, out: JakiroOutputs) -> torch.Tensor:
        """The representations that propose the next level, ``[n, R, H]``."""
        return out.experts if self.options.candidates == "decoupled" else out.mixture[:, None]

    def _second_rep(self, out: JakiroOutputs) -> torch.Tensor:
        """The two-step representation, ``[n, H]``: C, or M when ``contrastive=off``."""
        return out.contrast if self.options.contrastive == "on" else out.mixture

    # ---- one level of candidates ----------------------------------------------------------------------------------
    def _grow(self, cands: _Candidates, parents: _Frontier, reps: torch.Tensor, rows: torch.Tensor,
              level: int) -> _Frontier:
        """Record the children of every ``parents`` node (k each, from ``reps[rows[j]]`` for node j, ``reps``
        [n_rows, R, H]) at ``level`` and return the k best (cumulative log-prob) as the next frontier."""
        k = self.options.top_k
        tok, lp, src = round_robin_children(self.log_probs(reps), k)  # [n_rows, k] each
        tok, lp, src = tok[rows], lp[rows], src[rows]                   # [m, k]
        m = len(parents.index)
        cum = (lp + parents.scores[:, None]).flatten()                 # [m*k]
        first = cands.add(tok.flatten(), cum, [p for p in parents.index for _ in range(k)], level)
        sel = torch.topk(cum, min(k, cum.shape[0])).indices             # [k]
        feats = reps[rows][torch.arange(m, device=tok.device).repeat_interleave(k), src.flatten()]  # [m*k, H]
        return _Frontier(index=(first + sel).tolist(), tokens=tok.flatten()[sel], scores=cum[sel],
                         features=feats[sel])

    def expand(self, root: int):
        """All candidates of one cycle (see the class docstring for what each mode computes)."""
        levels, k = self.options.depth + 1, self.options.top_k
        cands = _Candidates()
        out = self.stable_outputs(root, **self._outputs_needed(0))
        stable_len = self.kv.length
        device = out.mixture.device
        frontier = _Frontier(index=[-1], tokens=torch.tensor([root], device=device), scores=torch.zeros(1, device=device),
                             features=out.mixture)
        level, kv = 0, self.kv
        while True:
            n_rows = len(frontier.index)
            rows = torch.arange(n_rows, device=device)
            nxt = self._grow(cands, frontier, self._first_reps(out), rows, level + 1)
            to_run = [nxt]
            if level + 1 == levels:
                break
            if self._wants_second(level):
                parent_row = _parent_rows(cands, nxt.index, frontier.index, device)
                rows2 = second_rows(len(nxt.index), parent_row, n_rows, self.options.alignment)
                nxt = self._grow(cands, nxt, self._second_rep(out)[:, None], rows2, level + 2)
                to_run.append(nxt)
                if level + 2 == levels:
                    break
            level = cands.levels[nxt.index[0]]
            nodes = [i for f in to_run for i in f.index]
            cols = cands.ancestry(nodes, device)
            pos = torch.tensor([stable_len - 1 + cands.levels[i] for i in nodes], device=device)
            feats = torch.cat([f.features for f in to_run])
            toks = torch.cat([f.tokens for f in to_run])
            out, kv = self.tree_outputs(feats, toks, pos, kv, cols, **self._outputs_needed(level))
            out = _rows(out, slice(len(nodes) - len(nxt.index), len(nodes)))
            frontier = nxt
        parents = torch.tensor(cands.parents, dtype=torch.long, device=device)
        return DynamicCandidates(torch.cat(cands.tokens), torch.cat(cands.scores), parents)


def _parent_rows(cands: _Candidates, nodes: list[int], rows: list[int], device: torch.device) -> torch.Tensor:
    """For each of ``nodes``, the position of its parent in the frontier list ``rows`` (-1 = the root's row 0)."""
    where = {c: r for r, c in enumerate(rows)}
    return torch.tensor([where[cands.parents[c]] for c in nodes], dtype=torch.long, device=device)


# ----------------------------------------------------------------------------------------------------------------
# jakiro_star
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class JakiroStarOptions:
    """``variant``: ``corrected`` (lossless) or ``as_published`` (the released proposal bookkeeping; NOT lossless at
    T > 0). ``tree``: static tree (default Jakiro*'s mc_sim_7b_63 + [0,0,0,0,0,0]). ``num_experts`` /
    ``experts_per_tok``: None = the checkpoint's."""

    head: str | None = None
    variant: str = "corrected"
    tree: str | list = "jakiro_star"
    num_experts: int | None = None
    experts_per_tok: int | None = None

    def __post_init__(self):
        _check_head_option(self.head)
        if self.variant not in ("corrected", "as_published"):
            raise ValueError(f"variant must be 'corrected' or 'as_published', got {self.variant!r}")
        if self.tree != "jakiro_star":
            static_tree_choices(self.tree, "tree")
        for name in ("num_experts", "experts_per_tok"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or null (read from the checkpoint), got {value!r}")


def fold_joint(probs_2v: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token marginal of a distribution over (expert, token) pairs: ``[..., R*V] -> [..., V]`` (sum over experts).
    Example: V = 2, [.1, .2, .3, .4] -> [.4, .6]."""
    return probs_2v.reshape(*probs_2v.shape[:-1], -1, vocab).sum(-2)


def joint_topk_distinct(joint_logits: torch.Tensor, vocab: int, count: int) -> torch.Tensor:
    """T = 0: the ``count`` best distinct tokens of the joint (expert, token) logits ``[R*V]``, ``[<=count]``.
    Example: V = 3, logits [5, 1, 0, 4, 6, 0] -> pairs by value: (e1, 1), (e0, 0), (e1, 0), ... -> [1, 0, 2]."""
    # each token occurs at most R times, so the best count * R pairs hold at least count distinct tokens
    best = torch.topk(joint_logits, min(count * (joint_logits.shape[0] // vocab), joint_logits.shape[0]))
    seen: list[int] = []
    for t in (best.indices % vocab).tolist():
        if t not in seen:
            seen.append(t)
            if len(seen) == count:
                break
    return torch.tensor(seen, dtype=torch.long, device=joint_logits.device)


def published_star_bookkeeping(joint_probs: torch.Tensor, drawn: torch.Tensor, expert_logits: torch.Tensor,
                               vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The released Jakiro* ``sample_moe`` (reference §4) for draws ``drawn [c]`` (indices into the 2V joint):

    tokens = drawn mod V (duplicates across experts kept); the "proposal probability" of draw j is gathered at
    ``token_j + V`` (expert 1's share, whichever expert it came from), made sequential-conditional as EAGLE-1 does,
    ``q~_j = qx_j / (1 - sum_{i<j} qx_i)`` clamped to [0, 1]; the residual distribution is
    ``softmax(mean_e softmax(expert_logits))``, a softmax of probabilities (nearly uniform).
    Returns (tokens [c], q~ [c], residual [V]).
    """
    tokens = drawn % vocab
    qx = joint_probs[tokens + vocab]  # [c]
    before = torch.cumsum(qx, 0) - qx
    q_tilde = (qx / (1 - before)).clamp(0, 1)
    residual = torch.softmax(torch.softmax(expert_logits.float(), -1).mean(0), -1)  # [V]
    return tokens, q_tilde, residual


def published_star_step(p: torch.Tensor, candidates: list[int], q_tilde: list[float], residual_q: torch.Tensor,
                        generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """EAGLE-1's q-corrected sibling test fed with Jakiro*'s numbers (NOT lossless with them).

    For each distinct candidate x (in rank order) with q~ > 0: accept with probability min(1, p(x)/q~); on rejection
    p <- normalise(max(0, p - q')), q' = ``residual_q`` with the earlier candidates zeroed and renormalised.
    Returns (position of the accepted candidate or None, the residual p).
    """
    p, q = p.clone(), residual_q.clone()
    seen: set[int] = set()
    for j, x in enumerate(candidates):
        if x in seen:
            continue
        seen.add(x)
        if q_tilde[j] > 0:
            u = float(torch.rand((), generator=generator, device=generator.device if generator else p.device))
            if u < min(1.0, float(p[x]) / q_tilde[j]):
                return j, p
            diff = (p - q).clamp(min=0)
            if float(diff.sum()) > 0:
                p = diff / diff.sum()
        q[x] = 0.0
        if float(q.sum()) > 0:
            q = q / q.sum()
    return None, p


@register_method("jakiro_star")
class JakiroStar(_MoEDraft, Eagle1):
    """Jakiro* (reference §4): EAGLE-1 static tree, GeLU experts, per-expert candidates from a joint softmax.

    For each node the K selected experts' features h + e (best router logit first, UNWEIGHTED, as the released
    inference block) give logits ``[K, V]``; their concatenation is one joint distribution over (expert, token).
    Children's input feature is the top expert's feature (as released).

    - T = 0 (both variants; the released code crashes): the best distinct tokens of the joint logits
      (:func:`joint_topk_distinct`); greedy verification; lossless.
    - T > 0, ``corrected``: q = the token marginal of ``logits_to_probs(joint)`` (:func:`fold_joint`); the children
      are drawn from q without replacement (equivalently: draw an (expert, token) pair, then remove BOTH experts'
      copies of the token, so no duplicates), and ``draft_probs`` carries q: the engine's sampled-proposal rule is
      then exact, lossless.
    - T > 0, ``as_published``: draws in the 2V space without replacement (duplicates kept), with the released
      bookkeeping (:func:`published_star_bookkeeping`) and EAGLE-1's test on it (:func:`published_star_step`).
      ``lossless`` is False and the tables say so; the chi-square audit in the tests rejects it.
    """

    Options = JakiroStarOptions

    def __init__(self, target: Target, options=None, head: JakiroHead | None = None):
        options = options if options is not None else self.Options()
        if head is None:
            head = load_jakiro_head(resolve_head_folder(options.head, target, "jakiro_star"), target, "jakiro_star")
        _check_experts(options, head)
        spec = copy.copy(options)
        spec.tree = JAKIRO_STAR_TREE if options.tree == "jakiro_star" else options.tree
        super().__init__(target, spec, head)
        self.options = options
        self._q_tilde: list[float] = []  # as_published: q~ of every node of the last proposed tree

    @property
    def lossless(self) -> bool:
        return self.options.variant == "corrected"

    def _expert_logits(self, out: JakiroOutputs) -> torch.Tensor:
        """[n, K, V] logits of each selected expert's own feature."""
        return self.lm_head(out.experts).float()

    def _children(self, expert_logits: torch.Tensor, count: int, sampling: SamplingParams,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None, list[float] | None]:
        """Children of one node from its experts' logits [K, V]: (tokens, draft_probs row or None, q~ or None)."""
        V = expert_logits.shape[-1]
        joint = expert_logits.reshape(-1)  # [K*V]
        if sampling.greedy:
            return joint_topk_distinct(joint, V, count), None, None
        probs = logits_to_probs(joint, sampling)  # [K*V]
        if self.options.variant == "corrected":
            q = fold_joint(probs, V)
            count = min(count, int(torch.count_nonzero(q)))
            return torch.multinomial(q, count, replacement=False, generator=generator), q, None
        count = min(count, int(torch.count_nonzero(probs)))
        drawn = torch.multinomial(probs, count, replacement=False, generator=generator)
        tokens, q_tilde, residual = published_star_bookkeeping(probs, drawn, expert_logits, V)
        return tokens, residual, q_tilde.tolist()

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        n = len(self.node_depths)
        device = self.target.device
        tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        alive = [False] * n
        rows: list[torch.Tensor | None] = [None] * (n + 1)
        q_tilde: dict[int, float] = {}
        out0 = self.stable_outputs(root, experts=True)
        stable_len = self.kv.length

        def fill(slot: int, expert_logits: torch.Tensor) -> None:
            kids = self.children[slot]
            if not kids:
                return
            chosen, row, qt = self._children(expert_logits, len(kids), sampling, generator)
            rows[slot] = row
            for rank_pos, node in enumerate(kids):
                if rank_pos < chosen.shape[0]:
                    tokens[node] = chosen[rank_pos]
                    alive[node] = True
                    if qt is not None:
                        q_tilde[node] = qt[rank_pos]

        fill(0, self._expert_logits(out0)[0])

        def draft_level(feats, toks, pos, kv, cols):
            out, kv = self.tree_outputs(feats, toks, pos, kv, cols, experts=True)
            return out.experts[:, 0], self._expert_logits(out), kv  # the top expert's feature, [b, K, V]

        self.expand_levels(out0.experts[0, 0], tokens, alive, fill, stable_len, draft_level)
        tree = self._compact(tokens, alive, rows)
        ordered = [i for i, a in enumerate(alive) if a]
        self._q_tilde = [q_tilde.get(i, 0.0) for i in ordered]  # per node of the returned tree (as_published)
        return tree

    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        if sampling.greedy or self.options.variant == "corrected":
            return super().verify(tree, logits, sampling, generator)
        toks = tree.tokens.tolist()

        def step(slot, p, children):
            return published_star_step(p, [toks[c] for c in children], [self._q_tilde[c] for c in children],
                                       tree.draft_probs[slot].float(), generator)

        return walk_tree(tree, logits, sampling, generator, step)


# ----------------------------------------------------------------------------------------------------------------
# Training objective
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class JakiroObjectiveOptions:
    """Jakiro training (reference §3.6): ``L = v_weight (vloss_M + c vloss_C) + p_weight (ploss_M + c ploss_C)`` with
    c = ``contrast_weight`` (0.5 published; 0 trains without the contrastive output, Table 4's "without both").
    ``num_experts`` N, ``experts_per_tok`` K, ``expert_intermediate_size`` (None = H, as released)."""

    num_experts: int = 2
    experts_per_tok: int = 2
    expert_intermediate_size: int | None = None
    p_weight: float = 0.1
    v_weight: float = 1.0
    contrast_weight: float = 0.5
    bias: bool = True
    train_vocab: int = 0  # as the eagle objective's: 0 = full vocabulary (published)

    def __post_init__(self):
        if self.num_experts < 1 or not 1 <= self.experts_per_tok <= self.num_experts:
            raise ValueError(f"need num_experts >= 1 and 1 <= experts_per_tok <= num_experts, got "
                             f"num_experts={self.num_experts}, experts_per_tok={self.experts_per_tok}")
        if self.expert_intermediate_size is not None and self.expert_intermediate_size < 1:
            raise ValueError(f"expert_intermediate_size must be >= 1 or null (= hidden size), "
                             f"got {self.expert_intermediate_size}")
        if min(self.p_weight, self.v_weight, self.contrast_weight) < 0:
            raise ValueError("p_weight, v_weight and contrast_weight must be >= 0")


def jakiro_losses(mixture: torch.Tensor, contrast: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                  lm_head: nn.Module) -> dict[str, torch.Tensor]:
    """The four Jakiro loss terms: M against f_{t+1} (``target[t]``, mask ``mask[t]``) and C against f_{t+2}
    (``target[t+1]``, mask ``mask[t+1]``; C at the last position has no target and is dropped).
    mixture, contrast, target [B, S, H]; mask [B, S] -> {vloss1, ploss1, vloss2, ploss2}."""
    vloss1, ploss1 = eagle_losses(mixture, target, mask, lm_head)
    vloss2, ploss2 = eagle_losses(contrast[:, :-1], target[:, 1:], mask[:, 1:], lm_head)
    return {"vloss1": vloss1, "ploss1": ploss1, "vloss2": vloss2, "ploss2": ploss2}


@register_objective("jakiro")
class JakiroObjective(Objective):
    """Jakiro's objective (reference §3.6): EAGLE's losses on M plus ``contrast_weight`` x the same on C against the
    feature two steps ahead; AdamW lr 9e-5, weight decay 1e-3, 2000 warm-up steps + cosine, 20 epochs, EAGLE noise.
    Saves in the published Jakiro format (:func:`save_jakiro_head`)."""

    Options = JakiroObjectiveOptions
    defaults = {"lr": 9e-5, "weight_decay": 1e-3, "warmup_steps": 2000, "epochs": 20, "noise": "eagle"}

    def build_head(self) -> nn.Module:
        o = self.options
        return JakiroHead.for_target(self.target, bias=o.bias, num_experts=o.num_experts,
                                     experts_per_tok=o.experts_per_tok,
                                     expert_intermediate_size=o.expert_intermediate_size).float()

    def loss(self, head, batch):
        B, S = batch["input_ids"].shape
        pos = torch.arange(S, device=batch["input_ids"].device).expand(B, S)
        out, _ = head.forward_outputs(batch["features"], batch["input_ids"], pos, contrast=True)
        parts = jakiro_losses(out.mixture, out.contrast, batch["target"], batch["loss_mask"], self.draft_lm_head.compact)
        o = self.options
        loss = (o.v_weight * (parts["vloss1"] + o.contrast_weight * parts["vloss2"])
                + o.p_weight * (parts["ploss1"] + o.contrast_weight * parts["ploss2"]))
        return loss, {name: value.item() for name, value in parts.items()}

    def accuracy(self, head, batch, k):
        return eagle_unrolled_hits(head, self.lm_head, batch["features"], batch["input_ids"], batch["target"],
                                   batch["loss_mask"], k, self.draft_lm_head.argmax)

    def save(self, head, folder):
        return save_jakiro_head(head, folder)
