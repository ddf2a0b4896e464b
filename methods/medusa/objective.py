"""The ``medusa`` training objective (Medusa-1, arXiv:2401.10774 Sec. 2.2.1, Eq. 1): head i is trained with
cross-entropy against token t+2+i on the frozen target's features.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from harness.train.objectives import Objective, register_objective
from methods.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from methods.medusa.head import MedusaHeads


def medusa_targets(token_ids: torch.Tensor, token_mask: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and mask for Medusa head ``i`` (0-based) read at positions 0..S-3-i: token t+2+i (the base lm_head
    predicts t+1). Example: tokens [a, b, c, d], i=0 -> labels [c, d] for positions [0, 1]."""
    return token_ids[:, 2 + i:], token_mask[:, 2 + i:]


@dataclass
class MedusaObjectiveOptions:
    num_heads: int = 4
    num_layers: int = 1
    weighting: str = "paper"          # "paper": head i weighted 0.8**i (Medusa-1 Eq. 1); "uniform": the repo's sum
    decay: float = 0.8
    share_lm_head: str = "auto"       # "auto": share the target's lm_head for targets under 1B parameters
    train_vocab: int = 0              # N > 0: CE over the N most frequent tokens (shared lm_head only)

    def __post_init__(self):
        if self.weighting not in ("paper", "uniform"):
            raise ValueError(f"weighting must be 'paper' or 'uniform', got {self.weighting!r}")
        if self.share_lm_head not in ("auto", "true", "false", True, False):
            raise ValueError(f"share_lm_head must be auto, true or false, got {self.share_lm_head!r}")
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {self.num_heads}, {self.num_layers}")


class HeadsObjective(Objective):
    """The objective of heads on the target's feature that may end in the target's own lm_head (Medusa, Hydra):
    options ``num_heads``, ``num_layers``, ``share_lm_head`` and ``train_vocab``; ``heads_class(H, V, num_heads,
    num_layers, share_lm_head)`` builds them and its ``own_lm_heads()`` lists their own lm_heads."""

    heads_class: ClassVar[type]

    def shares_lm_head(self) -> bool:
        share = self.options.share_lm_head
        if share == "auto":
            return sum(p.numel() for p in self.target.model.parameters()) < 1e9
        return share in (True, "true")

    def build_head(self) -> nn.Module:
        V, H = self.lm_head.weight.shape
        heads = self.heads_class(H, V, self.options.num_heads, self.options.num_layers, self.shares_lm_head(),
                                 **self.head_extras())
        for lm in heads.own_lm_heads():  # start every head at the base lm_head, as the Medusa and Hydra trainers do
            lm.weight.data.copy_(self.lm_head.weight.data)
        return heads.to(self.lm_head.weight.device).float()

    def head_extras(self) -> dict:
        """Further keyword arguments of ``heads_class`` from the options (none here; Hydra's ``head_arch``)."""
        return {}

    def _head_lm(self):
        """What the heads end in: the target's lm_head, restricted to the draft vocabulary when ``train_vocab`` is set
        (then logits have N columns, :meth:`harness.engine.draftvocab.DraftLMHead.compact`)."""
        if self.options.train_vocab and not self.shares_lm_head():
            raise ValueError(f"{self.name} option train_vocab needs share_lm_head (heads ending in the target's "
                             "lm_head)")
        return self.draft_lm_head.compact if self.shares_lm_head() else self.lm_head

    def adopt(self, heads: nn.Module) -> nn.Module:
        """Loaded ``heads`` with their structure (``num_heads``, ``num_layers``, ``share_lm_head``) made the options',
        so that :meth:`loss` and :meth:`accuracy` read them as saved, whatever the options said."""
        self.options = replace(self.options, num_heads=heads.num_heads, num_layers=heads.num_layers,
                               share_lm_head="true" if heads.share_lm_head else "false")
        return heads


@register_objective("medusa")
class MedusaObjective(HeadsObjective):
    """Medusa-1 (arXiv:2401.10774 Sec. 2.2.1): head i (0-based) reads the clean target feature f_t and is trained with
    cross-entropy against token t+2+i, weighted 0.8**i (paper) or 1 (repo). Recipe: lr 1e-3, cosine, warm-up
    ratio 0.1, 1 epoch; the HF Trainer's default weight decay 0."""

    Options = MedusaObjectiveOptions
    defaults = {"lr": 1e-3, "weight_decay": 0.0, "warmup_ratio": 0.1, "epochs": 1, "noise": "none"}
    heads_class = MedusaHeads

    def logits(self, head, batch) -> torch.Tensor:
        return head(batch["features"], self._head_lm())  # [n_heads, B, S, V or N]

    def loss(self, head, batch):
        """Per head, masked cross-entropy averaged over its labelled positions. The heads (and the V-wide lm_head)
        run only on positions where some head has a label; the others would be multiplied by 0."""
        token_mask = batch["token_mask"] * batch["attention_mask"]
        _B, S = token_mask.shape
        n = self.options.num_heads
        labels, masks = [], []
        for i in range(n):  # head i reads positions 0..S-3-i; pad its labels/mask back to S positions
            lab, m = medusa_targets(batch["token_ids"], token_mask, i)
            labels.append(F.pad(lab, (0, S - lab.shape[1])))
            masks.append(F.pad(m, (0, S - m.shape[1])))
        labels_all, masks_all = torch.stack(labels), torch.stack(masks).float()  # [n, B, S]
        cols = self.draft_lm_head.columns(labels_all)                             # [n, B, S] label -> logit column
        masks_all = masks_all * (cols >= 0)       # a label outside a reduced draft vocabulary cannot be predicted
        on = masks_all.sum(0) > 0                                                # [B, S]
        logits = head(batch["features"][on], self._head_lm())                    # [n, m, V or N]
        total = logits.new_zeros(())
        parts = {}
        for i in range(n):
            ce = F.cross_entropy(logits[i].float(), cols[i][on].clamp(min=0), reduction="none")  # [m]
            li = (ce * masks_all[i][on]).sum() / (masks_all[i].sum() + 1e-5)
            weight = self.options.decay ** i if self.options.weighting == "paper" else 1.0
            total = total + weight * li
            parts[f"ce{i}"] = li.item()
        return total, parts

    def accuracy(self, head, batch, k):
        """Head i's top-1 against the target's greedy token t+2+i (= argmax lm_head(f_{t+1+i}))."""
        logits = self.logits(head, batch)
        want = self.greedy_tokens(batch)  # [B, S]: greedy token t+2 at position t
        n = min(k, logits.shape[0])
        correct, total = torch.zeros(k), torch.zeros(k)
        for i in range(n):
            labels, mask = want[:, i:], (batch["token_mask"] * batch["attention_mask"])[:, 2 + i:]
            labels = labels[:, : mask.shape[1]]
            best = self.draft_lm_head.token_of(logits[i, :, : mask.shape[1]].argmax(-1))  # column -> token id
            hit = (best == labels) & (mask > 0)
            correct[i], total[i] = hit.sum().item(), (mask > 0).sum().item()
        return correct, total

    def save(self, head, folder):
        return save_medusa_heads(head, folder, base_model=self.target.name)

    def load(self, folder):
        return self.adopt(load_medusa_heads(folder, self.target))
