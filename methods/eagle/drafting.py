"""The methods ``eagle1`` (EAGLE-1's static tree, arXiv:2401.15077 Sec. 3.3) and ``eagle2`` (EAGLE-2's dynamic
tree, arXiv:2406.16858 Sec. 4) on an :class:`methods.eagle.head.EagleHead`.

Both need the target's post-norm features (``needs_hidden_states``); option ``head`` = checkpoint folder, default
the head shipped for the target in ``methods/heads/<target>/eagle``.
    eagle1   static tree (``harness.engine.tree`` ``eagle_mc_sim_7b_63`` by default); T=0 top-k children, T>0
             children sampled without replacement with ``draft_probs`` (``proposal`` is then "sampled")
    eagle2   dynamic tree: ``total_tokens`` (root included, 60; -1 = timed choice), ``depth`` 5, ``top_k`` 10;
             deterministic top-k drafts at every temperature, as published; ``adaptive`` sizes each step's tree
             (at most ``total_tokens``) from measured costs and calibrated confidence; ``lookup`` grafts a
             prompt-lookup chain onto every step's tree
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.engine import autotune
from harness.engine.checkpoints import check_head_option, resolve_head_folder
from harness.engine.draftcache import DraftCache, DraftKV
from harness.engine.draftvocab import check_draft_vocab, draft_lm_head
from harness.engine.hostio import fetch, upload
from harness.engine.lookup import lookup_match
from harness.engine.method import OptionsError, build_options, seeded
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import (
    STATIC_TREES,
    DraftTree,
    chain_tree,
    children_lists,
    depths,
    graft_chain,
    path_length,
    rank_candidates,
    select_dynamic_tree,
    tree_from_choices,
)
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.eagle.checkpoint import load_eagle_head
from methods.eagle.head import EagleHead


@dataclass
class Eagle1Options:
    """``tree``: a name in ``harness.engine.tree.STATIC_TREES`` or explicit rank paths (``[[0], [1], [0, 0], ...]``);
    every node's children must have ranks 0..c-1 (sampled children are the first c draws). ``head``: checkpoint folder
    (default: the head shipped for the target). ``draft_vocab``: 0 = the draft scores the full vocabulary (as
    published); N > 0 = only the N most frequent tokens of the head's training data
    (:mod:`harness.engine.draftvocab`)."""

    head: str | None = None
    tree: str | list = "eagle_mc_sim_7b_63"
    draft_vocab: int = 0

    def __post_init__(self):
        check_head_option(self.head)
        static_tree_choices(self.tree, "tree")
        check_draft_vocab(self.draft_vocab)


@dataclass
class Eagle2Options:
    """EAGLE-2's dynamic tree. ``total_tokens`` counts the root, as EAGLE's ``total_token`` (60 in its evaluation
    scripts); -1 chooses it from timed target forwards (:mod:`harness.engine.autotune`). ``adaptive``: true = every
    step verifies only the best n <= ``total_tokens`` slots that maximise expected tokens per second (measured
    verification and draft costs, calibrated draft confidence; :func:`harness.engine.autotune.best_tree_size`), and
    drafting stops before ``depth`` when one more level cannot pay for its forward
    (:func:`harness.engine.autotune.worth_another_level`; one host read per level, which a GPU pays as a sync);
    not published. ``lookup``: 0 = off; N > 0 = every step's tree also carries the prompt-lookup chain of up to N
    tokens (the continuation of the context's last n-gram, n from 3 down to ``lookup_ngram``, at its most recent
    earlier occurrence; :func:`harness.engine.lookup.lookup_draft`), grafted onto the draft's tree
    (:func:`harness.engine.tree.graft_chain`), so a step accepts the longer of the two; ``lookup_alone``: 0 = always
    draft; n > 0 = a step whose chain comes from an n-gram match of at least n tokens verifies the chain alone and
    skips drafting (the draft catches up on the skipped positions at its next step); not published.
    ``draft_vocab``: as eagle1's."""

    head: str | None = None
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    draft_vocab: int = 0
    adaptive: bool = False
    lookup: int = 0
    lookup_ngram: int = 1
    lookup_alone: int = 0

    def __post_init__(self):
        check_head_option(self.head)
        check_draft_vocab(self.draft_vocab, self.top_k)
        check_dynamic_tree(self.total_tokens, self.depth, self.top_k, self.adaptive)
        check_lookup(self.lookup, self.lookup_ngram, self.lookup_alone)


def check_dynamic_tree(total_tokens: int, depth: int, top_k: int, adaptive: bool = False) -> None:
    """EAGLE-2's dynamic-tree options: ``total_tokens`` >= 2 (root included) or -1, ``depth`` and ``top_k`` >= 1;
    ``adaptive`` a boolean, with an explicit ``total_tokens`` (its cap)."""
    if total_tokens != -1 and total_tokens < 2:
        raise ValueError(f"total_tokens must be >= 2 (root included) or -1 (automatic), got {total_tokens}")
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be true or false, got {adaptive!r}")
    if adaptive and total_tokens == -1:
        raise ValueError("adaptive sizes each step's tree up to total_tokens: give total_tokens >= 2, not -1")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")


LOOKUP_MAX_NGRAM = 3  # the longest n-gram option ``lookup`` matches (prompt lookup's default, method ``pld``)


def check_lookup(lookup: int, lookup_ngram: int, lookup_alone: int = 0) -> None:
    """Option ``lookup``: the length of the grafted prompt-lookup chain, an integer >= 0 (0 = off); ``lookup_ngram``:
    the shortest n-gram matched, 1..:data:`LOOKUP_MAX_NGRAM`; ``lookup_alone``: 0 or lookup_ngram..LOOKUP_MAX_NGRAM
    (the shortest match whose chain is verified without drafting), with lookup on."""
    if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
        raise ValueError(f"lookup must be an integer >= 0 (tokens of the grafted prompt-lookup chain; 0 = off), "
                         f"got {lookup!r}")
    if isinstance(lookup_ngram, bool) or not isinstance(lookup_ngram, int) or not 1 <= lookup_ngram <= LOOKUP_MAX_NGRAM:
        raise ValueError(f"lookup_ngram must be an integer in 1..{LOOKUP_MAX_NGRAM}, got {lookup_ngram!r}")
    if isinstance(lookup_alone, bool) or not isinstance(lookup_alone, int) or not (
            lookup_alone == 0 or lookup_ngram <= lookup_alone <= LOOKUP_MAX_NGRAM):
        raise ValueError(f"lookup_alone must be 0 (always draft) or an n-gram length in {lookup_ngram}.."
                         f"{LOOKUP_MAX_NGRAM} (lookup_ngram..{LOOKUP_MAX_NGRAM}), got {lookup_alone!r}")
    if lookup_alone and not lookup:
        raise ValueError("lookup_alone needs a lookup chain: set lookup > 0 too")


def static_tree_choices(tree: str | list, field: str) -> list[list[int]]:
    """The rank paths of option ``tree`` (a ``STATIC_TREES`` name or explicit paths), validated: children of every
    node have ranks 0..c-1. Example: [[0], [1], [0, 0]] is fine; [[0], [2]] is not (rank 1 is missing)."""
    if isinstance(tree, str):
        if tree not in STATIC_TREES:
            raise ValueError(f"{field}: unknown tree {tree!r}; known: {', '.join(sorted(STATIC_TREES))}")
        tree = STATIC_TREES[tree]
    if not isinstance(tree, list) or not tree or not all(isinstance(c, list) for c in tree):
        raise ValueError(f"{field}: expected a tree name or a non-empty list of rank paths, got {tree!r}")
    parents, ranks = tree_from_choices(tree)
    for slot, kids in enumerate(children_lists(parents)):
        got = sorted(ranks[kids].tolist())
        if got != list(range(len(kids))):
            raise ValueError(f"{field}: the children of {'the root' if slot == 0 else f'node {slot - 1}'} have ranks "
                             f"{got}; they must be 0..{len(kids) - 1}")
    return tree


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
        self.head = head
        # the draft's view of the target's lm_head: all rows, or the draft_vocab most frequent tokens
        self.lm_head = draft_lm_head(target.model.get_output_embeddings(), getattr(self.options, "draft_vocab", 0),
                                     folder, self.name)
        self.cache = DraftCache()  # the stable draft KV, kept in step with the committed sequence

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
        out, kv = self.head(feats[None].to(self.target.dtype), tokens[None], pos[None], self.cache.kv)
        self.cache.advance(kv)
        self.count_draft_forward()
        return out[0, -1]

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Draft log-probabilities ``[..., V]`` (fp32) of predicted features ``[..., H]`` through the target lm_head."""
        return torch.log_softmax(self.lm_head(features).float(), dim=-1)

    def top_tokens(self, features: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's ``k`` best next tokens after each of ``features [..., H]``: (log-probs ``[..., k]`` fp32,
        target token ids ``[..., k]``), best first. The head-specific step of EAGLE-2's expansion
        (:meth:`Eagle2.expand`); EAGLE-3 overrides it (its own lm_head over a reduced vocabulary, ids mapped by d2t)."""
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


@dataclass
class _Level:
    """One draft forward of :meth:`Eagle1.propose_greedy`: the nodes run (``batch [b]``), their mask over the
    temporary KV (``cols [b, columns]``), the row of each one's parent in the previous level's output
    (``parent_rows [b]``), and where their top-k go (``children``, ``child_rows``, ``child_ranks``, ``width``)."""

    batch: torch.Tensor
    cols: torch.Tensor
    parent_rows: torch.Tensor
    children: torch.Tensor
    child_rows: torch.Tensor
    child_ranks: torch.Tensor
    width: int


@dataclass
class GreedyPlan:
    """The root's children (as in :class:`_Level`), then one :class:`_Level` per draft forward, and the parents."""

    children: torch.Tensor
    child_rows: torch.Tensor
    child_ranks: torch.Tensor
    width: int
    levels: list[_Level]
    parents: torch.Tensor


@register_method("eagle1")
class Eagle1(EagleMethodBase):
    """EAGLE-1: a static tree (default ``mc_sim_7b_63``, 25 nodes, depth 5) filled level by level.

    At T=0 node c-th child = the c-th of the draft's top-k; at T>0 the children are drawn WITHOUT replacement from
    the draft distribution (``logits_to_probs`` of the draft logits with the run's sampling params), and the tree
    carries ``draft_probs`` so that verification can use the q-corrected rule (lossless). ``proposal`` is
    therefore "sampled" exactly when the last proposal was made at T>0. One draft forward runs per level that has
    non-leaf nodes (plus the stable-KV update): 5 per cycle for the default tree. A node whose draft distribution
    has fewer non-zero tokens than it has children (top-p / top-k sampling) loses its trailing children.
    """

    Options = Eagle1Options

    def __init__(self, target: Target, options=None, head: EagleHead | None = None, folder: Path | None = None):
        super().__init__(target, options, head, folder)
        self.parents, self.ranks = tree_from_choices(static_tree_choices(self.options.tree, "tree"))
        self.parent_list: list[int] = self.parents.tolist()  # host copies for the host-side loops
        self.children = children_lists(self.parent_list)
        self.node_depths = depths(self.parents).tolist()
        self._plans: dict[torch.device, GreedyPlan] = {}
        widest = max(len(kids) for kids in self.children)
        vocab = self.lm_head.size
        if widest > vocab:
            raise OptionsError(f"method {self.name!r}: option tree has a node with {widest} children, more than the "
                               f"draft vocabulary ({vocab})")
        self._proposal = "deterministic"

    @property
    def proposal(self) -> str:  # type: ignore[override]
        return self._proposal

    def pick_children(self, logits: torch.Tensor, count: int, sampling: SamplingParams,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``count`` child tokens from draft ``logits [V]``: top-k at T=0, else draws without replacement from
        q = logits_to_probs(logits) (fewer when q has fewer non-zero tokens). Returns (tokens [<=count], q or None)."""
        if sampling.greedy:
            return torch.topk(logits, count).indices, None
        q = logits_to_probs(logits, sampling)  # [V]
        count = min(count, int(torch.count_nonzero(q)))
        on = generator.device if generator is not None else q.device  # draw where the generator lives
        drawn = torch.multinomial(q.to(on), count, replacement=False, generator=generator)
        return drawn.to(q.device), q

    def level_batch(self, level: int, alive: list[bool]) -> list[int]:
        """Nodes at ``level`` that were filled and have children: the rows of that level's draft forward."""
        return [i for i, d in enumerate(self.node_depths) if d == level and alive[i] and self.children[i + 1]]

    def level_mask(self, batch: list[int], col_of: dict[int, int], device: torch.device) -> torch.Tensor:
        """Draft-side mask over the temporary KV continuation, bool ``[b, len(col_of) + b]``: row r sees the columns
        of ``batch[r]``'s ancestors (``col_of``: node -> column) and its own new column.

        Example: parents [-1, 0, 0], col_of {0: 0}, batch [1, 2] -> [[T, T, F], [T, F, T]].
        """
        cols = torch.zeros(len(batch), len(col_of) + len(batch), dtype=torch.bool)  # built on the host
        for r, i in enumerate(batch):
            a = self.parent_list[i]
            while a >= 0:
                cols[r, col_of[a]] = True
                a = self.parent_list[a]
            cols[r, len(col_of) + r] = True
        return cols.to(device, non_blocking=True)

    def greedy_plan(self, device: torch.device) -> GreedyPlan:
        """The level-by-level schedule of the full tree (every node filled, as at temperature 0), on ``device``
        once: the forwards then need no host read and no per-node write."""
        if device in self._plans:
            return self._plans[device]
        levels = []
        col_of: dict[int, int] = {}
        previous: list[int] = []
        for level in range(1, max(self.node_depths, default=0)):
            batch = self.level_batch(level, [True] * len(self.node_depths))
            if not batch:
                break
            cols = self.level_mask(batch, col_of, device)
            parent_rows = [previous.index(self.parent_list[i]) if level > 1 else 0 for i in batch]
            for i in batch:
                col_of[i] = len(col_of)
            levels.append(_Level(upload(batch, device), cols, upload(parent_rows, device),
                                 *self._child_slots(batch, device)))
            previous = batch
        plan = GreedyPlan(*self._child_slots([-1], device), levels, self.parents.to(device))
        self._plans[device] = plan
        return plan

    def _child_slots(self, rows: list[int],
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Children of the nodes ``rows`` (-1 = the root): (child node ids, the row of their parent, their rank,
        the widest row), so that ``tokens[children] = topk(logits, width)[parent_row, rank]`` fills them."""
        children, parent_rows, ranks = [], [], []
        for r, node in enumerate(rows):
            for rank, child in enumerate(self.children[node + 1]):
                children.append(child)
                parent_rows.append(r)
                ranks.append(rank)
        width = max((len(self.children[node + 1]) for node in rows), default=0)
        return upload(children, device), upload(parent_rows, device), upload(ranks, device), width

    def propose_greedy(self, root: int) -> DraftTree:
        """Temperature 0: every node is filled with its parent's top-k (the same tree :meth:`propose` builds), one
        batched draft forward and one scatter per level, no host read (:meth:`greedy_root` and
        :meth:`greedy_level` are the head-specific parts)."""
        device = self.target.output_device
        plan = self.greedy_plan(device)
        tokens = torch.zeros(len(self.node_depths), dtype=torch.long, device=device)  # [N]
        out, top = self.greedy_root(root, plan.width)  # [1, H], [1, width]
        stable_len = self.cache.length
        tokens[plan.children] = top[plan.child_rows, plan.child_ranks]
        kv = self.cache.kv
        for level, step in enumerate(plan.levels, start=1):
            feats = out[step.parent_rows]  # [b, H] each node's parent's predicted feature
            pos = torch.full((step.batch.shape[0],), stable_len + level - 1, dtype=torch.long, device=device)
            out, kv, top = self.greedy_level(feats, tokens[step.batch], pos, kv, step.cols, step.width)
            tokens[step.children] = top[step.child_rows, step.child_ranks]
        return DraftTree(tokens=tokens, parents=plan.parents)

    def greedy_root(self, root: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stable-KV update: the root's predicted feature ``[1, H]`` and its ``width`` best tokens
        ``[1, width]``."""
        h0 = self.extend_stable(root)[None]  # [1, H]
        return h0, torch.topk(self.lm_head(h0).float(), width, dim=-1).indices

    def greedy_level(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, kv: DraftKV,
                     cols: torch.Tensor, width: int) -> tuple[torch.Tensor, DraftKV, torch.Tensor]:
        """One level's draft forward: (predicted features [b, H], kv, each row's ``width`` best tokens [b, width])."""
        out, kv = self.tree_forward(feats, toks, pos, kv, cols)
        return out, kv, torch.topk(self.lm_head(out).float(), width, dim=-1).indices

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        if sampling.greedy:
            return self.propose_greedy(root)
        n = len(self.node_depths)
        device = self.target.output_device
        tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        alive = [False] * n
        rows: list[torch.Tensor | None] = [None] * (n + 1)  # q per slot (sampled only)
        h0 = self.extend_stable(root)  # [H]
        stable_len = self.cache.length

        def fill(slot: int, logits: torch.Tensor) -> None:
            kids = self.children[slot]
            if not kids:
                return
            chosen, q = self.pick_children(logits, len(kids), sampling, generator)
            rows[slot] = q
            for rank_pos, node in enumerate(kids):  # kids are in rank order with ranks 0..c-1
                if rank_pos < chosen.shape[0]:
                    tokens[node] = chosen[rank_pos]
                    alive[node] = True

        fill(0, self.lm_head(h0).float())

        def draft_level(feats, toks, pos, kv, cols):
            out, kv = self.tree_forward(feats, toks, pos, kv, cols)
            return out, self.lm_head(out).float(), kv  # [b, H], [b, V]

        self.expand_levels(h0, tokens, alive, fill, stable_len, draft_level)
        return self._compact(tokens, alive, rows)

    def expand_levels(self, root_feature: torch.Tensor, tokens: torch.Tensor, alive: list[bool], fill,
                      stable_len: int, draft_level) -> None:
        """Grow the static tree level by level: one draft forward per level over its filled nodes that have
        children, each fed its parent's predicted feature, on a temporary KV continuation of the stable cache.

        ``draft_level(feats [b, H], tokens [b], positions [b], kv, mask) -> (features [b, H], logits [b, ...], kv)``
        is the head-specific forward; ``fill(slot, logits)`` chooses the children of the node in ``slot``.
        """
        device = tokens.device
        out_of: dict[int, torch.Tensor] = {-1: root_feature}  # node -> its predicted feature (root = -1)
        col_of: dict[int, int] = {}                            # node -> its column in the temporary KV continuation
        kv = self.cache.kv
        for level in range(1, max(self.node_depths, default=0)):
            batch = self.level_batch(level, alive)
            if not batch:
                break
            cols = self.level_mask(batch, col_of, device)
            feats = torch.stack([out_of[self.parent_list[i]] for i in batch])  # [b, H]
            pos = torch.full((len(batch),), stable_len + level - 1, dtype=torch.long, device=device)
            out, logits, kv = draft_level(feats, tokens[batch], pos, kv, cols)
            for r, i in enumerate(batch):
                col_of[i] = len(col_of)
                out_of[i] = out[r]
                fill(i + 1, logits[r])

    def _compact(self, tokens: torch.Tensor, alive: list[bool], rows: list[torch.Tensor | None]) -> DraftTree:
        """The tree restricted to the nodes that got a token, with ``draft_probs`` rows (zero for leaves) if sampled."""
        ordered = [i for i, a in enumerate(alive) if a]  # a dead node is never expanded: its subtree is dead too
        new_index = {old: j for j, old in enumerate(ordered)}
        parents = torch.tensor([new_index.get(self.parent_list[i], -1) for i in ordered], dtype=torch.long)
        tree_tokens = tokens[ordered] if ordered else tokens[:0]
        probs = None
        if self._proposal == "sampled":
            V = self.lm_head.weight.shape[0]
            zero = torch.zeros(V, device=tokens.device)
            probs = torch.stack([rows[0] if rows[0] is not None else zero] +
                                [rows[i + 1] if rows[i + 1] is not None else zero for i in ordered])  # [N'+1, V]
        return DraftTree(tokens=tree_tokens, parents=parents.to(tokens.device), draft_probs=probs)


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
        self.adaptive = self.options.adaptive
        self._verify_s: dict[int, float] | None = None  # adaptive: measured verification seconds per size
        self._draft_s: float | None = None              # adaptive: running mean of drafting seconds per step
        self._calibration = autotune.AcceptanceCalibration()
        self._predicted = 0.0                            # adaptive: expected accepted drafts of the last tree
        self._level_s: float | None = None               # adaptive: running mean of seconds per draft forward
        self._rate: float | None = None                  # adaptive: expected tokens per second of the last step
        self.lookup = self.options.lookup
        self._context: list[int] = []                    # lookup: the committed token ids (host)
        self._own: tuple[list[int], list[int]] = ([], [])  # lookup + adaptive: the draft's own tree (host)
        self._drafted = True                              # lookup_alone: whether the last step drafted

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        super().begin(prompt_ids, hidden)
        if self.lookup:
            self._context = fetch(prompt_ids[0])
        if self.total_tokens == -1:
            self.total_tokens = autotune.choose_tree_size(autotune.time_tree_sizes(self.target, runtime=self.runtime))
        if self.adaptive and self._verify_s is None:  # once per method (the first turn is a warm-up in a run)
            self._verify_s = autotune.time_tree_sizes(self.target, autotune.adaptive_sizes(self.total_tokens),
                                                     runtime=self.runtime)
        self.counters["total_tokens"] = self.total_tokens

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        super().accept(tokens, hidden, next_root)
        if self.lookup:
            self._context.extend(tokens)
        if self.adaptive and self._drafted:  # tokens = [root] + accepted drafts; calibrate on the draft's own tree
            accepted = path_length(*self._own, tokens[1:]) if self.lookup else len(tokens) - 1
            self._calibration.update(self._predicted, accepted)

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
            if self.adaptive and not autotune.worth_another_level(float(fetch(scores.exp().sum())), self._level_s,
                                                                  self._rate, self._calibration.factor):
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
        if not self.lookup:
            return self.propose_draft(root)
        n, chain = lookup_match(self._context + [root], LOOKUP_MAX_NGRAM, self.options.lookup_ngram, self.lookup)
        alone = self.options.lookup_alone
        self._drafted = not (chain and alone and n >= alone)
        if not self._drafted:  # a long enough match: verify the chain alone, no draft forward this step
            self.counters["lookup_alone_steps"] = self.counters.get("lookup_alone_steps", 0) + 1
            self.counters["lookup_slots"] = self.counters.get("lookup_slots", 0) + len(chain)
            return chain_tree(upload(chain, self.target.output_device))
        return self.graft_lookup(self.propose_draft(root), chain)

    def graft_lookup(self, tree: DraftTree, chain: list[int]) -> DraftTree:
        """``tree`` with the prompt-lookup ``chain`` grafted on (one host read of the tree)."""
        own = tuple(fetch(torch.stack([tree.tokens, tree.parents])))  # one round trip: ([N] tokens, [N] parents)
        self._own = own
        if not chain:
            return tree
        tokens, parents = graft_chain(*own, chain)
        if len(tokens) > len(own[0]):
            self.counters["lookup_slots"] = self.counters.get("lookup_slots", 0) + len(tokens) - len(own[0])
        device = tree.tokens.device
        return DraftTree(tokens=upload(tokens, device), parents=upload(parents, device))

    def propose_draft(self, root: int) -> DraftTree:
        """The draft's own tree: EAGLE-2's ``total_tokens - 1`` best candidates, or the adaptive prefix of them."""
        if not self.adaptive:
            c = self.expand(root)
            return select_dynamic_tree(c.tokens, c.scores, c.parents, self.total_tokens - 1)
        t0, forwards = time.perf_counter(), self.counters.get("draft_forwards", 0)
        c = self.expand(root)
        order, eff = rank_candidates(c.scores, c.parents)
        best = order[: self.total_tokens - 1]
        probs = fetch(eff[best].exp())  # the host copy waits for the draft, so the clock below sees all of it
        elapsed = time.perf_counter() - t0
        per_forward = elapsed / max(1, self.counters.get("draft_forwards", 0) - forwards)
        self._draft_s = elapsed if self._draft_s is None else 0.9 * self._draft_s + 0.1 * elapsed
        self._level_s = per_forward if self._level_s is None else 0.9 * self._level_s + 0.1 * per_forward
        factor = self._calibration.factor
        size = autotune.best_tree_size(probs, self._verify_s, self._draft_s, factor)
        self._rate = autotune.expected_rate(probs, size, self._verify_s[size], self._draft_s, factor)
        self._predicted = float(sum(probs[: size - 1]))  # uncalibrated: what the calibration is updated with
        self.counters["adaptive_slots"] = self.counters.get("adaptive_slots", 0) + size
        return select_dynamic_tree(c.tokens, c.scores, c.parents, size - 1, order=order)
