"""Jakiro's mixture of experts (Jakiro, arXiv:2502.06282; released code github.com/haiduo/Jakiro
``jakiro/model/cnets.py``, ``mlp_moe``):
the router maths as pure functions, the two expert kinds and :class:`JakiroMoE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN


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

    ``v = softmax(r[N:N+2])``; the pair member with the larger v enters with +v, the other with -v (released
    ``mlp_moe``: ``C = v_hi e_hi - v_lo e_lo``). Ties give the plus sign to pair member 0.
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

    ``experts_per_tok`` (K) may be changed after loading (an inference-time ablation), 1 <= K <= N. Every expert
    runs densely over all positions (no host read of the router's choice).
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
        # every expert runs densely: choosing only the needed ones would read the router's choice on the host
        # (a device round trip per draft forward); N is small and the unused outputs are never gathered
        all_out = torch.stack([expert(u) for expert in self.experts])  # [N, ..., H]
        chosen = gather_experts(all_out, ids)  # [..., K, H]
        mixture = (weights[..., None] * chosen).sum(-2)  # [..., H]
        c = None
        if pair is not None:
            coef = contrast_coefficients(r, self.num_experts)  # [..., 2]
            c = (coef[..., None] * gather_experts(all_out, pair)).sum(-2)  # [..., H]
        return MoEOutput(ids=ids, weights=weights, mixture=mixture, contrast=c, experts=chosen if experts else None)


