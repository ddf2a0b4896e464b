"""Training draft heads on a feature dataset (:mod:`harness.traindata`): one loop, pluggable *objectives*.

An objective says how to build a head for a target, what its loss and its per-position draft accuracy are, which
noise its inputs get, its published hyper-parameters and how to save the head in its method's published format.
Adding one (Jakiro does this in ``methods/jakiro.py``)::

    from harness.train import Objective, register_objective

    @register_objective("jakiro")
    class JakiroObjective(Objective):
        defaults = {"lr": 9e-5, "weight_decay": 1e-3, "warmup_steps": 2000, "epochs": 20, "noise": "eagle"}
        def build_head(self): ...
        def loss(self, head, batch): ...           # -> (scalar loss, {"part": float})
        def accuracy(self, head, batch, k): ...    # -> (correct [k], total [k])
        def save(self, head, folder): ...

This module imports only torch and the registry at import time (accelerate, tqdm and matplotlib are imported by
:func:`train`), so method modules can import it cheaply. Built-in objectives: ``eagle`` and ``medusa`` (below).

The loop (:func:`train`) runs on ``accelerate``: one process, ``accelerate launch --num_processes N`` (DDP) or
DeepSpeed through an accelerate config. AdamW, gradient value clipping, linear warm-up then cosine decay, epochs or
``max_steps``, gradient accumulation, periodic held-out evaluation, resumable checkpoints
(``accelerator.save_state`` + step counter: a resumed run continues the schedule and the data order), a JSONL log,
a loss-curve PNG, and at the end the head in its published format plus ``recipe.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from harness.method import NoOptions, build_options
from harness.models import Target
from harness.registry import Registry

OBJECTIVES: Registry = Registry("objective")
CHECKPOINTS = "checkpoints"
LOG_FILE = "train_log.jsonl"


class Objective:
    """How one kind of head is trained. Subclasses set ``defaults`` (TrainConfig fields) and ``Options``.

    ``defaults`` keys: lr, weight_decay, warmup_steps or warmup_ratio, epochs, noise ("eagle", "none" or a fixed
    scale; see :class:`harness.traindata.FeatureDataset`). Batches are :func:`harness.traindata.collate` dicts:
    features [B, S, H] (noised), input_ids [B, S] (x_{t+1}), target [B, S, H] (f_{t+1}), loss_mask [B, S],
    token_ids [B, S] (x_t), token_mask [B, S], attention_mask [B, S].
    """

    name: ClassVar[str] = "?"
    defaults: ClassVar[dict[str, Any]] = {}
    Options: ClassVar[type] = NoOptions

    def __init__(self, target: Target, options=None):
        from harness.draftvocab import DraftLMHead

        self.target = target
        self.options = options if options is not None else self.Options()
        self.lm_head = target.model.get_output_embeddings()  # frozen, never trained
        self.draft_lm_head = DraftLMHead(self.lm_head)         # the draft's view; see set_token_counts

    def set_token_counts(self, counts: torch.Tensor) -> None:
        """Called by :func:`train` with the data's token frequencies (:mod:`harness.draftvocab`). With option
        ``train_vocab`` N > 0 the draft side of the losses and of the accuracy uses only the N most frequent tokens
        (EAGLE-3's reduced draft vocabulary: the target distribution is renormalised over them), which makes the
        V-wide lm_head passes V/N times cheaper; run the head with ``draft_vocab`` = N to match."""
        from harness.draftvocab import DraftLMHead, top_tokens

        n = getattr(self.options, "train_vocab", 0)
        if n and n < counts.shape[0]:
            self.draft_lm_head = DraftLMHead(self.lm_head, top_tokens(counts, n))

    @classmethod
    def create(cls, target: Target, options: dict[str, Any] | None = None) -> "Objective":
        return cls(target, build_options(cls.Options, options, f"objective {cls.name!r}"))

    def build_head(self) -> nn.Module:
        raise NotImplementedError

    def loss(self, head: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def accuracy(self, head: nn.Module, batch: dict[str, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(correct [k], total [k]) counts of top-1 draft hits at draft positions 1..k."""
        raise NotImplementedError

    def save(self, head: nn.Module, folder: Path) -> Path:
        raise NotImplementedError


def register_objective(name: str):
    """Class decorator: make an :class:`Objective` subclass trainable as ``draftbench train <name>``."""

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Objective)):
            raise TypeError(f"objective {name!r} ({cls!r}) must subclass harness.train.Objective")
        return OBJECTIVES.register(name)(cls)

    return decorate


def get_objective(name: str) -> type[Objective]:
    from harness.registry import load_builtin_methods

    load_builtin_methods()  # method modules (e.g. methods/jakiro.py) register their objectives on import
    return OBJECTIVES.get(name)


def objective_names() -> list[str]:
    from harness.registry import load_builtin_methods

    load_builtin_methods()
    return OBJECTIVES.names()


# ---------------------------------------------------------------------------------------------------------------
# Loss and accuracy pieces (pure tensor functions)
# ---------------------------------------------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-5), EAGLE's masked average; values, mask [B, S] -> scalar."""
    return (values * mask).sum() / (mask.sum() + 1e-5)


def eagle_losses(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                 lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(vloss, ploss) of reference §1.4: SmoothL1 (beta 1) averaged over H, and the soft cross-entropy
    ``-sum_v softmax(lm_head(f_{t+1}))_v log_softmax(lm_head(f̂))_v``, both masked per position.

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
    return vloss, ploss


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


def eagle_unrolled_hits(head: nn.Module, lm_head: nn.Module, features: torch.Tensor, input_ids: torch.Tensor,
                        target: torch.Tensor, mask: torch.Tensor, k: int,
                        draft_argmax=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 hits of the EAGLE draft after 1..k unrolled steps against the target's greedy token.

    Step 1 reads the true (f_t, x_{t+1}); step j reads the draft's own feature from step j-1 with the true token
    (EAGLE's "n-alpha": n estimated features, correct tokens), attending to true features up to t and to its own
    chain (:func:`unroll_mask`), i.e. exactly what drafting sees after committing t. The token to hit at query p is
    argmax lm_head(f_{p+1}) (``target[p]``), what greedy verification accepts.
    ``draft_argmax`` (features -> token ids; default argmax of ``lm_head``) is the draft's pick, e.g. over a reduced
    draft vocabulary (:meth:`harness.draftvocab.DraftLMHead.argmax`); the target's token always uses the full head.
    features, target [B, S, H]; input_ids, mask [B, S] -> (correct [k], total [k]).
    """
    draft_argmax = draft_argmax or (lambda x: lm_head(x).argmax(-1))
    B, S, _ = features.shape
    pos = torch.arange(S, device=features.device).expand(B, S)  # [B, S]
    want = lm_head(target).argmax(-1)                             # [B, S]
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


def medusa_targets(token_ids: torch.Tensor, token_mask: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and mask for Medusa head ``i`` (0-based) read at positions 0..S-3-i: token t+2+i (the base lm_head
    predicts t+1). Example: tokens [a, b, c, d], i=0 -> labels [c, d] for positions [0, 1]."""
    return token_ids[:, 2 + i:], token_mask[:, 2 + i:]


# ---------------------------------------------------------------------------------------------------------------
# Built-in objectives
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EagleOptions:
    p_weight: float = 0.1    # weight of the soft cross-entropy (published 0.1)
    v_weight: float = 1.0    # weight of the SmoothL1 feature regression (published 1.0)
    bias: bool = True        # fc bias (false for the published LLaMA-3 heads)
    train_vocab: int = 0     # 0: soft CE over the full vocabulary (published); N: over the N most frequent tokens
    unroll: int = 1          # 1: published (one step from true features); U: also steps 2..U on the head's own output
    unroll_decay: float = 0.8  # weight of step j is unroll_decay**(j-1) (EAGLE-3's training-time test weights)

    def __post_init__(self):
        if not isinstance(self.train_vocab, int) or self.train_vocab < 0:
            raise ValueError(f"train_vocab must be 0 (full vocabulary) or a positive integer, got {self.train_vocab!r}")
        if not isinstance(self.unroll, int) or self.unroll < 1:
            raise ValueError(f"unroll must be an integer >= 1, got {self.unroll!r}")


@register_objective("eagle")
class EagleObjective(Objective):
    """EAGLE-1/2 (reference §1.4): ``v_weight * SmoothL1(f̂, f_{t+1}) + p_weight * soft CE`` through the frozen
    lm_head; AdamW lr 3e-5, weight decay 0.01, 2000 warm-up steps, 20 epochs, input noise U(±0.5)·0.2·512/S.
    The schedule is warm-up + cosine (Jakiro's; EAGLE decays linearly toward a step count it never reaches)."""

    Options = EagleOptions
    defaults = {"lr": 3e-5, "weight_decay": 0.01, "warmup_steps": 2000, "epochs": 20, "noise": "eagle"}

    def build_head(self) -> nn.Module:
        from methods.eagle import EagleHead

        return EagleHead.for_target(self.target, bias=self.options.bias).float()

    def loss(self, head, batch):
        """Step 1 (a plain causal forward on the noised true features) is the published loss. With ``unroll`` U > 1, steps 2..U feed the head its own predicted feature
        (with the true token) exactly as drafting does after a commit (:func:`eagle_unrolled_hits` shows the
        layout) and add ``unroll_decay**(j-1)`` x the same loss; gradients flow through the chain (EAGLE-3's
        "training-time test", applied to the EAGLE-1 head)."""
        o = self.options
        features, ids, mask = batch["features"], batch["input_ids"], batch["loss_mask"]
        B, S, _ = features.shape
        pos = torch.arange(S, device=ids.device).expand(B, S)  # [B, S]
        total, parts, kv, x = features.new_zeros(()), {}, None, features
        for step in range(1, o.unroll + 1):
            attn = None if step == 1 else unroll_mask(S, step, ids.device)
            pred, kv = head(x, ids, pos, kv=kv, attn_mask=attn)  # [B, S, H]
            valid = mask * (pos >= step - 1)                      # the chain needs step - 1 earlier positions
            vloss, ploss = eagle_losses(pred, batch["target"], valid, self.draft_lm_head.compact)
            total = total + o.unroll_decay ** (step - 1) * (o.v_weight * vloss + o.p_weight * ploss)
            tag = str(step) if o.unroll > 1 else ""  # published run: parts "vloss", "ploss"
            parts[f"vloss{tag}"], parts[f"ploss{tag}"] = vloss.item(), ploss.item()
            x = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)  # chain's feature moves to p + 1
        return total, parts

    def accuracy(self, head, batch, k):
        return eagle_unrolled_hits(head, self.lm_head, batch["features"], batch["input_ids"], batch["target"],
                                   batch["loss_mask"], k, self.draft_lm_head.argmax)

    def save(self, head, folder):
        from methods.eagle import save_eagle_head

        return save_eagle_head(head, folder)


@dataclass
class MedusaOptions:
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


@register_objective("medusa")
class MedusaObjective(Objective):
    """Medusa-1 (reference §5): head i (0-based) reads the clean target feature f_t and is trained with
    cross-entropy against token t+2+i, weighted 0.8**i (paper) or 1 (repo). Recipe: lr 1e-3, cosine, warm-up
    ratio 0.1, 1 epoch; the HF Trainer's default weight decay 0."""

    Options = MedusaOptions
    defaults = {"lr": 1e-3, "weight_decay": 0.0, "warmup_ratio": 0.1, "epochs": 1, "noise": "none"}

    def shares_lm_head(self) -> bool:
        share = self.options.share_lm_head
        if share == "auto":
            return sum(p.numel() for p in self.target.model.parameters()) < 1e9
        return share in (True, "true")

    def build_head(self) -> nn.Module:
        from methods.medusa import MedusaHeads

        V, H = self.lm_head.weight.shape
        heads = MedusaHeads(H, V, self.options.num_heads, self.options.num_layers, self.shares_lm_head())
        if not heads.share_lm_head:  # start every head at the base lm_head, as the Medusa trainer does
            for h in heads.heads:
                h[-1].weight.data.copy_(self.lm_head.weight.data)
        return heads.to(self.lm_head.weight.device).float()

    def _head_lm(self):
        """What the heads end in: the target's lm_head, restricted to the draft vocabulary when ``train_vocab`` is set
        (then logits have N columns, :meth:`harness.draftvocab.DraftLMHead.compact`)."""
        if self.options.train_vocab and not self.shares_lm_head():
            raise ValueError("medusa option train_vocab needs share_lm_head (heads ending in the target's lm_head)")
        return self.draft_lm_head.compact if self.shares_lm_head() else self.lm_head

    def logits(self, head, batch) -> torch.Tensor:
        return head(batch["features"], self._head_lm())  # [n_heads, B, S, V or N]

    def loss(self, head, batch):
        """Per head, masked cross-entropy averaged over its labelled positions. The heads (and the V-wide lm_head)
        run only on positions where some head has a label; the others would be multiplied by 0."""
        token_mask = batch["token_mask"] * batch["attention_mask"]
        B, S = token_mask.shape
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
        want = self.lm_head(batch["target"]).argmax(-1)  # [B, S]: greedy token t+2 at position t
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
        from methods.medusa import save_medusa_heads

        return save_medusa_heads(head, folder, base_model=self.target.name)


# ---------------------------------------------------------------------------------------------------------------
# Configuration, schedule, state
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Training settings; ``None`` fields take the objective's published default (``Objective.defaults``)."""

    lr: float | None = None
    weight_decay: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip_value: float | None = 0.5
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    min_lr_ratio: float = 0.0
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int = 4
    grad_accum: int = 1
    noise: str | float | None = None
    max_len: int = 2048
    eval_fraction: float = 0.05
    max_shards: int | None = None     # train on the first N shards only (a build may still be running)
    eval_every: int = 500
    eval_positions: int = 4
    save_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    mixed_precision: str = "auto"     # "auto": bf16 on a CUDA device that supports it, else fp32 ("no")
    cpu: bool = False
    num_workers: int = 0
    resume: bool = True
    progress: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(f"batch_size and grad_accum must be >= 1, got {self.batch_size}, {self.grad_accum}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}")
        for name in ("eval_every", "save_every", "log_every", "eval_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def resolved(self, defaults: dict[str, Any]) -> "TrainConfig":
        """A copy with the objective's defaults filled in (warm-up ratio only when no step count is given)."""
        values = dataclasses.asdict(self)
        for key, value in defaults.items():
            if values.get(key) is None:
                values[key] = value
        if self.warmup_steps is not None or self.warmup_ratio is not None:
            values["warmup_steps"], values["warmup_ratio"] = self.warmup_steps, self.warmup_ratio
        values["betas"] = tuple(values["betas"])
        return TrainConfig(**values)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_ratio``.

    Example: warmup=10, total=110: step 0 -> 0.1 (the first update already moves), 9 -> 1.0, 60 -> 0.5, 110 -> 0.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class TrainState:
    """Counters saved with every checkpoint (registered with ``accelerator.register_for_checkpointing``)."""

    def __init__(self):
        self.step = 0           # optimizer steps done
        self.batches_seen = 0   # micro-batches consumed (data position)
        self.accum_step = 0     # accelerate's micro-step counter (keeps accumulation aligned on resume)
        self.wall_s = 0.0

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("step", "batches_seen", "accum_step", "wall_s"):
            setattr(self, key, state[key])


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = sorted((out_dir / CHECKPOINTS).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    done = [c for c in ckpts if (c / "done").exists()]
    return done[-1] if done else None


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------------


def evaluate(objective: Objective, head: nn.Module, dataset, cfg: TrainConfig, accelerator) -> dict[str, Any]:
    """Mean loss and top-1 accuracy per draft position on this process's share of ``dataset``, summed over
    processes (each evaluates items rank, rank + world, ...; no duplicates)."""
    from harness.traindata import collate

    idx = list(range(accelerator.process_index, len(dataset), accelerator.num_processes))
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, idx), batch_size=cfg.batch_size,
                                         collate_fn=collate)
    k = cfg.eval_positions
    sums = torch.zeros(2 + 2 * k, device=accelerator.device)  # [loss_sum, n_batches, correct[k], total[k]]
    was_training = head.training
    head.eval()
    with torch.no_grad():
        for batch in loader:
            batch = {key: v.to(accelerator.device) for key, v in batch.items()}
            loss, _ = objective.loss(head, batch)
            correct, total = objective.accuracy(head, batch, k)
            sums += torch.cat([torch.tensor([loss.item(), 1.0]), correct, total]).to(sums.device)
    head.train(was_training)
    sums = accelerator.reduce(sums, reduction="sum")
    correct, total = sums[2:2 + k], sums[2 + k:]
    acc = [round(float(c / t), 6) if t > 0 else None for c, t in zip(correct, total)]
    return {"loss": float(sums[0] / max(sums[1], 1)), "acc": acc, "positions": [int(t) for t in total]}


def _mixed_precision(choice: str, cpu: bool) -> str:
    if choice != "auto":
        return choice
    if not cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def _append_log(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def plot_log(log_path: Path, png_path: Path) -> None:
    """Training loss per step and held-out loss and accuracy per evaluation, from the JSONL log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    tr = [r for r in rows if r["kind"] == "train"]
    ev = [r for r in rows if r["kind"] == "eval"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([r["step"] for r in tr], [r["loss"] for r in tr], label="train")
    a.plot([r["step"] for r in ev], [r["loss"] for r in ev], "o-", label="held-out")
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    for j in range(len(ev[0]["acc"]) if ev else 0):
        b.plot([r["step"] for r in ev], [r["acc"][j] for r in ev], "o-", label=f"position {j + 1}")
    b.set_xlabel("step")
    b.set_ylabel("top-1 draft accuracy (held-out)")
    if ev:
        b.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def _check_run(out_dir: Path, identity: dict[str, Any], resume: bool) -> None:
    """Refuse to mix two different trainings in one ``out_dir`` (or to restart over one without ``resume``)."""
    path = out_dir / "run.json"
    if path.exists():
        old = json.loads(path.read_text())
        if not resume:
            raise ValueError(f"{out_dir} already holds a training run; resume it or choose another output directory")
        diff = sorted(k for k in identity if old.get(k) != identity[k])
        if diff:
            raise ValueError(f"{out_dir} holds a run with different settings ({', '.join(diff)}); "
                             "use another output directory")


def train(objective_name: str, target: Target, data_dir: str | Path, out_dir: str | Path,
          config: TrainConfig | None = None, command: str | None = None) -> dict[str, Any]:
    """Train a head with objective ``objective_name`` on the features in ``data_dir``; write everything to
    ``out_dir`` (``head/`` in the published format, ``recipe.json``, ``train_log.jsonl``, ``loss.png``,
    ``checkpoints/``). Continues the latest checkpoint when ``config.resume``. Returns the recipe dict."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from tqdm import tqdm

    from harness.draftvocab import save_counts
    from harness.traindata import FeatureDataset, collate, dataset_token_counts, read_manifest

    t_start = time.perf_counter()
    cls = get_objective(objective_name)
    objective = cls.create(target, (config or TrainConfig()).options)
    cfg = (config or TrainConfig()).resolved(cls.defaults)
    out_dir, data_dir = Path(out_dir), Path(data_dir)
    manifest = read_manifest(data_dir, cfg.max_shards)
    counts = dataset_token_counts(data_dir, objective.lm_head.weight.shape[0], cfg.max_shards)
    objective.set_token_counts(counts)
    hidden = target.model.get_output_embeddings().weight.shape[1]
    if manifest["hidden_size"] != hidden:
        raise ValueError(f"{data_dir}: features have hidden size {manifest['hidden_size']}, the target {target.name!r} "
                         f"has {hidden}; build the data with this target")
    accelerator = Accelerator(cpu=cfg.cpu, mixed_precision=_mixed_precision(cfg.mixed_precision, cfg.cpu),
                              gradient_accumulation_steps=cfg.grad_accum, project_dir=str(out_dir),
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(cfg.seed)
    train_ds = FeatureDataset(data_dir, "train", cfg.eval_fraction, cfg.noise, cfg.max_len, cfg.max_shards)
    eval_ds = FeatureDataset(data_dir, "eval", cfg.eval_fraction, "none", cfg.max_len, cfg.max_shards)
    if len(train_ds) == 0:
        raise ValueError(f"{data_dir}: no training conversations after holding out {len(eval_ds)} for evaluation")

    head = objective.build_head()
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate,
                                         num_workers=cfg.num_workers)
    head, optimizer, loader = accelerator.prepare(head, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / cfg.grad_accum)
    total = cfg.max_steps or cfg.epochs * steps_per_epoch
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(round((cfg.warmup_ratio or 0.0) * total))
    if warmup >= total:
        warnings.warn(f"warm-up ({warmup} steps) is not shorter than the run ({total} steps): the learning rate never "
                      "reaches its peak; pass warmup_steps/--warmup-steps for short runs")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer,
                                                  lambda s: lr_factor(s, warmup, total, cfg.min_lr_ratio))
    state = TrainState()
    accelerator.register_for_checkpointing(scheduler, state)

    manifest_sha = _sha256_file(data_dir / "manifest.json")
    identity = {"objective": objective_name, "options": dataclasses.asdict(objective.options),
                "data_manifest_sha256": manifest_sha, "total_steps": total, "batch_size": cfg.batch_size,
                "grad_accum": cfg.grad_accum, "num_processes": accelerator.num_processes, "lr": cfg.lr}
    if accelerator.is_main_process:
        _check_run(out_dir, identity, cfg.resume)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.json").write_text(json.dumps(identity, indent=1) + "\n")
    accelerator.wait_for_everyone()
    ckpt = latest_checkpoint(out_dir) if cfg.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        accelerator.step = state.accum_step
    log_path = out_dir / LOG_FILE

    def save_checkpoint() -> None:
        folder = out_dir / CHECKPOINTS / f"step-{state.step:07d}"
        state.accum_step = accelerator.step
        state.wall_s += time.perf_counter() - t_mark[0]
        t_mark[0] = time.perf_counter()
        accelerator.save_state(str(folder))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (folder / "done").write_text(str(state.step))
            old = sorted((out_dir / CHECKPOINTS).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
            for stale in old[: -cfg.keep_checkpoints]:
                shutil.rmtree(stale, ignore_errors=True)

    t_mark = [time.perf_counter()]
    bar = tqdm(total=total, initial=state.step, desc=f"train {objective_name}", unit="step",
               disable=not (cfg.progress and accelerator.is_main_process))
    running, n_running = 0.0, 0
    last_eval: dict[str, Any] | None = None
    head.train()
    while state.step < total:
        epoch, skip = divmod(state.batches_seen, len(loader))
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for batch in batches:
            with accelerator.accumulate(head):
                with accelerator.autocast():
                    loss, parts = objective.loss(head, batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.grad_clip_value:
                    accelerator.clip_grad_value_(params, cfg.grad_clip_value)
                optimizer.step()
                optimizer.zero_grad()
            state.batches_seen += 1
            running, n_running = running + loss.item(), n_running + 1
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            state.step += 1
            bar.update(1)
            if state.step % cfg.log_every == 0 or state.step == total:
                mean = accelerator.reduce(torch.tensor([running / n_running], device=accelerator.device), "mean").item()
                running, n_running = 0.0, 0
                if accelerator.is_main_process:
                    _append_log(log_path, {"kind": "train", "step": state.step, "epoch": epoch, "loss": mean,
                                           "lr": scheduler.get_last_lr()[0], **parts,
                                           "elapsed_s": round(time.perf_counter() - t_start, 3)})
                bar.set_postfix(loss=f"{mean:.4f}")
            if (state.step % cfg.eval_every == 0 or state.step == total) and len(eval_ds):
                last_eval = evaluate(objective, accelerator.unwrap_model(head), eval_ds, cfg, accelerator)
                if accelerator.is_main_process:
                    _append_log(log_path, {"kind": "eval", "step": state.step, **last_eval})
            if state.step % cfg.save_every == 0 or state.step == total:
                save_checkpoint()
            if state.step >= total:
                break
    bar.close()
    if last_eval is None and len(eval_ds):
        last_eval = evaluate(objective, accelerator.unwrap_model(head), eval_ds, cfg, accelerator)
    state.wall_s += time.perf_counter() - t_mark[0]
    recipe = {
        "objective": objective_name, "options": dataclasses.asdict(objective.options), "target": target.name,
        "data_dir": str(data_dir), "data_manifest_sha256": manifest_sha, "data_conversations": manifest["count"],
        "train_conversations": len(train_ds), "eval_conversations": len(eval_ds), "steps": state.step,
        "total_steps": total, "warmup_steps": warmup, "steps_per_epoch": steps_per_epoch,
        "config": {**dataclasses.asdict(cfg), "betas": list(cfg.betas)}, "final_eval": last_eval,
        "wall_time_s": round(state.wall_s, 3), "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision, "distributed_type": str(accelerator.distributed_type),
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if accelerator.is_main_process:
        objective.save(accelerator.unwrap_model(head), out_dir / "head")
        save_counts(counts, out_dir / "head")
        (out_dir / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
        plot_log(log_path, out_dir / "loss.png")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return recipe


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------


def _assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"--option expects KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def add_cli(subparsers) -> None:
    """Add ``train {objective}`` (choices from the objective registry) to the top-level subparsers."""
    from harness.models import DEFAULT_TARGET

    p = subparsers.add_parser("train", help="train a draft head on a feature dataset (see `data build`)")
    p.add_argument("objective", choices=objective_names())
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--data", required=True, help="feature dataset folder (from `draftbench data build`)")
    p.add_argument("--out", help="output folder (default: train-runs/<objective>-<target>)")
    for flag, kind in (("lr", float), ("weight-decay", float), ("epochs", int), ("max-steps", int),
                       ("batch-size", int), ("grad-accum", int), ("warmup-steps", int), ("warmup-ratio", float),
                       ("eval-every", int), ("save-every", int), ("eval-positions", int), ("max-len", int),
                       ("seed", int), ("log-every", int), ("max-shards", int)):
        p.add_argument("--" + flag, type=kind)
    p.add_argument("--noise", help="eagle (published), none, or a fixed scale")
    p.add_argument("--mixed-precision", choices=["auto", "no", "bf16", "fp16"])
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is present")
    p.add_argument("--no-resume", action="store_true", help="fail instead of continuing a run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="objective option")
    p.set_defaults(func=cmd_train)


def config_from_args(args) -> TrainConfig:
    values: dict[str, Any] = {}
    for name in ("lr", "weight_decay", "epochs", "max_steps", "batch_size", "grad_accum", "warmup_steps",
                 "warmup_ratio", "eval_every", "save_every", "eval_positions", "max_len", "seed", "log_every", "max_shards",
                 "mixed_precision"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if args.noise is not None:
        values["noise"] = args.noise if args.noise in ("eagle", "none") else float(args.noise)
    return TrainConfig(**values, cpu=args.cpu, resume=not args.no_resume, progress=not args.no_progress,
                       options=dict(_assignment(o) for o in args.option))


def cmd_train(args) -> int:
    from harness.models import load_target

    cfg = config_from_args(args)
    device = "cpu" if cfg.cpu or not torch.cuda.is_available() else f"cuda:{_local_rank()}"
    target = load_target(args.target, dtype="float32", device=device)
    out = args.out or str(Path("train-runs") / f"{args.objective}-{Path(args.target).name}")
    recipe = train(args.objective, target, args.data, out, cfg)
    if _local_rank() == 0:
        print(f"{out}: {recipe['steps']} steps in {recipe['wall_time_s']:.1f} s; held-out {recipe['final_eval']}")
    return 0


def _local_rank() -> int:
    import os

    return int(os.environ.get("LOCAL_RANK", "0"))


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.train <objective> ...`` (e.g. under ``accelerate launch``): the ``train`` subcommand."""
    import argparse

    parser = argparse.ArgumentParser(prog="harness.train")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
