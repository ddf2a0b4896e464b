"""The ``jakiro`` training objective (released code github.com/haiduo/Jakiro ``jakiro/train/main.py``): EAGLE's losses
on the mixture M plus ``contrast_weight`` x the same on the contrastive output C against the feature two steps ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.train.objectives import Objective, register_objective
from methods.eagle.objective import eagle_losses, eagle_unrolled_hits
from methods.jakiro.checkpoint import save_jakiro_head
from methods.jakiro.head import JakiroHead


@dataclass
class JakiroObjectiveOptions:
    """Jakiro training (released ``jakiro/train/main.py``): ``L = v_weight (vloss_M + c vloss_C) + p_weight (ploss_M + c
    ploss_C)`` with
    c = ``contrast_weight`` (0.5 published; 0 trains without the contrastive output, Table 4's "without both").
    ``num_experts`` N, ``experts_per_tok`` K (None = min(2, N): the released K = 2, and all of them when N = 1, so an
    expert-count sweep ``--sweep num_experts=1,2,3,4`` needs no second flag), ``expert_intermediate_size``
    (None = H, as released)."""

    num_experts: int = 2
    experts_per_tok: int | None = None
    expert_intermediate_size: int | None = None
    p_weight: float = 0.1
    v_weight: float = 1.0
    contrast_weight: float = 0.5
    bias: bool = True
    train_vocab: int = 0  # as the eagle objective's: 0 = full vocabulary (published)

    def __post_init__(self):
        if isinstance(self.num_experts, int) and self.num_experts >= 1 and self.experts_per_tok is None:
            self.experts_per_tok = min(2, self.num_experts)
        if self.num_experts < 1 or self.experts_per_tok is None or not 1 <= self.experts_per_tok <= self.num_experts:
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
    vloss1, ploss1, _ = eagle_losses(mixture, target, mask, lm_head)
    vloss2, ploss2, _ = eagle_losses(contrast[:, :-1], target[:, 1:], mask[:, 1:], lm_head)
    return {"vloss1": vloss1, "ploss1": ploss1, "vloss2": vloss2, "ploss2": ploss2}


@register_objective("jakiro")
class JakiroObjective(Objective):
    """Jakiro's objective: EAGLE's losses on M plus ``contrast_weight`` x the same on C against the
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
        parts = jakiro_losses(out.mixture, out.contrast, batch["target"], batch["loss_mask"],
                              self.draft_lm_head.compact)
        o = self.options
        loss = (o.v_weight * (parts["vloss1"] + o.contrast_weight * parts["vloss2"])
                + o.p_weight * (parts["ploss1"] + o.contrast_weight * parts["ploss2"]))
        return loss, {name: value.item() for name, value in parts.items()}

    def accuracy(self, head, batch, k):
        return eagle_unrolled_hits(head, self.lm_head, batch["features"], batch["input_ids"], batch["target"],
                                   batch["loss_mask"], k, self.draft_lm_head.argmax)

    def save(self, head, folder):
        return save_jakiro_head(head, folder)
