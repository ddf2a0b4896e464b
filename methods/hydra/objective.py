"""The ``hydra`` training objective (arXiv:2402.05109): head i reads the frozen target's feature f_t and the
embeddings of tokens x_{t+1}..x_{t+1+i} (teacher forcing on the data's own tokens) and is trained on token
x_{t+2+i}: cross-entropy against the data (base Hydra, Medusa-1's objective, Sec. 3) and/or the teacher-distillation
loss of Hydra++ (Sec. 4: soft cross-entropy against the target's own next-token distribution at that position),
weighted as the Hydra trainer's ``lm_loss_weight`` / ``teacher_loss_weight``; heads are summed with weight 1, as
the Hydra trainer does. Option ``head_arch: prefix-mlp`` trains Hydra++ heads (Sec. 4): f_t is replaced by the output
at t of the prefix layer run causally over the whole sequence's features (trained with the heads; the released
trainer's dropout 0.2 is not applied here).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from harness.train.objectives import register_objective
from methods.hydra.checkpoint import load_hydra_heads, save_hydra_heads
from methods.hydra.head import HydraHeads, check_head_arch, prefix_config
from methods.medusa.objective import HeadsObjective, medusa_targets


def shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` [B, S, ...] moved k positions left along S, zero-padded at the end: out[:, t] = x[:, t+k].
    Example: [[a, b, c]], k=1 -> [[b, c, 0]]."""
    pad = [0, 0] * (x.dim() - 2) + [0, k]
    return F.pad(x[:, k:], pad)


def hydra_inputs(features: torch.Tensor, embeds: torch.Tensor, i: int) -> torch.Tensor:
    """Head ``i``'s training input at every position t: [f_t, E(x_{t+1}), ..., E(x_{t+1+i})], ``[B, S, (i+2)H]``
    from features [B, S, H] (f_t) and embeds [B, S, H] (E(x_t)); positions past the end read zeros (masked)."""
    return torch.cat([features] + [shift_left(embeds, 1 + j) for j in range(i + 1)], dim=-1)


@dataclass
class HydraObjectiveOptions:
    num_heads: int = 4
    num_layers: int = 1
    lm_loss_weight: float = 1.0       # the Hydra trainer's defaults: data cross-entropy only (base Hydra)
    teacher_loss_weight: float = 0.0  # Hydra++: 1.0 with lm_loss_weight 0.0
    share_lm_head: str = "auto"       # "auto": share the target's lm_head for targets under 1B parameters
    train_vocab: int = 0              # N > 0: losses over the N most frequent tokens (shared lm_head only)
    head_arch: str = "mlp"            # "prefix-mlp": Hydra++ (the published Hydra++ heads: 4 heads x 4 layers)

    def __post_init__(self):
        check_head_arch(self.head_arch)
        if self.share_lm_head not in ("auto", "true", "false", True, False):
            raise ValueError(f"share_lm_head must be auto, true or false, got {self.share_lm_head!r}")
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 1, got {self.num_heads}, {self.num_layers}")
        lm, teacher = self.lm_loss_weight, self.teacher_loss_weight
        if lm < 0 or teacher < 0 or lm + teacher == 0:
            raise ValueError("lm_loss_weight and teacher_loss_weight must be >= 0 and not both 0, got "
                             f"{self.lm_loss_weight}, {self.teacher_loss_weight}")


@register_objective("hydra")
class HydraObjective(HeadsObjective):
    """Hydra (arXiv:2402.05109). Recipe of the released trainer's README (Vicuna-7B): lr 5e-4, cosine, 100 warm-up
    steps, weight decay 0, no input noise; its 10 epochs are left to ``--epochs``."""

    Options = HydraObjectiveOptions
    defaults = {"lr": 5e-4, "weight_decay": 0.0, "warmup_steps": 100, "epochs": 10, "noise": "none"}
    heads_class = HydraHeads

    def head_extras(self) -> dict:
        return {"prefix": prefix_config(self.target)} if self.options.head_arch == "prefix-mlp" else {}

    def adopt(self, heads: HydraHeads) -> HydraHeads:
        heads = super().adopt(heads)
        self.options = replace(self.options, head_arch=heads.head_arch)
        return heads

    def _features(self, head, batch) -> torch.Tensor:
        """f_t as the heads read it, ``[B, S, H]`` (:meth:`HydraHeads.context`: through the prefix layer for
        prefix-mlp heads; causal, and right padding keeps the real positions exact)."""
        return head.context(batch["features"])[0]

    def _embeds(self, batch) -> torch.Tensor:
        with torch.no_grad():
            return self.target.model.get_input_embeddings()(batch["token_ids"]).float()  # [B, S, H]

    def loss(self, head, batch):
        """Per head, the masked mean of ``lm_loss_weight`` x CE(data token) + ``teacher_loss_weight`` x soft CE
        (target's distribution from the clean feature f_{t+1+i}), over positions where token t+2+i is a labelled
        one; the heads run only on those positions."""
        token_mask = batch["token_mask"] * batch["attention_mask"]
        embeds = self._embeds(batch)
        features = self._features(head, batch)
        opts = self.options
        total = features.new_zeros(())
        parts = {}
        for i in range(opts.num_heads):
            labels, mask = medusa_targets(batch["token_ids"], token_mask, i)  # [B, S-2-i]
            n = labels.shape[1]
            on = mask > 0
            if not bool(on.any()):
                continue
            x = hydra_inputs(features, embeds, i)[:, :n][on]         # [m, (i+2)H]
            logits = head(i, x, self._head_lm()).float()                      # [m, V or N]
            li = logits.new_zeros(())
            if opts.lm_loss_weight:
                cols = self.draft_lm_head.columns(labels[on])
                known = (cols >= 0).float()   # a label outside a reduced draft vocabulary cannot be predicted
                ce = F.cross_entropy(logits, cols.clamp(min=0), reduction="none")
                ce_mean = (ce * known).sum() / (known.sum() + 1e-5)
                li = li + opts.lm_loss_weight * ce_mean
                parts[f"ce{i}"] = ce_mean.item()
            if opts.teacher_loss_weight:
                with torch.no_grad():  # target[:, t] = f_{t+1}; f_{t+1+i} gives the target's p(x_{t+2+i})
                    teacher = self.draft_lm_head.compact(batch["target"][:, i:i + n][on]).float().softmax(-1)
                soft = -(teacher * logits.log_softmax(-1)).sum(-1).mean()
                li = li + opts.teacher_loss_weight * soft
                parts[f"teacher{i}"] = soft.item()
            total = total + li
        return total, parts

    def accuracy(self, head, batch, k):
        """Head i's top-1 against the target's greedy token t+2+i (= argmax lm_head(f_{t+1+i})), on the data's
        path (teacher forcing)."""
        want = self.greedy_tokens(batch)  # [B, S]: greedy token t+2 at position t
        token_mask = batch["token_mask"] * batch["attention_mask"]
        embeds = self._embeds(batch)
        features = self._features(head, batch)
        n_heads = min(k, self.options.num_heads)
        correct, total = torch.zeros(k), torch.zeros(k)
        for i in range(n_heads):
            mask = token_mask[:, 2 + i:]
            n = mask.shape[1]
            logits = head(i, hydra_inputs(features, embeds, i)[:, :n], self._head_lm())
            best = self.draft_lm_head.token_of(logits.argmax(-1))
            hit = (best == want[:, i:i + n]) & (mask > 0)
            correct[i], total[i] = hit.sum().item(), (mask > 0).sum().item()
        return correct, total

    def save(self, head, folder):
        return save_hydra_heads(head, folder, base_model=self.target.name)

    def load(self, folder):
        return self.adopt(load_hydra_heads(folder, self.target))
