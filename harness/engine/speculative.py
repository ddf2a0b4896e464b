"""The one speculative decoding loop: every speculative method only proposes draft trees and hears what was accepted.

A method subclasses :class:`SpeculativeMethod` and implements three verbs::

    begin(prompt_ids [1, P], hidden [P, H] | None)    # new turn; the prompt is committed in the target cache
    propose(root, sampling, generator) -> DraftTree    # a tree below the pending token `root`
    accept(tokens, hidden [A, H] | None, next_root)    # tokens = [root] + accepted drafts, now committed

and the engine (:meth:`SpeculativeMethod.generate`) does the rest:

1. prefill: the target runs over the prompt with a transformers ``DynamicCache``; x0 = ``next_token`` of the last
   logits is emitted as step 0 (accept length 1) and becomes the first root (emitted, not yet in the cache);
2. loop: ``tree = propose(root)``; ONE target forward over ``[root, *tree.tokens]`` with position ids
   ``committed_len + depth`` and a 4D mask (causal over the committed prefix, ancestor-or-self inside the tree);
   :meth:`SpeculativeMethod.verify` picks the accepted path and the bonus token; the accepted drafts and the bonus
   are emitted (cut by :func:`harness.engine.method.cut_at_stop`: never past EOS or ``max_new_tokens``); the cache is
   compacted to the committed prefix + root + accepted path (:func:`harness.engine.kv.compact_cache`); ``accept`` is
   called and the bonus becomes the next root.

After a turn the cache holds exactly ``P + len(token_ids) - 1`` positions: everything emitted except the last,
pending token (``last_cache_length`` records it).

What transformers 5.24 does with the inputs (checked on ``LlamaForCausalLM``, eager and sdpa):

- ``attention_mask`` of shape ``[B, 1, q, kv]`` is passed through unchanged (``masking_utils.
  _preprocess_mask_arguments`` returns a 4D mask as-is) and reaches the attention function. ``eager`` *adds* it to
  the scores, so it must be a float additive mask; ``sdpa`` accepts either a bool mask (True = attend) or a float
  additive one. The engine therefore builds a float mask in the model dtype (0 = attend, dtype min = blocked),
  which is correct for both. flash-attention backends cannot take an arbitrary 4D mask and are refused.
  Explicit ``position_ids`` are used for RoPE; the cache appends the new K/V after the committed ones.
- ``output_hidden_states=True`` returns ``num_layers + 1`` tensors and the last one is the output of the final
  norm (``capture_outputs(tie_last_hidden_states=True)`` overwrites it with ``last_hidden_state``), i.e. the input
  of ``lm_head``: ``lm_head(hidden_states[-1]) == logits``. 5.24 also accepts a selection, so the engine asks for
  ``output_hidden_states=[-1]`` and only the post-norm features are kept (the other entries are None).
- Sliding-window caches (``DynamicSlidingWindowLayer``) are not compacted: those models are refused by
  :func:`harness.engine.kv.compact_cache`.

Timings: ``draft_s`` (propose, begin and accept), ``verify_s`` (the target forward and the acceptance walk),
``overhead_s`` (everything else in the loop: masks, cache compaction, bookkeeping). The device is synchronised
around each part only when profiling (``options.profile`` or the ``profile`` attribute; default: on for CPU,
where synchronising is free, off otherwise). Without it, on an asynchronous device the split is indicative only.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
from transformers import DynamicCache

from harness.engine.kv import compact_cache
from harness.engine.method import Generation, Method, cut_at_stop
from harness.engine.sampling import SamplingParams, next_token
from harness.engine.tree import (
    DraftTree,
    check_tree,
    depths,
    tree_attention_mask,
    tree_position_ids,
)
from harness.engine.verify import verify_greedy, verify_sampling
from harness.measure.trackers import device_sync

FLASH_BACKENDS = ("flash_attention_2", "flash_attention_3", "flash_attention_4", "paged_attention")


def tree_mask_4d(committed_len: int, parents: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """Additive attention mask ``[1, 1, N+1, committed_len + N + 1]`` for one verification forward.

    Every tree slot sees the whole committed prefix and, inside the tree block, its ancestors and itself.
    Example: committed_len 2, parents [-1, -1] -> rows (0 = attend, m = dtype min)
    [[0, 0, 0, m, m], [0, 0, 0, 0, m], [0, 0, 0, m, 0]].
    """
    n1 = parents.shape[0] + 1
    allowed = tree_attention_mask(parents.cpu())  # [N+1, N+1]
    mask = torch.zeros(n1, committed_len + n1, dtype=dtype)  # [N+1, C+N+1]
    mask[:, committed_len:] = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask.to(device)[None, None]


class _Clock:
    """Accumulates wall time into named buckets, synchronising ``device`` at each mark when ``sync``."""

    def __init__(self, device: torch.device, sync: bool):
        self.device, self.sync = device, sync
        self.totals: dict[str, float] = {}
        self.last = self._now()

    def _now(self) -> float:
        if self.sync:
            device_sync(self.device)
        return time.perf_counter()

    def mark(self, bucket: str) -> None:
        """Charge the time since the previous mark to ``bucket``."""
        now = self._now()
        self.totals[bucket] = self.totals.get(bucket, 0.0) + now - self.last
        self.last = now


class SpeculativeMethod(Method):
    """Base class of tree-drafting methods; subclasses implement ``begin``, ``propose`` and ``accept``.

    Class attributes: ``proposal`` = "deterministic" (the tree is a function of the context: top-k, lookup,
    static trees) or "sampled" (children drawn without replacement from ``DraftTree.draft_probs``);
    ``needs_hidden_states`` = True makes the engine pass the target's post-norm last hidden states.
    Methods increment ``self.counters["draft_forwards"]`` (and any other counter they like); the engine resets
    ``counters`` at the start of every turn and adds ``target_forwards`` and ``tree_tokens``.
    A method with a non-lossless acceptance rule (Medusa's typical acceptance) overrides :meth:`verify` and
    ``lossless``.
    """

    proposal: ClassVar[str] = "deterministic"
    needs_hidden_states: ClassVar[bool] = False
    profile: bool | None = None
    last_cache_length: int | None = None

    def __init__(self, target, options=None):
        super().__init__(target, options)
        self.counters: dict[str, int] = {}

    # ---- the three verbs a method implements -------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """A new turn: ``prompt_ids [1, P]`` are committed; ``hidden [P, H]`` their target features (or None)."""

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """A draft tree below ``root`` (the pending token: emitted, not yet run through the target)."""
        raise NotImplementedError

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        """``tokens`` = [root] + accepted drafts, now committed; ``hidden [len(tokens), H]``; the next root."""

    # ---- verification (overridable) ----------------------------------------------------------------------------
    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        """Accepted path and bonus token; lossless greedy / speculative sampling unless a method overrides it."""
        if sampling.greedy:
            return verify_greedy(tree, logits)
        return verify_sampling(tree, logits, sampling, generator)

    # ---- the loop -----------------------------------------------------------------------------------------------
    def _profiling(self) -> bool:
        flag = getattr(self.options, "profile", None)
        if flag is None:
            flag = self.profile
        if flag is None:
            flag = self.target.device.type == "cpu"
        return bool(flag)

    def _check_inputs(self, prompt_ids: torch.Tensor) -> None:
        if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] < 1:
            raise ValueError(f"prompt_ids must be [1, P] with P >= 1 (batch size 1), got {tuple(prompt_ids.shape)}")
        impl = getattr(self.target.model.config, "_attn_implementation", None)
        if impl in FLASH_BACKENDS:
            raise ValueError(f"attn_implementation {impl!r} cannot take the tree attention mask; load the target "
                             "with attn_implementation='sdpa' or 'eager'")
        if self.proposal not in ("deterministic", "sampled"):
            raise ValueError(f"{type(self).__name__}.proposal must be 'deterministic' or 'sampled', "
                             f"got {self.proposal!r}")

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding of one turn (see the module docstring for the exact steps)."""
        self._check_inputs(prompt_ids)
        model, eos = self.target.model, self.target.eos_ids
        vocab = model.config.vocab_size
        self.counters = {"draft_forwards": 0}
        self.last_cache_length = None
        if max_new_tokens <= 0:
            return Generation(token_ids=[], accept_lengths=[], stop_reason="max_new_tokens")
        want_hidden = [-1] if self.needs_hidden_states else False
        cache = DynamicCache(config=model.config)
        clock = _Clock(prompt_ids.device, self._profiling())
        stats = _TurnStats()
        with torch.inference_mode():
            t0 = clock.last
            out = model(prompt_ids, cache=cache, use_cache=True, output_hidden_states=want_hidden, logits_to_keep=1)
            x0 = int(next_token(out.logits[0, -1], sampling, generator))
            clock.mark("prefill_s")
            prefill_s = clock.last - t0
            committed = prompt_ids.shape[1]
            stats.target_forwards = 1
            emitted, stop = cut_at_stop([x0], 0, max_new_tokens, eos)
            stats.accept_lengths.append(len(emitted))
            if stop is None:
                self.begin(prompt_ids, out.hidden_states[-1][0] if want_hidden else None)
                clock.mark("draft_s")
            del out
            root = x0
            while stop is None:
                tree = self.propose(root, sampling, generator)
                clock.mark("draft_s")
                check_tree(tree, vocab)
                if self.proposal == "sampled" and tree.draft_probs is None and len(tree):
                    raise ValueError(f"{type(self).__name__} declares proposal='sampled' but its DraftTree has no "
                                     "draft_probs")
                n = len(tree)
                device = prompt_ids.device
                ids = torch.cat([torch.tensor([root], device=device), tree.tokens.to(device)])[None]  # [1, N+1]
                pos = tree_position_ids(tree.parents.cpu(), committed).to(device)[None]  # [1, N+1]
                mask = tree_mask_4d(committed, tree.parents, self.target.dtype, device)
                clock.mark("overhead_s")
                out = model(ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                            output_hidden_states=want_hidden)
                path, bonus = self.verify(tree, out.logits[0], sampling, generator)
                clock.mark("verify_s")
                tokens = tree.tokens.tolist()
                new = [tokens[i] for i in path] + [bonus]
                kept, stop = cut_at_stop(new, len(emitted), max_new_tokens, eos)
                keep = [0] + [i + 1 for i in path]
                # the last emitted token stays pending (not in the cache); a cut drops the slots after it
                keep = keep[: len(kept)]
                compact_cache(cache, committed, keep)
                committed += len(keep)
                emitted.extend(kept)
                stats.step(n, int(depths(tree.parents.cpu()).max()) if n else 0, len(path), len(kept))
                hidden = out.hidden_states[-1][0, keep] if want_hidden else None
                del out
                clock.mark("overhead_s")
                if stop is None:
                    self.accept([root] + new[:-1], hidden, bonus)
                    clock.mark("draft_s")
                root = bonus
        self.last_cache_length = cache.get_seq_length()
        timings = {k: clock.totals.get(k, 0.0) for k in ("draft_s", "verify_s", "overhead_s")}
        counters = {**self.counters, "target_forwards": stats.target_forwards, "tree_tokens": stats.tree_tokens}
        return Generation(token_ids=emitted, accept_lengths=stats.accept_lengths, stop_reason=stop,
                          prefill_time_s=prefill_s, accepted_drafts=stats.accepted_drafts,
                          draft_depths=stats.draft_depths, timings=timings, counters=counters)


class _TurnStats:
    """Per-turn raw counters of the loop (see :class:`harness.engine.method.Generation`)."""

    def __init__(self):
        self.accept_lengths: list[int] = []
        self.accepted_drafts: list[int] = []
        self.draft_depths: list[int] = []
        self.target_forwards = 0
        self.tree_tokens = 0

    def step(self, tree_size: int, depth: int, accepted: int, emitted: int) -> None:
        self.target_forwards += 1
        self.tree_tokens += tree_size
        self.draft_depths.append(depth)
        self.accepted_drafts.append(accepted)
        self.accept_lengths.append(emitted)
