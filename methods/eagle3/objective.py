"""The ``eagle3`` training objective (EAGLE-3, arXiv:2503.01840 Sec. 3; released trainer ``eagle/traineagle3/``):
no feature regression; the head is unrolled on its own outputs for ``length`` steps (the "training-time test") and
step j is scored by the cross-entropy between the target's distribution over the draft vocabulary and the draft's,
weighted by ``decay**(j-1)`` (published: 7 steps, 0.8).

Data: a feature dataset built with the three levels the head fuses (``draftbench data build ... --layers
low,mid,high``); the draft vocabulary is the ``draft_vocab`` most frequent tokens at the data's loss positions (the
published ``scandata`` counts the assistant tokens of the training set and keeps the ``draft_vocab_size`` = 32000
most common), stored in the head as ``d2t``/``t2d``.

Layout of the unroll: the chain that starts after true position t runs its step j at query position
p = t + j - 1 with the true token x_{p+1}, its own previous output as feature, attending to the true-feature keys up
to t and to its own earlier steps (:func:`methods.eagle.objective.unroll_mask`), and predicts x_{p+2}: exactly what
drafting sees after committing t. The released trainer indexes the chain by its start instead; the pairs, positions,
attention and targets are the same.

Where this follows the release and where not: a position counts only when the target's greedy token is in the draft
vocabulary (the release's ``position_mask``); each step's loss is averaged over its loss positions (the release
divides the masked sum by all B x S positions, padding and prompt included, which scales the loss by the batch's
share of assistant tokens); the schedule is the loop's warm-up + cosine (the release: DeepSpeed's linear
WarmupDecayLR, 12k warm-up steps to 5e-5 over 800k steps, AdamW betas (0.9, 0.95), no weight decay, no input noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.engine.draftvocab import top_tokens
from harness.train.objectives import Objective, register_objective
from methods.eagle.objective import eagle_unrolled_hits, unroll_mask
from methods.eagle3.checkpoint import check_vocab_maps, head_layer_ids, load_eagle3_head, save_eagle3_head
from methods.eagle3.head import LEVELS, Eagle3Head


@dataclass
class Eagle3ObjectiveOptions:
    draft_vocab: int = 32000  # draft vocabulary: the N most frequent loss tokens (published 32000; capped at V)
    length: int = 7           # training-time test steps (published 7)
    decay: float = 0.8        # weight of step j is decay**(j-1) (published 0.8)

    def __post_init__(self):
        for name in ("draft_vocab", "length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")


def unwrap(module: nn.Module) -> nn.Module:
    """The head inside a DistributedDataParallel wrapper (``accelerate`` wraps it with several processes)."""
    return getattr(module, "module", module)


@register_objective("eagle3")
class Eagle3Objective(Objective):
    """EAGLE-3's training-time test over a reduced draft vocabulary (see the module docstring); AdamW lr 5e-5, no
    weight decay, 12000 warm-up steps, 40 epochs, no input noise (the released ``traineagle3`` settings). Saves in
    the published EAGLE-3 format (:func:`methods.eagle3.checkpoint.save_eagle3_head`)."""

    Options = Eagle3ObjectiveOptions
    greedy_in_loss = True  # the in-vocabulary mask: with the tokens cached, only the draft vocabulary's logits run
    defaults = {"lr": 5e-5, "weight_decay": 0.0, "warmup_steps": 12000, "epochs": 40, "noise": "none"}

    def __init__(self, target, options=None):
        super().__init__(target, options)
        self.kept: torch.Tensor | None = None  # sorted target ids of the draft vocabulary
        self.layer_ids: tuple[int, ...] | None = None

    def check_data(self, manifest, where):
        layers = manifest.get("hidden_layers")
        if not layers or len(layers) != LEVELS:
            raise ValueError(f"{where}: objective 'eagle3' reads {LEVELS} target feature levels, but this dataset "
                             f"stores {'only the post-norm feature' if not layers else f'levels {layers}'}; build it "
                             "with `draftbench data build ... --layers low,mid,high`")
        self.layer_ids = tuple(layers)

    def set_token_counts(self, counts: torch.Tensor) -> None:
        """The draft vocabulary: the ``draft_vocab`` most frequent tokens of the data (all of them if V is smaller)."""
        self.kept = top_tokens(counts, min(self.options.draft_vocab, counts.shape[0]))

    def build_head(self) -> nn.Module:
        head = Eagle3Head.for_target(self.target, self.kept).float()
        if self.layer_ids is not None:
            head.config.eagle_aux_hidden_state_layer_ids = list(self.layer_ids)
        return head

    def loss(self, head, batch):
        """Sum over steps j = 1..length of ``decay**(j-1)`` x the soft cross-entropy of step j (parts ``ploss<j>``).

        Step 1 reads the fused true levels; step j > 1 the head's own output of step j-1 (gradients flow through
        the chain). The target distribution is the target's softmax restricted to the draft vocabulary and
        renormalised; positions whose target greedy token is outside the draft vocabulary are left out."""
        o = self.options
        levels, ids, mask = batch["levels"], batch["input_ids"], batch["loss_mask"]
        B, S, _ = levels.shape
        device = ids.device
        pos = torch.arange(S, device=device).expand(B, S)  # [B, S]
        on = mask > 0                                       # [B, S]
        kept = self.kept.to(device) if self.kept is not None else torch.arange(self.lm_head.weight.shape[0],
                                                                               device=device)
        with torch.no_grad():
            target_p, in_vocab = self.target_over_kept(batch["target"][on], kept,
                                                       None if "greedy" not in batch else batch["greedy"][on])
        weight, pos_on = mask[on].float(), pos[on]                                  # [n]
        logits_of = unwrap(head).logits
        total, parts, kv, x = levels.new_zeros(()), {}, None, levels
        for step in range(1, o.length + 1):
            attn = None if step == 1 else unroll_mask(S, step, device)
            pred, kv = head(x, ids, pos, kv=kv, attn_mask=attn, project=step == 1)  # [B, S, H]
            reach = weight * (pos_on >= step - 1)  # the chain needs step - 1 earlier positions
            logp = torch.log_softmax(logits_of(pred[on]).float(), dim=-1)            # [n, Vd]
            ce = -(target_p * logp).sum(-1)                                         # [n]
            step_loss = (ce * reach * in_vocab).sum() / (reach.sum() + 1e-5)
            total = total + o.decay ** (step - 1) * step_loss
            parts[f"ploss{step}"] = step_loss.item()
            x = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)  # chain's feature moves to p + 1
        return total, parts

    def target_over_kept(self, target: torch.Tensor, kept: torch.Tensor,
                         greedy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's distribution over the draft vocabulary and whether its greedy token is in it.

        target [n, H] (features f_{t+1}); kept [Vd] (sorted target ids); greedy [n] (the target's greedy tokens, when
        the batch carries them) -> (softmax of the target's logits at ``kept``, renormalised [n, Vd]; in_vocab [n]).
        With ``greedy`` only the Vd rows of ``lm_head`` run, not all V (on the default model 4,096 of 49,152)."""
        if greedy is None:
            logits = self.lm_head(target).float()                             # [n, V]
            return torch.softmax(logits[:, kept], dim=-1), torch.isin(logits.argmax(-1), kept)
        bias = self.lm_head.bias
        logits = nn.functional.linear(target, self.lm_head.weight[kept],
                                      None if bias is None else bias[kept]).float()  # [n, Vd]
        return torch.softmax(logits, dim=-1), torch.isin(greedy, kept)

    def accuracy(self, head, batch, k):
        """Top-1 hits of the draft (over its vocabulary, mapped to target ids) after 1..k unrolled steps against the
        target's greedy token (full vocabulary): what greedy verification accepts."""
        module = unwrap(head)
        return eagle_unrolled_hits(head, module.project(batch["levels"]), batch["input_ids"], self.greedy_tokens(batch),
                                   batch["loss_mask"], k, module.draft_argmax)

    def save(self, head, folder):
        head = unwrap(head)
        return save_eagle3_head(head, folder, head_layer_ids(head, self.target))

    def load(self, folder):
        """A published EAGLE-3 head; its own draft vocabulary (``d2t``/``t2d``) becomes the objective's, and the
        target layers it fuses must be the ones the data stores (:meth:`check_data`)."""
        head = load_eagle3_head(folder, self.target)
        ids = head_layer_ids(head, self.target)
        if self.layer_ids is not None and tuple(ids) != tuple(self.layer_ids):
            raise ValueError(f"{folder}: the head fuses target layers {list(ids)}, the data stores levels "
                             f"{list(self.layer_ids)}; evaluate it on data built with those layers")
        self.kept = head.to_target(torch.arange(head.draft_vocab_size, device=head.d2t.device)).cpu()
        return head

    def load_checkpoint(self, state):
        """The checkpoint's own draft vocabulary (its ``d2t``/``t2d`` buffers), then the weights."""
        self.kept = check_vocab_maps(state["d2t"], state["t2d"], "checkpoint")
        return super().load_checkpoint(state)
