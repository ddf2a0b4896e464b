"""The method ``jakiro_star``: Jakiro*, the EAGLE-1-based variant with GeLU experts and per-expert candidates from
a joint softmax (released code github.com/haiduo/Jakiro ``jakiro_star/model/cnets.py``, ``sample_moe``), in a lossless
``corrected``
variant and the released ``as_published`` one (not lossless at T > 0: the tests' chi-square audit rejects it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from harness.engine.checkpoints import check_head_option, resolve_head_folder
from harness.engine.draftcache import check_draft_window
from harness.engine.method import build_options, seeded
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.tree import EAGLE_MC_SIM_7B_63, DraftTree
from harness.engine.verify import walk_tree
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.eagle.eagle1 import Eagle1, static_tree_choices
from methods.jakiro.checkpoint import load_jakiro_head
from methods.jakiro.draft import MoEDraft, check_experts
from methods.jakiro.head import JakiroHead, JakiroOutputs

# Jakiro*'s tree: EAGLE-1's mc_sim_7b_63 plus one depth-6 node (J `jakiro_star/model/choices.py`): 26 nodes.
JAKIRO_STAR_TREE = EAGLE_MC_SIM_7B_63 + [[0, 0, 0, 0, 0, 0]]


@dataclass
class JakiroStarOptions:
    """``variant``: ``corrected`` (lossless) or ``as_published`` (the released proposal bookkeeping; NOT lossless at
    T > 0). ``tree``: static tree (default Jakiro*'s mc_sim_7b_63 + [0,0,0,0,0,0]). ``num_experts`` /
    ``experts_per_tok``: None = the checkpoint's. ``draft_window``: 0 = the draft attends to the whole context (as
    released); W > 0 = the last W positions (:class:`harness.engine.draftcache.DraftCache`); not published."""

    head: str | None = None
    variant: str = "corrected"
    tree: str | list = "jakiro_star"
    num_experts: int | None = None
    experts_per_tok: int | None = None
    draft_window: int = 0

    def __post_init__(self):
        check_head_option(self.head)
        check_draft_window(self.draft_window)
        if self.variant not in ("corrected", "as_published"):
            raise ValueError(f"variant must be 'corrected' or 'as_published', got {self.variant!r}")
        if self.tree != "jakiro_star":
            static_tree_choices(self.tree, "tree")
        for name in ("num_experts", "experts_per_tok"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or null (read from the checkpoint), got {value!r}")


def fold_joint(probs_2v: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token marginal of a distribution over (expert, token) pairs: ``[..., R*V] -> [..., V]`` (sum over experts).
    Example: V = 2, [.1, .2, .3, .4] -> [.4, .6]."""
    return probs_2v.reshape(*probs_2v.shape[:-1], -1, vocab).sum(-2)


def joint_topk_distinct(joint_logits: torch.Tensor, vocab: int, count: int) -> torch.Tensor:
    """T = 0: the ``count`` best distinct tokens of the joint (expert, token) logits ``[R*V]``, ``[count]``.
    Example: V = 3, logits [5, 1, 0, 4, 6, 0] -> pairs by value: (e1, 1), (e0, 0), (e1, 0), ... -> [1, 0, 2]."""
    return joint_topk_distinct_rows(joint_logits.reshape(1, -1, vocab), count)[0]


def joint_topk_distinct_rows(expert_logits: torch.Tensor, count: int) -> torch.Tensor:
    """:func:`joint_topk_distinct` of every row of ``expert_logits [n, R, V]`` -> ``[n, count]``, on the device.

    Each token occurs at most R times in a row, so the best ``count * R`` pairs hold at least ``count`` distinct
    tokens (``count <= V``); a pair whose token an earlier (better) pair already has is pushed back by a stable sort.
    """
    n, R, V = expert_logits.shape
    best = torch.topk(expert_logits.reshape(n, R * V), min(count * R, R * V), dim=-1).indices % V  # [n, m]
    same = best[:, :, None] == best[:, None, :]  # [n, m, m]
    dup = (same & torch.ones_like(same[0]).tril(-1)).any(-1)  # [n, m] an earlier pair has this token
    order = torch.sort(dup.to(torch.int8), dim=-1, stable=True).indices[:, :count]  # [n, count]
    return best.gather(1, order)


def published_star_bookkeeping(joint_probs: torch.Tensor, drawn: torch.Tensor, expert_logits: torch.Tensor,
                               vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The released Jakiro* ``sample_moe`` for draws ``drawn [c]`` (indices into the 2V joint):

    tokens = drawn mod V (duplicates across experts kept); the "proposal probability" of draw j is gathered at
    ``token_j + V`` (expert 1's share, whichever expert it came from), made sequential-conditional as EAGLE-1 does,
    ``q~_j = qx_j / (1 - sum_{i<j} qx_i)`` clamped to [0, 1]; the residual distribution is
    ``softmax(mean_e softmax(expert_logits))``, a softmax of probabilities (nearly uniform).
    Returns (tokens [c], q~ [c], residual [V]).
    """
    tokens = drawn % vocab
    qx = joint_probs[tokens + vocab]  # [c]
    before = torch.cumsum(qx, 0) - qx
    q_tilde = (qx / (1 - before)).clamp(0, 1)
    residual = torch.softmax(torch.softmax(expert_logits.float(), -1).mean(0), -1)  # [V]
    return tokens, q_tilde, residual


def published_star_step(p: torch.Tensor, candidates: list[int], q_tilde: list[float], residual_q: torch.Tensor,
                        generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """EAGLE-1's q-corrected sibling test fed with Jakiro*'s numbers (NOT lossless with them).

    For each distinct candidate x (in rank order) with q~ > 0: accept with probability min(1, p(x)/q~); on rejection
    p <- normalise(max(0, p - q')), q' = ``residual_q`` with the earlier candidates zeroed and renormalised.
    Returns (position of the accepted candidate or None, the residual p).
    """
    p, q = p.clone(), residual_q.clone()
    seen: set[int] = set()
    for j, x in enumerate(candidates):
        if x in seen:
            continue
        seen.add(x)
        if q_tilde[j] > 0:
            u = float(torch.rand((), generator=generator, device=generator.device if generator else p.device))
            if u < min(1.0, float(p[x]) / q_tilde[j]):
                return j, p
            diff = (p - q).clamp(min=0)
            if float(diff.sum()) > 0:
                p = diff / diff.sum()
        q[x] = 0.0
        if float(q.sum()) > 0:
            q = q / q.sum()
    return None, p


@register_method("jakiro_star")
class JakiroStar(MoEDraft, Eagle1):
    """Jakiro* (released ``jakiro_star/``): EAGLE-1 static tree, GeLU experts, candidates from a joint softmax.

    For each node the K selected experts' features h + e (best router logit first, UNWEIGHTED, as the released
    inference block) give logits ``[K, V]``; their concatenation is one joint distribution over (expert, token).
    Children's input feature is the top expert's feature (as released).

    - T = 0 (both variants; the released code crashes): the best distinct tokens of the joint logits
      (:func:`joint_topk_distinct`); greedy verification; lossless.
    - T > 0, ``corrected``: q = the token marginal of ``logits_to_probs(joint)`` (:func:`fold_joint`); the children
      are drawn from q without replacement (equivalently: draw an (expert, token) pair, then remove BOTH experts'
      copies of the token, so no duplicates), and ``draft_probs`` carries q: the engine's sampled-proposal rule is
      then exact, lossless.
    - T > 0, ``as_published``: draws in the 2V space without replacement (duplicates kept), with the released
      bookkeeping (:func:`published_star_bookkeeping`) and EAGLE-1's test on it (:func:`published_star_step`).
      ``lossless`` is False and the tables say so; the chi-square audit in the tests rejects it.
    """

    Options = JakiroStarOptions

    def __init__(self, target: Target, options=None, head: JakiroHead | None = None):
        options = options if options is not None else self.Options()
        if head is None:
            folder = resolve_head_folder(options.head, target, "jakiro_star", SHIPPED_HEADS)
            head = load_jakiro_head(folder, target, "jakiro_star")
        check_experts(options, head)
        spec = copy.copy(options)
        spec.tree = JAKIRO_STAR_TREE if options.tree == "jakiro_star" else options.tree
        super().__init__(target, spec, head)
        self.options = options
        self._q_tilde: list[float] = []  # as_published: q~ of every node of the last proposed tree

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options) -> JakiroStar:
        """The method on a randomly initialised Jakiro* head (GeLU experts, seeded) with ``num_experts`` experts
        (default 2) of which ``experts_per_tok`` are selected (default min(2, N)); no checkpoint is read."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        n = opts.num_experts or 2
        with seeded(seed):
            head = JakiroHead.for_target(target, kind="jakiro_star", num_experts=n, experts_per_tok=min(2, n))
        return cls(target, opts, head=head.eval().requires_grad_(False))

    @classmethod
    def lossless_with(cls, options) -> bool:
        return options.variant == "corrected"

    def draft_vocab(self) -> int:
        """0: Jakiro*'s experts score the target's whole vocabulary (its joint softmax is over (expert, token)
        pairs); it has no ``draft_vocab`` option."""
        return 0

    def _expert_logits(self, out: JakiroOutputs) -> torch.Tensor:
        """[n, K, V] logits of each selected expert's own feature."""
        return self.lm_head(out.experts).float()

    def _children(self, expert_logits: torch.Tensor, count: int, sampling: SamplingParams,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None, list[float] | None]:
        """Children of one node from its experts' logits [K, V]: (tokens, draft_probs row or None, q~ or None)."""
        V = expert_logits.shape[-1]
        joint = expert_logits.reshape(-1)  # [K*V]
        if sampling.greedy:
            return joint_topk_distinct(joint, V, count), None, None
        probs = logits_to_probs(joint, sampling)  # [K*V]
        if self.options.variant == "corrected":
            q = fold_joint(probs, V)
            count = min(count, int(torch.count_nonzero(q)))
            return torch.multinomial(q, count, replacement=False, generator=generator), q, None
        count = min(count, int(torch.count_nonzero(probs)))
        drawn = torch.multinomial(probs, count, replacement=False, generator=generator)
        tokens, q_tilde, residual = published_star_bookkeeping(probs, drawn, expert_logits, V)
        return tokens, residual, q_tilde.tolist()

    def greedy_root(self, root: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        out0 = self.stable_outputs(root, experts=True)
        return out0.experts[:, 0], joint_topk_distinct_rows(self._expert_logits(out0), width)

    def greedy_level(self, feats, toks, pos, kv, cols, width):
        out, kv = self.tree_outputs(feats, toks, pos, kv, cols, experts=True)
        return out.experts[:, 0], kv, joint_topk_distinct_rows(self._expert_logits(out), width)

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        if sampling.greedy:
            self._q_tilde = []
            return self.propose_greedy(root)
        n = len(self.node_depths)
        device = self.target.output_device
        tokens = torch.zeros(n, dtype=torch.long, device=device)  # [N]
        alive = [False] * n
        rows: list[torch.Tensor | None] = [None] * (n + 1)
        q_tilde: dict[int, float] = {}
        out0 = self.stable_outputs(root, experts=True)
        stable_len = self.cache.length

        def fill(slot: int, expert_logits: torch.Tensor) -> None:
            kids = self.children[slot]
            if not kids:
                return
            chosen, row, qt = self._children(expert_logits, len(kids), sampling, generator)
            rows[slot] = row
            for rank_pos, node in enumerate(kids):
                if rank_pos < chosen.shape[0]:
                    tokens[node] = chosen[rank_pos]
                    alive[node] = True
                    if qt is not None:
                        q_tilde[node] = qt[rank_pos]

        fill(0, self._expert_logits(out0)[0])

        def draft_level(feats, toks, pos, kv, cols):
            out, kv = self.tree_outputs(feats, toks, pos, kv, cols, experts=True)
            return out.experts[:, 0], self._expert_logits(out), kv  # the top expert's feature, [b, K, V]

        self.expand_levels(out0.experts[0, 0], tokens, alive, fill, stable_len, draft_level)
        tree = self._compact(tokens, alive, rows)
        ordered = [i for i, a in enumerate(alive) if a]
        self._q_tilde = [q_tilde.get(i, 0.0) for i in ordered]  # per node of the returned tree (as_published)
        return tree

    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        if sampling.greedy or self.options.variant == "corrected":
            return super().verify(tree, logits, sampling, generator)
        toks = tree.tokens.tolist()

        def step(slot, p, children):
            return published_star_step(p, [toks[c] for c in children], [self._q_tilde[c] for c in children],
                                       tree.draft_probs[slot].float(), generator)

        return walk_tree(tree, logits, sampling, generator, step)
