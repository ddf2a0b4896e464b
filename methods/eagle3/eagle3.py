"""The method ``eagle3``: EAGLE-2's dynamic draft tree (arXiv:2406.16858 Sec. 4) grown by an EAGLE-3 head
(arXiv:2503.01840) that reads three feature levels of the target and scores its own reduced vocabulary.

The expansion and re-ranking are EAGLE-2's own (:meth:`methods.eagle.eagle2.Eagle2.expand`,
:func:`harness.engine.tree.select_dynamic_tree`); what differs is the head-specific step, overridden here:

- the engine hands the method the target's hidden states entering layers 2, L/2 and L-3, concatenated
  (``hidden_layers``; the stable draft KV stores those ``[n, 3 H]`` features until they are run);
- the first draft forward of a cycle projects them with ``fc``; later forwards read the head's own outputs;
- a node's children are the top-k of ``log_softmax(lm_head(norm(out)))`` over the draft vocabulary, mapped to target
  ids by ``d2t`` (:meth:`Eagle3.top_tokens`).

Options: :class:`methods.eagle.eagle2.DynamicTreeOptions` (``head`` = checkpoint folder in the published format,
:mod:`methods.eagle3.checkpoint`; default the head shipped for the target in ``methods/heads/<target>/eagle3``), with
``total_tokens`` 60, ``depth`` 7 and ``top_k`` 10: the defaults of the released ``EaModel.from_pretrained`` for
EAGLE-3 (Spec-Bench's EAGLE-3 script passes depth 5). No ``draft_vocab``: the head has its own reduced vocabulary.
The draft is deterministic top-k at every temperature, as published, so verification uses the
deterministic-proposal rule (lossless).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from harness.engine.checkpoints import check_head_option, resolve_head_folder
from harness.engine.method import OptionsError, build_options, seeded
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.eagle.eagle2 import DynamicTreeOptions, Eagle2
from methods.eagle3.checkpoint import head_layer_ids, load_eagle3_head
from methods.eagle3.head import Eagle3Head


@dataclass
class Eagle3Options(DynamicTreeOptions):
    """:class:`DynamicTreeOptions` with the released EAGLE-3 defaults (``depth`` 7); ``top_k`` at most the head's
    draft vocabulary."""

    depth: int = 7


@register_method("eagle3")
class Eagle3(Eagle2):
    """EAGLE-3 (arXiv:2503.01840): three fused target levels and an own reduced vocabulary, on EAGLE-2's tree.

    See the module docstring. ``head`` may be passed directly (tests, training loops); otherwise it is loaded from
    ``options.head``."""

    Options = Eagle3Options

    def __init__(self, target: Target, options=None, head: Eagle3Head | None = None, folder: Path | None = None):
        opts = options if options is not None else self.Options()
        if head is None:
            check_head_option(opts.head)
            folder = resolve_head_folder(opts.head, target, "eagle3", SHIPPED_HEADS)
            head = load_eagle3_head(folder, target)
        super().__init__(target, opts, head=head, folder=folder)
        if self.options.top_k > head.draft_vocab_size:
            raise OptionsError(f"method {self.name!r}: option top_k={self.options.top_k} exceeds the head's draft "
                               f"vocabulary ({head.draft_vocab_size} tokens)")
        self.hidden_layers = head_layer_ids(head, target)  # the engine hands these levels over, concatenated

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options) -> Eagle3:
        """The method on a randomly initialised :class:`Eagle3Head` for ``target`` (seeded; no checkpoint read, so
        ``head`` is ignored) whose draft vocabulary is a random half of the target's (at least ``top_k`` tokens),
        so that the ``d2t`` mapping is exercised."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        V = target.model.get_output_embeddings().weight.shape[0]
        with seeded(seed):
            kept = torch.sort(torch.randperm(V)[: min(V, max(V // 2, opts.top_k))]).values
            head = Eagle3Head.for_target(target, kept)
        return cls(target, opts, head=head.eval().requires_grad_(False))

    def draft_vocab(self) -> int:
        """0 (the target's lm_head whole): the head scores its own reduced vocabulary (:meth:`top_tokens`), so
        EAGLE-3 has no ``draft_vocab`` option."""
        return 0

    def extend_stable(self, root: int) -> torch.Tensor:
        """Run the head over the positions committed since the last cycle (their fused target levels, projected by
        ``fc``, each paired with the next token, the last one with ``root``), append them to the stable KV, and return
        the last output ``[H]`` (the feature the tree grows from)."""
        levels, tokens, pos = self.cache.pending(root)  # [n, 3H], [n], [n]
        out, kv = self.head(levels[None].to(self.target.dtype), tokens[None], pos[None], self.cache.kv,
                            self.cache.pending_mask(levels.device), project=True)
        self.cache.advance(kv)
        self.count_draft_forward()
        return out[0, -1]

    def top_tokens(self, features: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best draft tokens after each output ``[..., H]``: (log-probs over the draft vocabulary
        ``[..., k]`` fp32, their TARGET ids ``[..., k]`` via ``d2t``), best first."""
        scores, draft_ids = torch.topk(torch.log_softmax(self.head.logits(features).float(), dim=-1), k, dim=-1)
        return scores, self.head.to_target(draft_ids)

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities over the TARGET vocabulary ``[..., V]`` (fp32; -inf outside the draft vocabulary)."""
        draft = torch.log_softmax(self.head.logits(features).float(), dim=-1)  # [..., Vd]
        out = draft.new_full((*draft.shape[:-1], self.head.t2d.shape[0]), float("-inf"))
        kept = self.head.to_target(torch.arange(draft.shape[-1], device=draft.device))
        return out.index_copy_(-1, kept, draft)
