"""The ``jakiro`` training objective (released code github.com/haiduo/Jakiro ``jakiro/train/main.py``): EAGLE's losses
on the mixture M plus ``contrast_weight`` x the same on the contrastive output C against the feature two steps ahead,
and the ``eagle`` objective's multi-step options (EAGLE-3's training-time test, arXiv:2503.01840 Sec. 3; HASS,
arXiv:2408.15766 Sec. 3; GRIFFIN, arXiv:2502.11018 Sec. 3) for the steps the head drafts autoregressively from M.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from harness.train.objectives import Objective, register_objective
from methods.eagle.objective import (
    EagleObjectiveOptions,
    eagle_losses,
    eagle_unrolled_hits,
    step_terms,
    unrolled_loss,
)
from methods.jakiro.checkpoint import load_jakiro_head, save_jakiro_head
from methods.jakiro.head import JakiroHead


@dataclass
class JakiroObjectiveOptions(EagleObjectiveOptions):
    """Jakiro training (released ``jakiro/train/main.py``): ``L = v_weight (vloss_M + c vloss_C) + p_weight (ploss_M + c
    ploss_C)`` with
    c = ``contrast_weight`` (0.5 published; 0 trains without the contrastive output, Table 4's "without both").
    ``num_experts`` N, ``experts_per_tok`` K (None = min(2, N): the released K = 2, and all of them when N = 1, so an
    expert-count sweep ``--sweep num_experts=1,2,3,4`` needs no second flag), ``expert_intermediate_size``
    (None = H, as released). The weights, ``bias``, ``train_vocab`` and the multi-step options (``unroll``,
    ``unroll_decay``, ``hass_steps``, ``topk_weight``, ``topk``, ``griffin_topk``) are the ``eagle`` objective's, with
    its defaults (the published single step)."""

    num_experts: int = 2
    experts_per_tok: int | None = None
    expert_intermediate_size: int | None = None
    contrast_weight: float = 0.5

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
        super().__post_init__()


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
        """Step 1: M against f_{t+1} (``target[t]``, mask ``loss_mask[t]``) and C against f_{t+2} (``target[t+1]``,
        mask ``loss_mask[t+1]``; C at the last position has no target and is dropped), weighted as published.
        Drafting feeds M back (then drafts the last level from M and C in parallel, arXiv:2502.06282 Sec. 3), so
        ``unroll``/``hass_steps`` n > 1 train steps 2..n on M alone, fed the head's own M, exactly as the ``eagle``
        objective trains its steps (:func:`methods.eagle.objective.unrolled_loss`); C keeps its step-1 loss.
        Parts: ``vloss1``, ``ploss1`` (M), ``vloss2``, ``ploss2`` (C), with ``topk_weight`` ``topkloss1``, and for
        each later step j ``vloss_step<j>``, ``ploss_step<j>`` (``topkloss_step<j>``; GRIFFIN's ``aligned<j>``)."""
        o = self.options
        lm_head = self.draft_lm_head.compact
        target = batch["target"]

        def step_loss(step, x, pos, kv, attn, valid):
            out, kv = head.forward_outputs(x, batch["input_ids"], pos, kv=kv, attn_mask=attn, contrast=step == 1)
            vloss, ploss, topkloss, parts = step_terms(out.mixture, target, valid, lm_head, o,
                                                       "1" if step == 1 else f"_step{step}")
            if step > 1:
                return out.mixture, kv, o.v_weight * vloss + o.p_weight * ploss + o.topk_weight * topkloss, parts
            vloss2, ploss2, _ = eagle_losses(out.contrast[:, :-1], target[:, 1:], valid[:, 1:], lm_head)
            parts.update(vloss2=vloss2.item(), ploss2=ploss2.item())
            c = o.contrast_weight
            loss = o.v_weight * (vloss + c * vloss2) + o.p_weight * (ploss + c * ploss2) + o.topk_weight * topkloss
            return out.mixture, kv, loss, parts

        return unrolled_loss(step_loss, o, batch, self.draft_lm_head)

    def accuracy(self, head, batch, k):
        return eagle_unrolled_hits(head, batch["features"], batch["input_ids"], self.greedy_tokens(batch),
                                   batch["loss_mask"], k, self.draft_lm_head.argmax)

    def save(self, head, folder):
        return save_jakiro_head(head, folder)

    def load(self, folder):
        return load_jakiro_head(folder, self.target)
