"""Training objectives: how one kind of draft head is built, what its loss and its per-position draft accuracy are,
which noise its inputs get, its published hyper-parameters and how it is saved in its method's published format.

An objective lives beside its head, in the method's package, and registers itself::

    from harness.train.objectives import Objective, register_objective

    @register_objective("jakiro")
    class JakiroObjective(Objective):
        defaults = {"lr": 9e-5, "weight_decay": 1e-3, "warmup_steps": 2000, "epochs": 20, "noise": "eagle"}
        def build_head(self): ...
        def loss(self, head, batch): ...           # -> (scalar loss, {"part": float})
        def accuracy(self, head, batch, k): ...    # -> (correct [k], total [k])
        def save(self, head, folder): ...
        def load(self, folder): ...                # the saved head back (``draftbench train eval``)

The loop (:mod:`harness.train.loop`) finds it by name through :data:`OBJECTIVES`, which loads the plugins
(:func:`harness.registry.load_plugins`) when it is first read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from harness.engine.draftvocab import DraftLMHead, top_tokens
from harness.engine.method import NoOptions, build_options
from harness.models import Target
from harness.registry import Registry


class Objective:
    """How one kind of head is trained. Subclasses set ``defaults`` (TrainConfig fields) and ``Options``.

    ``defaults`` keys: lr, weight_decay, warmup_steps or warmup_ratio, epochs, noise ("eagle", "none" or a fixed
    scale; see :class:`harness.train.features.FeatureDataset`). Batches are :func:`harness.train.features.collate`
    dicts: features [B, S, H] (noised), input_ids [B, S] (x_{t+1}), target [B, S, H] (f_{t+1}), loss_mask [B, S],
    token_ids [B, S] (x_t), token_mask [B, S], attention_mask [B, S].
    """

    name: ClassVar[str] = "?"
    defaults: ClassVar[dict[str, Any]] = {}
    # the loss reads the target's greedy tokens (batch["greedy"] when the loop attaches them to the training set,
    # :meth:`harness.train.dataset.FeatureDataset.attach_greedy`); every accuracy reads them from the held-out set
    greedy_in_loss: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions

    def __init__(self, target: Target, options=None):
        self.target = target
        self.options = options if options is not None else self.Options()
        self.lm_head = target.model.get_output_embeddings()  # frozen, never trained
        self.draft_lm_head = DraftLMHead(self.lm_head)         # the draft's view; see set_token_counts

    def set_token_counts(self, counts: torch.Tensor) -> None:
        """Called by :func:`train` with the data's token frequencies (:mod:`harness.engine.draftvocab`). With option
        ``train_vocab`` N > 0 the draft side of the losses and of the accuracy uses only the N most frequent tokens
        (EAGLE-3's reduced draft vocabulary: the target distribution is renormalised over them), which makes the
        V-wide lm_head passes V/N times cheaper; run the head with ``draft_vocab`` = N to match."""
        n = getattr(self.options, "train_vocab", 0)
        if n and n < counts.shape[0]:
            self.draft_lm_head = DraftLMHead(self.lm_head, top_tokens(counts, n))

    @classmethod
    def create(cls, target: Target, options: dict[str, Any] | None = None) -> Objective:
        return cls(target, build_options(cls.Options, options, f"objective {cls.name!r}"))

    def check_data(self, manifest: dict[str, Any], where: str) -> None:
        """Raise ``ValueError`` when the feature dataset described by ``manifest`` (in folder ``where``) lacks what
        this objective reads (e.g. the extra hidden-state levels of EAGLE-3); called by :func:`train` first."""

    def build_head(self) -> nn.Module:
        raise NotImplementedError

    def loss(self, head: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def accuracy(self, head: nn.Module, batch: dict[str, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(correct [k], total [k]) counts of top-1 draft hits at draft positions 1..k."""
        raise NotImplementedError

    def greedy_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The target's greedy token at each position, ``argmax lm_head(f_{t+1})`` [B, S] (what greedy verification
        accepts): the batch's ``greedy`` when its dataset carries them
        (:meth:`harness.train.dataset.FeatureDataset.attach_greedy`), else computed from ``target``."""
        return batch["greedy"] if "greedy" in batch else self.lm_head(batch["target"]).argmax(-1)

    def save(self, head: nn.Module, folder: Path) -> Path:
        raise NotImplementedError

    def load(self, folder: Path) -> nn.Module:
        """The head :meth:`save` wrote to ``folder`` (the method's published format), ready for :meth:`loss` and
        :meth:`accuracy` (``draftbench train eval``, :mod:`harness.train.evaluate`); call :meth:`check_data` and
        :meth:`set_token_counts` first. A head that does not fit the target or the data raises ``ValueError``."""
        raise ValueError(f"objective {self.name!r} cannot load a saved head (no Objective.load)")

    def load_checkpoint(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The head of a training checkpoint: :meth:`build_head` with the checkpoint's weights ``state`` (the
        training module's state dict, as ``accelerate`` saves it; strict)."""
        head = self.build_head()
        head.load_state_dict(state)
        return head


OBJECTIVES: Registry = Registry("objective")


def register_objective(name: str):
    """Class decorator: make an :class:`Objective` subclass trainable as ``draftbench train <name>``."""

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Objective)):
            raise TypeError(f"objective {name!r} ({cls!r}) must subclass harness.train.objectives.Objective")
        return OBJECTIVES.register(name)(cls)

    return decorate


def get_objective(name: str) -> type[Objective]:
    return OBJECTIVES.get(name)


def objective_names() -> list[str]:
    return OBJECTIVES.names()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-5), EAGLE's masked average; values, mask [B, S] -> scalar."""
    return (values * mask).sum() / (mask.sum() + 1e-5)


def topk_distill(target_p: torch.Tensor, logp: torch.Tensor, k: int) -> torch.Tensor:
    """HASS's harmonized objective distillation term (Zhang et al., arXiv:2408.15766 Sec. 3): the cross-entropy
    restricted to the target's K most likely tokens, ``-sum_{v in topK(p)} p_v log q_v`` per row, which weighs the
    draft's ranking of the tokens a tree actually drafts. target_p, logp [n, V] -> [n]; K is capped at V.
    Example: p = [0.5, 0.3, 0.2], log q = [-1, -2, -3], K = 2 -> 0.5*1 + 0.3*2 = 1.1."""
    top = target_p.topk(min(k, target_p.shape[-1]), dim=-1).indices  # [n, K]
    return -(target_p.gather(-1, top) * logp.gather(-1, top)).sum(-1)


def alignable_next(align: torch.Tensor, logits: torch.Tensor, fed: torch.Tensor, k: int) -> torch.Tensor:
    """GRIFFIN's token-alignable mask (Hu et al., arXiv:2502.11018 Sec. 3), one draft step further.

    In unrolled training the chain whose step j sits at position p is fed, at step j + 1 (position p + 1), the
    data's token ``fed[p + 1]``; drafting would feed its own pick instead, so the two agree only when that token is
    among the draft's top ``k`` at step j. A chain stays alignable while this held at every earlier step; only
    alignable chains train the later steps. align [B, S] bool (step j, by position; all True at step 1), logits
    [B, S, V] (draft, step j), fed [B, S] (token ids in the logits' columns; -1 = never drafted) -> [B, S] bool
    (step j + 1; position 0 has no chain).
    Example: k=1, draft argmax [5, 7, 9, 2], fed [1, 5, 8, 9], align all True -> [False, True, False, True].
    """
    top = logits[:, :-1].topk(k, dim=-1).indices                    # [B, S-1, k]
    hit = (top == fed[:, 1:, None]).any(-1) & align[:, :-1]          # [B, S-1]: chain at p still aligned at p + 1
    return torch.cat([torch.zeros_like(hit[:, :1]), hit], dim=1)    # [B, S]
