"""The ``eagle`` training objective (EAGLE-1, arXiv:2401.15077 Sec. 3.2; released trainer ``eagle/train/main.py``):
feature regression plus a soft cross-entropy through the frozen lm_head, on noised target features, and three
optional multi-step objectives that leave the head unchanged: the training-time test of EAGLE-3 (arXiv:2503.01840
Sec. 3: later draft steps on the head's own outputs, gradients through the chain), HASS's harmonized context
alignment and objective distillation (arXiv:2408.15766 Sec. 3: the same steps on the head's own detached features,
each weighted 1, plus a top-K loss) and GRIFFIN's token-alignable training (arXiv:2502.11018 Sec. 3: a later step
trains only chains whose earlier draft tokens were in the draft's top-k). The multi-step loop,
:func:`unrolled_loss`, takes the head step as a function: the ``jakiro`` objective runs it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness.engine.draftvocab import DraftLMHead
from harness.train.objectives import Objective, alignable_next, masked_mean, register_objective, topk_distill
from methods.eagle.checkpoint import load_eagle_head, save_eagle_head
from methods.eagle.head import EagleHead


def eagle_losses(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, lm_head: nn.Module,
                 topk: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(vloss, ploss, topkloss) of EAGLE's trainer: SmoothL1 (beta 1) averaged over H, and the soft cross-entropy
    ``-sum_v softmax(lm_head(f_{t+1}))_v log_softmax(lm_head(f̂))_v``, both masked per position; with ``topk`` K > 0
    also HASS's top-K term (:func:`harness.train.objectives.topk_distill`, masked the same way), else 0.

    pred, target [B, S, H]; mask [B, S]. The V-wide lm_head passes run only on the n positions with mask > 0 (the
    masked-out ones would be multiplied by 0): the same value as masking all B*S positions, at n/(B*S) of the cost.
    """
    on = mask > 0                                                              # [B, S]
    weight = mask[on].float()                                                  # [n]
    with torch.no_grad():
        target_p = torch.softmax(lm_head(target[on]).float(), dim=-1)         # [n, V]
    out_logp = torch.log_softmax(lm_head(pred[on]).float(), dim=-1)           # [n, V]
    denom = mask.sum() + 1e-5
    ploss = (-(target_p * out_logp).sum(-1) * weight).sum() / denom
    vloss = masked_mean(F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1), mask)
    topkloss = (topk_distill(target_p, out_logp, topk) * weight).sum() / denom if topk else ploss.new_zeros(())
    return vloss, ploss, topkloss


def unroll_mask(S: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Attention mask [S, step * S] for draft step ``step`` (1-based) of every chain at once.

    Keys are laid out as [step-1 block | step-2 block | ... | step-``step`` block], S positions each. The chain that
    starts after true position t sits at query position p = t + step - 1; it may see true-feature keys (step 1) at
    positions <= t and, for each later step i, only its own key at position p - (step - i).
    Example: S=3, step=2 -> [[0,0,0, 1,0,0], [1,0,0, 0,1,0], [1,1,0, 0,0,1]].
    """
    p = torch.arange(S, device=device)[:, None]  # [S, 1]
    q = torch.arange(S, device=device)[None, :]  # [1, S]
    blocks = [q <= p - step + 1] + [q == p - (step - i) for i in range(2, step + 1)]
    return torch.cat(blocks, dim=1)


def eagle_unrolled_hits(head: nn.Module, features: torch.Tensor, input_ids: torch.Tensor, want: torch.Tensor,
                        mask: torch.Tensor, k: int, draft_argmax) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 hits of the EAGLE draft after 1..k unrolled steps against the target's greedy token.

    Step 1 reads the true (f_t, x_{t+1}); step j reads the draft's own feature from step j-1 with the true token
    (EAGLE's "n-alpha": n estimated features, correct tokens), attending to true features up to t and to its own
    chain (:func:`unroll_mask`), i.e. exactly what drafting sees after committing t. The token to hit at query p is
    ``want[p]``, the target's greedy token argmax lm_head(f_{p+1}) over its full vocabulary
    (:meth:`harness.train.objectives.Objective.greedy_tokens`), what greedy verification accepts.
    ``draft_argmax`` (features -> token ids) is the draft's pick, e.g. over a reduced draft vocabulary
    (:meth:`harness.engine.draftvocab.DraftLMHead.argmax`).
    features [B, S, H]; input_ids, want, mask [B, S] -> (correct [k], total [k]).
    """
    B, S, _ = features.shape
    pos = torch.arange(S, device=features.device).expand(B, S)  # [B, S]
    correct, total = torch.zeros(k), torch.zeros(k)
    kv, x = None, features
    for step in range(1, k + 1):
        attn = unroll_mask(S, step, features.device)
        pred, kv_all = head(x, input_ids, pos, kv=kv, attn_mask=attn)  # [B, S, H]
        valid = (mask > 0) & (pos >= step - 1)                          # [B, S]
        hit = (draft_argmax(pred) == want) & valid
        correct[step - 1], total[step - 1] = hit.sum().item(), valid.sum().item()
        kv = kv_all
        x = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)  # chain's feature moves to p + 1
    return correct, total



@dataclass
class EagleObjectiveOptions:
    p_weight: float = 0.1    # weight of the soft cross-entropy (published 0.1)
    v_weight: float = 1.0    # weight of the SmoothL1 feature regression (published 1.0)
    bias: bool = True        # fc bias (false for the published LLaMA-3 heads)
    train_vocab: int = 0     # 0: soft CE over the full vocabulary (published); N: over the N most frequent tokens
    unroll: int = 1          # 1: published (one step from true features); U: also steps 2..U on the head's own output
    unroll_decay: float = 0.8  # weight of step j is unroll_decay**(j-1) (EAGLE-3's training-time test weights)
    hass_steps: int = 1      # HASS: n > 1 also trains steps 2..n on the head's own DETACHED features, weight 1 each
    topk_weight: float = 0.0  # HASS's top-K distillation term weight (HASS 1.0 in its second stage, GRIFFIN 0.5)
    topk: int = 10           # K of that term (HASS and GRIFFIN: 10)
    griffin_topk: int = 0    # GRIFFIN: k > 0 trains step j only on chains whose fed tokens were in the top-k (3)

    def __post_init__(self):
        if not isinstance(self.train_vocab, int) or self.train_vocab < 0:
            raise ValueError(f"train_vocab must be 0 (full vocabulary) or a positive integer, got {self.train_vocab!r}")
        for name in ("unroll", "hass_steps", "topk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.unroll > 1 and self.hass_steps > 1:
            raise ValueError(f"set unroll (EAGLE-3's training-time test) or hass_steps (HASS), not both: got "
                             f"unroll={self.unroll}, hass_steps={self.hass_steps}")
        if not isinstance(self.griffin_topk, int) or isinstance(self.griffin_topk, bool) or self.griffin_topk < 0:
            raise ValueError(f"griffin_topk must be 0 (off) or a positive integer, got {self.griffin_topk!r}")
        if self.griffin_topk and self.steps == 1:
            raise ValueError("griffin_topk masks draft steps 2 and later: set hass_steps (or unroll) to 2 or more")
        if not isinstance(self.topk_weight, (int, float)) or self.topk_weight < 0:
            raise ValueError(f"topk_weight must be a number >= 0, got {self.topk_weight!r}")

    @property
    def steps(self) -> int:
        """Draft steps trained per position (1 = the published single step)."""
        return max(self.unroll, self.hass_steps)


def step_terms(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, lm_head: nn.Module,
               options: EagleObjectiveOptions, tag: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   dict[str, float]]:
    """One draft step's :func:`eagle_losses` (the top-K term only when ``options.topk_weight`` > 0, else 0) and
    their values named ``vloss<tag>``, ``ploss<tag>`` (``topkloss<tag>``). pred, target [B, S, H]; valid [B, S]."""
    vloss, ploss, topkloss = eagle_losses(pred, target, valid, lm_head, options.topk if options.topk_weight else 0)
    parts = {f"vloss{tag}": vloss.item(), f"ploss{tag}": ploss.item()}
    if options.topk_weight:
        parts[f"topkloss{tag}"] = topkloss.item()
    return vloss, ploss, topkloss, parts


def unrolled_loss(step_loss: Callable, options: EagleObjectiveOptions, batch: dict[str, torch.Tensor],
                  draft_lm_head: DraftLMHead) -> tuple[torch.Tensor, dict[str, float]]:
    """The multi-step training loss of a head that drafts autoregressively, given how one head step is called.

    Step 1 is a plain causal forward on the (noised) true features: the published loss. With ``unroll`` or
    ``hass_steps`` n > 1, steps 2..n feed the head its own predicted feature (with the true token) exactly as
    drafting does after a commit (:func:`eagle_unrolled_hits` shows the layout; keys and values of the earlier
    context come from the true features) and add that step's loss: ``unroll`` weights step j by
    ``unroll_decay**(j-1)`` and lets gradients flow through the chain (EAGLE-3's "training-time test",
    arXiv:2503.01840 Sec. 3); ``hass_steps`` weights every step 1 and detaches the fed-back feature, so step j
    trains the head to read its own earlier outputs without moving them (HASS's harmonized context alignment,
    arXiv:2408.15766 Sec. 3). ``griffin_topk`` k drops, from step j + 1 on, the chains whose token fed at some
    step was not in the draft's top-k at the step before (GRIFFIN, arXiv:2502.11018 Sec. 3; the token drafting
    would have fed differs from the one training feeds); part ``aligned<j>`` is the share of step-j positions kept.

    ``step_loss(step, x, pos, kv, attn, valid) -> (pred, kv, loss, parts)`` runs the head once: x [B, S, H] the fed
    features, pos [B, S], kv the keys/values of the earlier steps (None at step 1), attn the step's mask
    (:func:`unroll_mask`; None at step 1), valid [B, S] the loss mask of the chains this step trains; it returns
    the feature fed back to the next step pred [B, S, H], the keys/values so far, the step's loss and its named
    parts. batch: features [B, S, H], input_ids, loss_mask [B, S] -> (total loss, parts).
    """
    o = options
    features, ids, mask = batch["features"], batch["input_ids"], batch["loss_mask"]
    B, S, _ = features.shape
    pos = torch.arange(S, device=ids.device).expand(B, S)  # [B, S]
    fed = draft_lm_head.columns(ids) if o.griffin_topk else None  # [B, S] columns of the fed tokens
    align = torch.ones_like(mask, dtype=torch.bool)                # [B, S] GRIFFIN: alignable chains
    total, parts, kv, x = features.new_zeros(()), {}, None, features
    for step in range(1, o.steps + 1):
        attn = None if step == 1 else unroll_mask(S, step, ids.device)
        valid = mask * (pos >= step - 1) * align  # the chain needs step - 1 earlier positions
        pred, kv, loss, step_parts = step_loss(step, x, pos, kv, attn, valid)  # pred [B, S, H]
        weight = 1.0 if o.hass_steps > 1 else o.unroll_decay ** (step - 1)
        total = total + weight * loss
        parts.update(step_parts)
        if o.griffin_topk and step > 1:
            reach = mask * (pos >= step - 1)
            parts[f"aligned{step}"] = (valid.sum() / reach.sum().clamp(min=1)).item()
        if step < o.steps:
            if o.griffin_topk:
                with torch.no_grad():
                    align = alignable_next(align, draft_lm_head.compact(pred), fed, o.griffin_topk)
            nxt = pred.detach() if o.hass_steps > 1 else pred
            x = torch.cat([torch.zeros_like(nxt[:, :1]), nxt[:, :-1]], dim=1)  # chain's feature moves to p + 1
    return total, parts


@register_objective("eagle")
class EagleObjective(Objective):
    """EAGLE-1/2 (arXiv:2401.15077 Sec. 3.2): ``v_weight * SmoothL1(f̂, f_{t+1}) + p_weight * soft CE`` through the
    frozen lm_head; AdamW lr 3e-5, weight decay 0.01, 2000 warm-up steps, 20 epochs, input noise U(±0.5)·0.2·512/S.
    The schedule is warm-up + cosine (Jakiro's; EAGLE decays linearly toward a step count it never reaches)."""

    Options = EagleObjectiveOptions
    defaults = {"lr": 3e-5, "weight_decay": 0.01, "warmup_steps": 2000, "epochs": 20, "noise": "eagle"}

    def build_head(self) -> nn.Module:
        return EagleHead.for_target(self.target, bias=self.options.bias).float()

    def loss(self, head, batch):
        """Step 1 (a plain causal forward on the noised true features) is the published loss; the options train
        the later steps too (:func:`unrolled_loss`). Parts: ``vloss``, ``ploss`` (``topkloss``), suffixed by the
        step when n > 1, and ``aligned<j>``, the share of step-j positions GRIFFIN kept."""
        o = self.options
        lm_head = self.draft_lm_head.compact

        def step_loss(step, x, pos, kv, attn, valid):
            pred, kv = head(x, batch["input_ids"], pos, kv=kv, attn_mask=attn)  # [B, S, H]
            tag = str(step) if o.steps > 1 else ""  # published run: parts "vloss", "ploss"
            vloss, ploss, topkloss, parts = step_terms(pred, batch["target"], valid, lm_head, o, tag)
            return pred, kv, o.v_weight * vloss + o.p_weight * ploss + o.topk_weight * topkloss, parts

        return unrolled_loss(step_loss, o, batch, self.draft_lm_head)

    def accuracy(self, head, batch, k):
        return eagle_unrolled_hits(head, batch["features"], batch["input_ids"], self.greedy_tokens(batch),
                                   batch["loss_mask"], k, self.draft_lm_head.argmax)

    def save(self, head, folder):
        return save_eagle_head(head, folder)

    def load(self, folder):
        return load_eagle_head(folder, self.target)
