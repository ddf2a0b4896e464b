"""The method ``eagle2``: EAGLE-2's dynamic draft tree (arXiv:2406.16858 Sec. 4) on an
:class:`methods.eagle.head.EagleHead`, and :class:`DynamicTreeOptions`, the options every dynamic-tree method
shares (``eagle2``, ``eagle3``, ``jakiro`` extend them).

``total_tokens`` (root included, 60; -1 = timed choice), ``depth`` 5, ``top_k`` 10; deterministic top-k drafts at
every temperature, as published. Unpublished per-step policies (:mod:`methods.eagle.treepolicies`): ``adaptive``
sizes each step's tree (at most ``total_tokens``) from measured costs and calibrated confidence; ``lookup`` grafts a
prompt-lookup chain onto every step's tree; ``backoff`` skips the draft for the chain alone or a plain step when the
head does not pay. Unpublished for long contexts: ``draft_window`` limits the draft's
attention to the last W positions (:class:`harness.engine.draftcache.DraftCache`); ``max_spec_context`` and
``stop_unprofitable`` stop speculating for the rest of a turn (:class:`harness.engine.speculationstop.SpeculationStop`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.engine import autotune
from harness.engine.checkpoints import check_head_option
from harness.engine.draftcache import check_draft_window
from harness.engine.draftvocab import check_draft_vocab
from harness.engine.hostio import fetch
from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from harness.engine.speculationstop import SpeculationStop
from harness.engine.speculative import check_stop_option
from harness.engine.tree import DraftTree, rank_candidates, select_dynamic_tree
from harness.measure.records import PRECISIONS
from harness.models import Target
from harness.registry import register_method
from methods.eagle.draft import EagleMethodBase
from methods.eagle.head import EagleHead
from methods.eagle.treepolicies import LOOKUP_MAX_NGRAM, AdaptiveSizer, Backoff, LookupGraft


@dataclass
class DynamicTreeOptions:
    """The options of an EAGLE-2 dynamic tree, shared by every method that grows one.

    ``head``: checkpoint folder (default: the head shipped for the target). ``total_tokens`` counts the root, as
    EAGLE's ``total_token`` (60 in its evaluation scripts); -1 chooses it from timed target forwards
    (:mod:`harness.engine.autotune`). ``depth``: draft forwards after the first (expansion levels); ``top_k``:
    children per expanded node and frontier width (at most the draft's vocabulary).
    ``adaptive``: true = every step verifies only the best n <= ``total_tokens`` slots that maximise expected tokens
    per second, and drafting stops before ``depth`` when one more level cannot pay for its forward (one host read
    per level, which a GPU pays as a sync; :class:`methods.eagle.treepolicies.AdaptiveSizer`); not published.
    ``lookup``: 0 = off; N > 0 = every step's tree also carries the prompt-lookup chain of up to N tokens (the
    continuation of the context's last n-gram, n from 3 down to ``lookup_ngram``, at its most recent earlier
    occurrence), grafted onto the draft's tree, so a step accepts the longer of the two; ``lookup_alone``: 0 = always
    draft; n > 0 = a step whose chain comes from an n-gram match of at least n tokens verifies the chain alone and
    skips drafting (the draft catches up on the skipped positions at its next step)
    (:class:`methods.eagle.treepolicies.LookupGraft`); not published.
    ``draft_window``: 0 = the draft attends to the whole context (as published); W > 0 = a committed position sees
    itself and the W - 1 before it, a tree node the last W committed positions and its ancestors, and the draft's
    KV keeps only the last W positions (:class:`harness.engine.draftcache.DraftCache`); not published.
    ``max_spec_context``: 0 = off; N > 0 = once the context (prompt and emitted tokens) exceeds N, the rest of the turn
    runs plain one-token target forwards. ``stop_unprofitable``: 0 = off; n > 0 = the same once the last n steps,
    at the costs the adaptive sizing measured (needs ``adaptive``), emitted tokens slower than plain forwards would
    have (:class:`harness.engine.speculationstop.SpeculationStop`); not published.
    ``backoff``: 0 = off (every step drafts); k > 0 = before every step, the adaptive sizing (needs ``adaptive``)
    chooses between the head's tree, the lookup chain alone (with ``lookup``) and a plain one-token step, whichever
    its measured costs and decayed means of what each emitted expect to be fastest, and drafts the head at least at
    every turn's first step and after k steps in a row without it (:class:`methods.eagle.treepolicies.Backoff`);
    not published.
    ``head_precision``: None = the head's weights as loaded (in the target's dtype); float32, bfloat16, float16 or
    int8 = its own weights in that precision (int8: torchao's int8 weight-only), its arithmetic in the target's
    dtype (:func:`harness.models.set_head_precision`); the precision matrix's head axis
    (``harness/run/presets/precision.yaml``).
    """

    head: str | None = None
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    adaptive: bool = False
    lookup: int = 0
    lookup_ngram: int = 1
    lookup_alone: int = 0
    draft_window: int = 0
    max_spec_context: int = 0
    stop_unprofitable: int = 0
    backoff: int = 0
    head_precision: str | None = None

    # The order of the options in manifests, turn records and tables (``opt.*`` columns, ablation knobs): a subclass
    # whose own fields stood among these before they were shared lists its fields in that order; fields it does not
    # list follow in the dataclass order (these first, then the subclass's own).
    RECORDED_ORDER: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        check_head_option(self.head)
        if self.total_tokens != -1 and self.total_tokens < 2:
            raise ValueError(f"total_tokens must be >= 2 (root included) or -1 (automatic), got {self.total_tokens}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if self.adaptive and self.total_tokens == -1:
            raise ValueError("adaptive sizes each step's tree up to total_tokens: give total_tokens >= 2, not -1")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        lookup, ngram, alone = self.lookup, self.lookup_ngram, self.lookup_alone
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise ValueError(f"lookup must be an integer >= 0 (tokens of the grafted prompt-lookup chain; 0 = off), "
                             f"got {lookup!r}")
        if isinstance(ngram, bool) or not isinstance(ngram, int) or not 1 <= ngram <= LOOKUP_MAX_NGRAM:
            raise ValueError(f"lookup_ngram must be an integer in 1..{LOOKUP_MAX_NGRAM}, got {ngram!r}")
        if isinstance(alone, bool) or not isinstance(alone, int) or not (
                alone == 0 or ngram <= alone <= LOOKUP_MAX_NGRAM):
            raise ValueError(f"lookup_alone must be 0 (always draft) or an n-gram length in {ngram}.."
                             f"{LOOKUP_MAX_NGRAM} (lookup_ngram..{LOOKUP_MAX_NGRAM}), got {alone!r}")
        if alone and not lookup:
            raise ValueError("lookup_alone needs a lookup chain: set lookup > 0 too")
        check_draft_window(self.draft_window)
        if self.head_precision is not None and self.head_precision not in PRECISIONS:
            raise ValueError(f"head_precision must be one of {', '.join(PRECISIONS)} (or null: as loaded), got "
                             f"{self.head_precision!r}")
        for name in ("max_spec_context", "stop_unprofitable", "backoff"):
            check_stop_option(name, getattr(self, name))
        if self.stop_unprofitable and not self.adaptive:
            raise ValueError("stop_unprofitable reads the adaptive sizing's measured costs: set adaptive true too")
        if self.backoff and not self.adaptive:
            raise ValueError("backoff reads the adaptive sizing's measured costs: set adaptive true too")
        if self.backoff and self.stop_unprofitable:
            raise ValueError("backoff already runs plain steps when drafting does not pay, and stop_unprofitable would "
                             "charge them a draft: set one of them")

    def recorded(self) -> dict[str, Any]:
        """The options as a dict in :attr:`RECORDED_ORDER` (what the records show,
        :func:`harness.engine.method.recorded_options`)."""
        values = dataclasses.asdict(self)
        if values.get("head_precision") is None:  # added later: a head as loaded is recorded as runs always had it
            values.pop("head_precision", None)
        return {name: values[name] for name in (*self.RECORDED_ORDER, *values) if name in values}


@dataclass
class Eagle2Options(DynamicTreeOptions):
    """:class:`DynamicTreeOptions` with EAGLE-2's defaults, and ``draft_vocab``: 0 = the draft scores the full
    vocabulary (as published); N > 0 = only the N most frequent tokens of the head's training data
    (:mod:`harness.engine.draftvocab`; at least ``top_k``)."""

    draft_vocab: int = 0

    RECORDED_ORDER = ("head", "total_tokens", "depth", "top_k", "draft_vocab", "adaptive", "lookup", "lookup_ngram",
                      "lookup_alone", "draft_window", "max_spec_context", "stop_unprofitable", "backoff",
                      "head_precision")

    def __post_init__(self):
        super().__post_init__()
        check_draft_vocab(self.draft_vocab, self.top_k)


@dataclass
class DynamicCandidates:
    """Every candidate EAGLE-2 records in one cycle: ``tokens [M]``, cumulative log-probs ``scores [M]``,
    ``parents [M]`` (index of an earlier candidate, -1 = root). M = top_k + depth * top_k**2."""

    tokens: torch.Tensor
    scores: torch.Tensor
    parents: torch.Tensor


@register_method("eagle2")
class Eagle2(EagleMethodBase):
    """EAGLE-2: a dynamic tree grown by beam-like expansion, then re-ranked (arXiv:2406.16858 Sec. 4).

    One stable-KV forward gives the root's top-k (level 1); then ``depth`` forwards each expand the k frontier
    nodes into k*k children, keep the k best by cumulative log-prob as the next frontier, and record all k*k. The
    ``total_tokens - 1`` best candidates (root excluded) form the tree
    (:func:`harness.engine.tree.select_dynamic_tree`).
    Draft forwards per cycle: depth + 1. The draft is deterministic top-k even at T>0, as published, so
    verification uses the deterministic-proposal rule (lossless).
    """

    Options = Eagle2Options

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options, head, folder)
        vocab = self.lm_head.size
        if self.options.top_k > vocab:
            raise OptionsError(f"method {self.name!r}: option top_k={self.options.top_k} exceeds the draft vocabulary "
                               f"({vocab})")
        self.total_tokens = self.options.total_tokens  # resolved at the first turn when -1
        o = self.options  # the per-step policies (methods.eagle.treepolicies); None when their option is off
        self.graft = LookupGraft(o.lookup, o.lookup_ngram, o.lookup_alone) if o.lookup else None
        self.backoff = Backoff(self.sizer, o.backoff) if o.backoff else None

    @functools.cached_property
    def sizer(self) -> AdaptiveSizer | None:
        """The adaptive tree sizer (option ``adaptive``; None when off), built at first use: the base ``__init__``
        already needs it for :meth:`build_speculation_stop`."""
        return AdaptiveSizer(self.options.total_tokens) if self.options.adaptive else None

    def build_speculation_stop(self) -> SpeculationStop | None:
        """:meth:`SpeculativeMethod.build_speculation_stop` with ``stop_unprofitable``, which reads the adaptive
        sizer's measured costs."""
        o = self.options
        if not (o.max_spec_context or o.stop_unprofitable):
            return None
        return SpeculationStop(o.max_spec_context, o.stop_unprofitable, self.sizer)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        super().begin(prompt_ids, hidden)
        if self.graft is not None:
            self.graft.begin(prompt_ids[0])
        if self.total_tokens == -1:
            self.total_tokens = autotune.choose_tree_size(autotune.time_tree_sizes(self.target, runtime=self.runtime))
        if self.sizer is not None:
            self.sizer.begin(self.target, self.runtime)
        if self.backoff is not None:
            self.backoff.begin()
        self.counters["total_tokens"] = self.total_tokens

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        super().accept(tokens, hidden, next_root)
        graft, backoff = self.graft, self.backoff
        if graft is not None:
            graft.accept(tokens)
        drafted = graft.drafted if graft is not None else backoff is None or backoff.arm == Backoff.HEAD
        if self.sizer is not None and drafted:
            # tokens = [root] + accepted drafts; calibrate on the draft's own tree
            self.sizer.accept(graft.own_accepted(tokens[1:]) if graft is not None else len(tokens) - 1)
        if backoff is not None:
            backoff.record(len(tokens) - 1, graft.chain_accepted(tokens[1:]) if graft is not None else None)

    def expand(self, root: int) -> DynamicCandidates:
        """The k + depth*k*k candidates of one cycle (see the class docstring); runs depth + 1 draft forwards."""
        k, depth = self.options.top_k, self.options.depth
        h0 = self.extend_stable(root)  # [H]
        stable_len = self.cache.length
        device = h0.device
        scores, frontier_tok = self.top_tokens(h0, k)  # [k], [k] level 1; scores = cumulative log-probs
        rec_tokens, rec_scores = [frontier_tok], [scores]
        rec_parents = [torch.full((k,), -1, dtype=torch.long, device=device)]
        frontier_idx = torch.arange(k, device=device)  # [k] candidate index of each frontier node
        frontier_in = h0.expand(k, -1)                 # [k, H] input feature = the parent's output
        tree_cols = torch.eye(k, dtype=torch.bool, device=device)  # [k, k*(i+1)] ancestors-or-self per frontier node
        recorded = k
        kv = self.cache.kv
        for i in range(depth):
            if self.sizer is not None and not self.sizer.another_level(float(fetch(scores.exp().sum()))):
                break  # adaptive depth: even the best case of one more level is not worth its forward
            pos = torch.full((k,), stable_len + i, dtype=torch.long, device=device)
            out, kv = self.tree_forward(frontier_in, frontier_tok, pos, kv, tree_cols)  # [k, H]
            child_lp, child_tok = self.top_tokens(out, k)  # [k, k]
            cum = (child_lp + scores[:, None]).flatten()  # [k*k] row r = children of frontier node r
            rec_tokens.append(child_tok.flatten())
            rec_scores.append(cum)
            rec_parents.append(frontier_idx.repeat_interleave(k))
            sel = torch.topk(cum, k).indices  # [k] the next frontier, best first
            parent_row = sel // k
            frontier_idx = recorded + sel
            recorded += k * k
            frontier_tok, scores = child_tok.flatten()[sel], cum[sel]
            frontier_in = out[parent_row]
            tree_cols = torch.cat([tree_cols[parent_row], torch.eye(k, dtype=torch.bool, device=device)], dim=1)
        return DynamicCandidates(torch.cat(rec_tokens), torch.cat(rec_scores), torch.cat(rec_parents))

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        draft = functools.partial(self.propose_draft, root)
        if self.graft is not None:
            return self.graft.propose(root, draft, self.counters, self.target.output_device, self.backoff)
        if self.backoff is not None:
            return self.backoff.propose([], draft, self.counters, self.target.output_device)
        return draft()

    def propose_draft(self, root: int) -> DraftTree:
        """The draft's own tree: EAGLE-2's ``total_tokens - 1`` best candidates, or the adaptive prefix of them."""
        if self.sizer is None:
            c = self.expand(root)
            return select_dynamic_tree(c.tokens, c.scores, c.parents, self.total_tokens - 1)
        t0, forwards = time.perf_counter(), self.counters.get("draft_forwards", 0)
        c = self.expand(root)
        order, eff = rank_candidates(c.scores, c.parents)
        best = order[: self.total_tokens - 1]
        probs = fetch(eff[best].exp())  # the host copy waits for the draft, so the clock below sees all of it
        elapsed = time.perf_counter() - t0
        size = self.sizer.size(probs, elapsed, self.counters.get("draft_forwards", 0) - forwards, self.counters)
        return select_dynamic_tree(c.tokens, c.scores, c.parents, size - 1, order=order)
