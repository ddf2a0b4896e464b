"""What the methods on an :class:`methods.eagle.head.EagleHead` share (``eagle1``, ``eagle2`` and the methods built on
them): the head, the target's lm_head as the draft sees it, the stable draft KV and the head's forwards on it and on
a tree's temporary continuation (EAGLE, arXiv:2401.15077 Sec. 3.1).

The head needs the target's post-norm features (``needs_hidden_states``); option ``head`` = checkpoint folder,
default the head shipped for the target in ``methods/heads/<target>/eagle``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.engine.checkpoints import resolve_head_folder
from harness.engine.draftcache import DraftCache, DraftKV
from harness.engine.draftvocab import draft_lm_head
from harness.engine.method import build_options, seeded
from harness.engine.speculative import SpeculativeMethod
from harness.measure.metrics import draft_kv_bytes
from harness.models import Target, set_head_precision
from methods import SHIPPED_HEADS
from methods.eagle.checkpoint import load_eagle_head
from methods.eagle.head import EagleHead


class EagleMethodBase(SpeculativeMethod):
    """What eagle1 and eagle2 share: the head, the stable draft KV and its update from committed positions.

    ``head`` may be passed directly (tests, training loops); otherwise it is loaded from ``options.head``.
    """

    needs_hidden_states = True

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options)
        if head is None:
            folder = resolve_head_folder(self.options.head, target, "eagle", SHIPPED_HEADS)
            head = load_eagle_head(folder, target)
        # option head_precision (the dynamic-tree methods'): the head's own weights in that precision
        self.head = set_head_precision(head, target, getattr(self.options, "head_precision", None))
        # the draft's view of the target's lm_head: all rows, or the draft_vocab most frequent tokens
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), self.draft_vocab(), folder, self.name)
        # the stable draft KV, kept in step with the committed sequence; option draft_window (every head method's):
        # the draft's attention window in positions, 0 = the whole context as published
        self.cache = DraftCache(self.options.draft_window)

    def draft_vocab(self) -> int:
        """Option ``draft_vocab``: 0 = the draft scores the target's whole vocabulary (as published); N > 0 = only the
        N most frequent tokens of the head's training data (:mod:`harness.engine.draftvocab`)."""
        return self.options.draft_vocab

    def draft_kv_bytes(self, positions: int) -> int:
        """The stable KV of the head's one decoder layer (a :class:`DraftKV`) at ``positions`` context tokens, in the
        head's dtype, within option ``draft_window`` (:func:`harness.measure.metrics.draft_kv_bytes`)."""
        config, dtype = self.head.config, next(self.head.parameters()).dtype
        return draft_kv_bytes(1, config.num_key_value_heads, config.head_dim, positions, dtype.itemsize,
                              self.cache.window)

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options) -> EagleMethodBase:
        """The method on a randomly initialised :class:`EagleHead` for ``target`` (seeded; no checkpoint read, so
        ``head`` is ignored and ``draft_vocab`` must stay 0)."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        with seeded(seed):
            head = EagleHead.for_target(target)
        return cls(target, opts, head=head.eval().requires_grad_(False))

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.cache.reset(prompt_ids, hidden)

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.cache.commit(tokens, hidden)

    def count_draft_forward(self) -> None:
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1

    def extend_stable(self, root: int) -> torch.Tensor:
        """Run the head over the positions committed since the last cycle (pairs ``(f_t, x_{t+1})``, the last one
        paired with ``root``), append them to the stable KV, and return the last output feature ``[H]``."""
        feats, tokens, pos = self.cache.pending(root)  # [n, H], [n], [n]
        out, kv = self.head(feats[None].to(self.target.dtype), tokens[None], pos[None], self.cache.kv,
                            self.cache.pending_mask(feats.device))
        self.cache.advance(kv)
        self.count_draft_forward()
        return out[0, -1]

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities ``[..., V]`` (fp32) of predicted features ``[..., H]`` through the target lm_head."""
        return torch.log_softmax(self.lm_head(features).float(), dim=-1)

    def top_tokens(self, features: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's ``k`` best next tokens after each of ``features [..., H]``: (log-probs ``[..., k]`` fp32,
        target token ids ``[..., k]``), best first. The head-specific step of EAGLE-2's expansion
        (:meth:`methods.eagle.eagle2.Eagle2.expand`); EAGLE-3 overrides it (its own lm_head over a reduced
        vocabulary, ids mapped by d2t)."""
        scores, tokens = torch.topk(self.log_probs(features), k, dim=-1)
        return scores, tokens

    def tree_forward(self, features: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor,
                     kv: DraftKV, tree_cols: torch.Tensor) -> tuple[torch.Tensor, DraftKV]:
        """One draft forward over tree nodes on a temporary continuation of the stable KV.

        features [n, H] (each node's parent's predicted feature), tokens [n], position [n], kv = stable KV
        followed by the tree nodes run so far, tree_cols bool [n, kv.length - stable_len + n] = which of those
        tree nodes (and itself) each node may see. Returns (out [n, H], kv extended by n).
        """
        stable = self.cache.stable_columns(tokens.shape[0], tokens.device)
        out, kv = self.head(features[None], tokens[None], position[None], kv, torch.cat([stable, tree_cols], 1))
        self.count_draft_forward()
        return out[0], kv
