"""Medusa-1: extra heads on the target's last feature, their published checkpoint format, and the method ``medusa``.

Heads (reference §5): head i = ``ResBlock × medusa_num_layers`` then ``Linear(H -> V, no bias)``, with
``ResBlock(x) = x + SiLU(Linear_HxH(x))`` (weight zero-initialised). With ``medusa_share_lm_head: true`` (draftbench's
own flag, for small targets whose V x H heads would outweigh the model) every head ends in the target's lm_head
instead. Head i reads the target's post-norm feature at the last committed position and predicts the token i+1
places after the pending root.

Checkpoint format, a folder with
    config.json                     medusa_num_heads, medusa_num_layers, base_model_name_or_path
                                    (+ medusa_share_lm_head, draftbench's, default false)
    medusa_lm_head.safetensors      (or medusa_lm_head.pt) with keys, for head i and ResBlock j < L:
                                    {i}.{j}.linear.weight [H, H], {i}.{j}.linear.bias [H], {i}.{L}.weight [V, H]
                                    (the last one absent when the lm_head is shared)
The original builds ``[ResBlock] * L``, one module repeated (weights tied when L > 1); its checkpoints still list every
``{i}.{j}`` key, so they load into the untied blocks used here. Loading is strict (names every bad key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness.engine import SpeculativeMethod
from harness.method import OptionsError
from harness.models import Target
from harness.registry import register_method
from harness.sampling import SamplingParams
from harness.tree import STATIC_TREES, DraftTree, depths, tree_from_choices
from harness.verify import verify_typical
from harness.draftvocab import check_draft_vocab, draft_lm_head
from methods.eagle import (CheckpointError, check_state_dict, read_config, read_weights, resolve_head_folder,
                           target_vocab_hidden)

MEDUSA_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class ResBlock(nn.Module):
    """``x + SiLU(linear(x))`` with the linear weight zero-initialised (so a fresh block is the identity)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads. ``forward(hidden [B, H], lm_head) -> logits [num_heads, B, V]``.

    ``lm_head`` (the target's) is used only when ``share_lm_head``; it is never registered here, so the state dict
    holds only the heads' own weights (under ``heads.``; :func:`published_state_dict` drops that prefix).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"MedusaHeads: need num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.share_lm_head = num_heads, num_layers, share_lm_head

        def head() -> nn.Sequential:
            blocks: list[nn.Module] = [ResBlock(hidden_size) for _ in range(num_layers)]
            if not share_lm_head:
                blocks.append(nn.Linear(hidden_size, vocab_size, bias=False))
            return nn.Sequential(*blocks)

        self.heads = nn.ModuleList([head() for _ in range(num_heads)])

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Logits [num_heads, B, V] of every head on hidden [B, H]."""
        if self.share_lm_head and lm_head is None:
            raise ValueError("MedusaHeads: share_lm_head is set, so forward needs the target's lm_head")
        outs = [h(hidden) for h in self.heads]  # each [B, V] or [B, H]
        if self.share_lm_head:
            outs = [lm_head(o) for o in outs]
        return torch.stack(outs)


def published_state_dict(heads: MedusaHeads) -> dict[str, torch.Tensor]:
    """The heads' weights under the published key names (``{i}.{j}.linear.weight`` ...)."""
    return {k.removeprefix("heads."): v for k, v in heads.state_dict().items()}


def expected_medusa_shapes(H: int, V: int, num_heads: int, num_layers: int, share_lm_head: bool) -> dict[str, tuple]:
    """Published key -> shape for these heads."""
    shapes: dict[str, tuple] = {}
    for i in range(num_heads):
        for j in range(num_layers):
            shapes[f"{i}.{j}.linear.weight"] = (H, H)
            shapes[f"{i}.{j}.linear.bias"] = (H,)
        if not share_lm_head:
            shapes[f"{i}.{num_layers}.weight"] = (V, H)
    return shapes


def _int_field(raw: dict, key: str, where: str, minimum: int) -> int:
    if key not in raw:
        raise CheckpointError(f"{where}: missing field {key}")
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise CheckpointError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def load_medusa_heads(folder: str | Path, target: Target) -> MedusaHeads:
    """Load published-format Medusa heads for ``target`` (on its device and dtype); strict key and shape check."""
    folder = Path(folder)
    where = str(folder / "config.json")
    raw = read_config(folder, "Medusa heads")
    num_heads = _int_field(raw, "medusa_num_heads", where, 1)
    num_layers = _int_field(raw, "medusa_num_layers", where, 0)
    share = raw.get("medusa_share_lm_head", False)
    if not isinstance(share, bool):
        raise CheckpointError(f"{where}: medusa_share_lm_head must be true or false, got {share!r}")
    V, H = target_vocab_hidden(target)
    for key, want in (("hidden_size", H), ("vocab_size", V)):
        if key in raw and raw[key] != want:
            raise CheckpointError(f"{where}: {key}={raw[key]} does not match the target {target.name!r} ({key}={want})")
    sd, path = read_weights(folder, MEDUSA_WEIGHT_FILES, "Medusa heads")
    check_state_dict(sd, expected_medusa_shapes(H, V, num_heads, num_layers, share),
                     f"Medusa heads {path} (target {target.name!r}: hidden {H}, vocab {V})")
    heads = MedusaHeads(H, V, num_heads, num_layers, share)
    heads.heads.load_state_dict(sd, strict=True)
    return heads.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


def save_medusa_heads(heads: MedusaHeads, folder: str | Path, base_model: str, dtype: torch.dtype = torch.float16,
                      fmt: str = "safetensors") -> Path:
    """Write ``heads`` in the published format; ``fmt`` = "safetensors" (as the Medusa trainer) or "pt" (legacy)."""
    if fmt not in ("safetensors", "pt"):
        raise ValueError(f"save_medusa_heads: fmt must be 'safetensors' or 'pt', got {fmt!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": base_model, "medusa_share_lm_head": heads.share_lm_head,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in published_state_dict(heads).items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(sd, folder / "medusa_lm_head.pt")
    return folder


# ----------------------------------------------------------------------------------------------------------------
# The method
# ----------------------------------------------------------------------------------------------------------------

ACCEPTANCE_RULES = ("rejection", "typical")


@dataclass
class MedusaOptions:
    """``tree``: a name in ``harness.tree.STATIC_TREES`` or explicit rank paths; its depth must not exceed the number
    of heads. ``acceptance``: "rejection" = the engine's lossless verification; "typical" = Medusa-1's typical
    acceptance with ``posterior_threshold`` (epsilon) and ``posterior_alpha`` (delta), NOT lossless at T>0.
    ``draft_vocab``: 0 = heads score the full vocabulary; N > 0 = only the N most frequent tokens of the training
    data (:mod:`harness.draftvocab`; heads that share the target's lm_head only)."""

    head: str | None = None
    tree: str | list = "medusa_mc_sim_7b_63"
    acceptance: str = "rejection"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    draft_vocab: int = 0

    def __post_init__(self):
        check_draft_vocab(self.draft_vocab)
        if self.head is not None and not isinstance(self.head, str):
            raise ValueError(f"head must be a checkpoint folder path (string), got {type(self.head).__name__}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {self.acceptance!r}")
        if not 0 < self.posterior_threshold < 1:
            raise ValueError(f"posterior_threshold must be in (0, 1), got {self.posterior_threshold}")
        if not 0 < self.posterior_alpha <= 1:
            raise ValueError(f"posterior_alpha must be in (0, 1], got {self.posterior_alpha}")
        medusa_tree(self.tree, "tree")


def medusa_tree(tree: str | list, field: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(parents [N], ranks [N])`` of option ``tree`` (a ``STATIC_TREES`` name or explicit rank paths)."""
    if isinstance(tree, str):
        if tree not in STATIC_TREES:
            raise ValueError(f"{field}: unknown tree {tree!r}; known: {', '.join(sorted(STATIC_TREES))}")
        return tree_from_choices(STATIC_TREES[tree])
    if not isinstance(tree, list) or not tree or not all(isinstance(c, list) for c in tree):
        raise ValueError(f"{field}: expected a tree name or a non-empty list of rank paths, got {tree!r}")
    return tree_from_choices(tree)


def fill_medusa_tree(head_logits: torch.Tensor, levels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """Node tokens ``[N]``: a node at level L takes rank ``ranks[node]`` of head L-1's top-k list, whoever its
    parent is (Medusa's Cartesian-product tree). head_logits [K, V], levels [N] (1-based), ranks [N].

    Example: head 0 top list [7, 3, ...], head 1 top list [9, 4, ...]; nodes (level, rank) = (1,0), (1,1), (2,1)
    -> tokens [7, 3, 4].
    """
    top = torch.topk(head_logits, int(ranks.max()) + 1, dim=-1).indices  # [K, R]
    return top[levels - 1, ranks]


@register_method("medusa")
class Medusa(SpeculativeMethod):
    """Medusa-1: head i's top-k at the last committed position fill level i+1 of a static tree below the root.

    The heads run once per cycle on the feature of the last committed token (the one whose target logits gave the
    root), counted as one draft forward. The proposal is deterministic given the context, so with
    ``acceptance="rejection"`` the engine's verification keeps the target distribution exactly. With
    ``acceptance="typical"`` :meth:`verify` uses :func:`harness.verify.verify_typical` and ``lossless`` is False.
    """

    Options = MedusaOptions
    needs_hidden_states = True

    def __init__(self, target: Target, options=None, heads: MedusaHeads | None = None):
        super().__init__(target, options)
        folder = None
        if heads is None:
            folder = resolve_head_folder(self.options.head, target, "medusa")
            heads = load_medusa_heads(folder, target)
        self.heads = heads
        self.parents, self.ranks = medusa_tree(self.options.tree, "tree")
        self.levels = depths(self.parents)  # [N]
        depth = int(self.levels.max())
        if depth > self.heads.num_heads:
            raise OptionsError(f"method 'medusa': option tree has depth {depth} but the checkpoint has only "
                               f"{self.heads.num_heads} heads (one head per tree level)")
        if self.options.draft_vocab and not self.heads.share_lm_head:
            raise OptionsError("method 'medusa': option draft_vocab needs heads that share the target's lm_head "
                               "(these have their own lm_heads)")
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), self.options.draft_vocab, folder, "medusa")
        self.feature: torch.Tensor | None = None

    @property
    def lossless(self) -> bool:
        return self.options.acceptance == "rejection"

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.feature = hidden[-1]  # [H] feature of the last prompt token

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.feature = hidden[-1]  # [H] feature of the last accepted token

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        logits = self.heads(self.feature[None].to(self.target.dtype), self.lm_head)[:, 0]  # [K, V]
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        device = logits.device
        tokens = fill_medusa_tree(logits, self.levels.to(device), self.ranks.to(device))
        return DraftTree(tokens=tokens, parents=self.parents.to(device))

    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        if self.options.acceptance == "typical":
            return verify_typical(tree, logits, sampling, self.options.posterior_threshold,
                                  self.options.posterior_alpha, generator)
        return super().verify(tree, logits, sampling, generator)
