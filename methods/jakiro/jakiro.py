"""The method ``jakiro``: EAGLE-2's dynamic tree drafted by a Jakiro head, with autoregressive levels and a last
level predicted in parallel by the contrastive output (Jakiro, arXiv:2502.06282; released code github.com/haiduo/Jakiro
``jakiro/model/cnets.py``, ``topK_genrate``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.checkpoints import resolve_head_folder
from harness.engine.hostio import upload
from harness.engine.method import build_options, seeded
from harness.models import Target
from harness.registry import register_method
from methods import SHIPPED_HEADS
from methods.eagle.eagle2 import DynamicCandidates, Eagle2, Eagle2Options
from methods.jakiro.checkpoint import load_jakiro_head
from methods.jakiro.draft import MoEDraft, check_experts, on_off
from methods.jakiro.head import JakiroHead, JakiroOutputs


def round_robin_children(log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k distinct children per row from R representations, taken in turn: rank 0 of representation 0, rank 0 of
    representation 1, ..., rank 1 of representation 0, ...; a token already taken is skipped.

    log_probs [n, R, V] -> (tokens [n, k], scores [n, k] = the proposing representation's log-prob, source [n, k] =
    which representation proposed it). R = 1 is plain top-k.
    Example (one row, R = 2, k = 3): rep 0 ranks tokens [5, 7, 2], rep 1 ranks [7, 9, 5] -> order 5, 7, 7(skip),
    9, 2 -> tokens [5, 7, 9] with sources [0, 1, 1] (7 first comes from rep 1: rank 0 of rep 1 precedes rank 1 of
    rep 0).
    """
    n, R, _ = log_probs.shape
    lp, tok = torch.topk(log_probs, k, dim=-1)  # [n, R, k]
    lp, tok = lp.transpose(1, 2).reshape(n, k * R), tok.transpose(1, 2).reshape(n, k * R)  # rank-major
    src = torch.arange(R, device=tok.device).repeat(k).expand(n, -1)  # [n, k*R]
    same = tok[:, :, None] == tok[:, None, :]  # [n, kR, kR]
    dup = (same & torch.ones_like(same[0]).tril(-1)).any(-1)  # [n, kR] an earlier slot has the same token
    order = torch.sort(dup.to(torch.int8), dim=-1, stable=True).indices[:, :k]  # first k distinct, in turn order
    return tok.gather(1, order), lp.gather(1, order), src.gather(1, order)


def second_rows(num_selected: int, parent_row: torch.Tensor, num_rows: int, alignment: str) -> torch.Tensor:
    """Which row's two-step prediction becomes the children of each selected node, ``[num_selected]``.

    The frontier rows ran one forward; their children were re-ranked and ``num_selected`` kept, the j-th with
    parent row ``parent_row[j]``. ``fixed``: node j's children are its OWN parent row's two-step prediction (its
    grandparent's C, which skipped node j's token). ``released``: node j gets row j (the released code attaches the
    C-predictions of level-4 node r under the r-th selected level-5 node, ``cnets.py``); at the root there is a
    single row, and every node gets it (j mod rows).
    Example: parent_row [2, 0, 2], 3 rows -> fixed [2, 0, 2], released [0, 1, 2].
    """
    if alignment == "fixed":
        return parent_row
    return torch.arange(num_selected, device=parent_row.device) % num_rows


MODES = ("hybrid", "ar", "parallel")


@dataclass
class JakiroOptions(Eagle2Options):
    """Options of ``jakiro``: :class:`methods.eagle.eagle2.Eagle2Options` (Jakiro's evaluation also uses
    ``total_tokens`` 60; ``depth`` d: the tree has d + 1 levels; ``adaptive`` sizes the tree only: the depth stays
    fixed, since hybrid's last level comes from the penultimate forward), and ``mode``, ``contrastive``,
    ``alignment``, ``candidates`` (see :class:`Jakiro` for what each computes). ``num_experts`` /
    ``experts_per_tok``: None = the checkpoint's ``num_local_experts`` / ``num_experts_per_tok``; num_experts must
    match the checkpoint, K may be changed at inference (1 <= K <= N).
    """

    mode: str = "hybrid"
    contrastive: str = "on"
    alignment: str = "released"
    candidates: str = "mixed"
    num_experts: int | None = None
    experts_per_tok: int | None = None

    RECORDED_ORDER = ("head", "mode", "contrastive", "alignment", "candidates", "total_tokens", "depth", "top_k",
                      "num_experts", "experts_per_tok", "draft_vocab", "adaptive", "lookup", "lookup_ngram",
                      "lookup_alone", "draft_window", "max_spec_context", "stop_unprofitable", "backoff",
                      "head_precision")

    def __post_init__(self):
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.contrastive = on_off(self.contrastive, "contrastive")
        if self.alignment not in ("released", "fixed"):
            raise ValueError(f"alignment must be 'released' or 'fixed', got {self.alignment!r}")
        if self.candidates not in ("mixed", "decoupled"):
            raise ValueError(f"candidates must be 'mixed' or 'decoupled', got {self.candidates!r}")
        for name in ("num_experts", "experts_per_tok"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or null (read from the checkpoint), got {value!r}")
        if (self.num_experts is not None and self.experts_per_tok is not None
                and self.experts_per_tok > self.num_experts):
            raise ValueError(f"experts_per_tok={self.experts_per_tok} exceeds num_experts={self.num_experts}")


class _Candidates:
    """Every candidate recorded in one cycle: token, cumulative log-prob, parent (candidate index, -1 = root) and
    level, plus the draft-KV column of the candidates that have been run through the head."""

    def __init__(self):
        self.tokens: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.parents: list[int] = []
        self.levels: list[int] = []
        self.column: dict[int, int] = {}

    def add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: list[int], level: int) -> int:
        """Record ``tokens [m]`` / ``scores [m]`` with their parents; returns the index of the first one."""
        first = len(self.parents)
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.extend(parents)
        self.levels.extend([level] * len(parents))
        return first

    def ancestry(self, nodes: list[int], device: torch.device) -> torch.Tensor:
        """Assign KV columns to ``nodes`` (run next, in this order) and return their masks over all run nodes,
        ``[n, columns]``: each sees its ancestors and itself (every ancestor must have been run already or be in
        ``nodes``)."""
        base = len(self.column)
        for r, c in enumerate(nodes):
            self.column[c] = base + r
        cols = torch.zeros(len(nodes), base + len(nodes), dtype=torch.bool)
        for r, c in enumerate(nodes):
            a = c
            while a >= 0:
                cols[r, self.column[a]] = True
                a = self.parents[a]
        return cols.to(device, non_blocking=True)


@dataclass
class _Frontier:
    """The nodes kept at one level: candidate ``index`` list, ``tokens [n]``, cumulative ``scores [n]`` and the
    feature each was proposed from, which is its input feature when it is run (``features [n, H]``)."""

    index: list[int]
    tokens: torch.Tensor
    scores: torch.Tensor
    features: torch.Tensor


@register_method("jakiro")
class Jakiro(MoEDraft, Eagle2):
    """Jakiro (arXiv:2502.06282): EAGLE-2's dynamic tree drafted by a MoE head, with d + 1 levels.

    Every node's children come from one forward output of the node's own position: ``first`` = the next level,
    from M (``candidates=mixed``, as released) or from the K selected experts' own features h + e taken in turn
    (``candidates=decoupled``, the paper's description: siblings come from different representations; each child's
    input feature is the expert feature that proposed it); ``second`` = the level after next, the node's
    two-step prediction: C (``contrastive=on``), or M used as a two-step predictor (``contrastive=off``: the
    children of a node are re-proposed from its parent's M, no contrast). Candidates are recorded with cumulative
    log-probs exactly as EAGLE-2 (k*k per level, the k best form the next frontier), and the ``total_tokens - 1``
    best make the tree. ``alignment`` decides which row's second output a selected node gets
    (:func:`second_rows`).

    Modes (d = ``depth``; draft forwards per cycle, stable-KV forward included):

    - ``hybrid`` (as released): levels 1..d from ``first``; the forward over the level-(d-1) frontier (the
      penultimate one; the stable forward when d = 1) also computes ``second``, which supplies level d + 1. d forwards.
    - ``ar``: every level from ``first`` (EAGLE-2 with a MoE head; ``contrastive`` and ``alignment`` unused).
      d + 1 forwards.
    - ``parallel``: ``second`` replaces a forward wherever it can: every forward over the level-L frontier gives
      levels L+1 (``first``) and L+2 (``second``, when at least two levels remain); the next forward runs the
      level-(L+1) and level-(L+2) frontiers together (2k rows; the former only to put their K/V in place), and the
      level-(L+2) rows continue. ceil((d+1)/2) forwards.

    Table 4 of the paper (without parallel decoding / without the contrastive mechanism / without both) maps to:
    ``mode=ar`` / ``mode=hybrid contrastive=off`` / ``mode=ar`` with a head trained with objective option
    ``contrast_weight=0`` (at inference "without both" equals ``ar``; the difference is in training). Comparing
    ``hybrid`` with ``ar`` on the same head separates the acceptance effect from the saved forward.

    The draft is deterministic top-k in every mode (also at T>0), so verification is the deterministic-proposal
    rule and every mode is lossless.
    """

    Options = JakiroOptions

    def __init__(self, target: Target, options=None, head: JakiroHead | None = None):
        options = options if options is not None else self.Options()
        folder = None
        if head is None:
            folder = resolve_head_folder(options.head, target, "jakiro", SHIPPED_HEADS)
            head = load_jakiro_head(folder, target)
        check_experts(options, head)
        super().__init__(target, options, head, folder)

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options) -> Jakiro:
        """The method on a randomly initialised :class:`JakiroHead` (seeded) with ``num_experts`` experts (default
        2) of which ``experts_per_tok`` are selected (default min(2, N)); no checkpoint is read."""
        opts = build_options(cls.Options, options, f"method {cls.name!r}")
        n = opts.num_experts or 2
        with seeded(seed):
            head = JakiroHead.for_target(target, num_experts=n, experts_per_tok=min(2, n))
        return cls(target, opts, head=head.eval().requires_grad_(False))

    # ---- what each forward must compute ---------------------------------------------------------------------------
    def _wants_second(self, level: int) -> bool:
        """Does the forward over the level-``level`` frontier (0 = the stable forward) compute the second output?"""
        levels = self.options.depth + 1
        if self.options.mode == "hybrid":
            return levels - level == 2
        if self.options.mode == "parallel":
            return levels - level >= 2
        return False

    def _outputs_needed(self, level: int) -> dict[str, bool]:
        second = self._wants_second(level)
        return {"contrast": second and self.options.contrastive == "on",
                "experts": self.options.candidates == "decoupled"}

    def _first_reps(self, out: JakiroOutputs) -> torch.Tensor:
        """The representations that propose the next level, ``[n, R, H]``."""
        return out.experts if self.options.candidates == "decoupled" else out.mixture[:, None]

    def _second_rep(self, out: JakiroOutputs) -> torch.Tensor:
        """The two-step representation, ``[n, H]``: C, or M when ``contrastive=off``."""
        return out.contrast if self.options.contrastive == "on" else out.mixture

    # ---- one level of candidates ----------------------------------------------------------------------------------
    def _grow(self, cands: _Candidates, parents: _Frontier, reps: torch.Tensor, rows: torch.Tensor,
              level: int) -> _Frontier:
        """Record the children of every ``parents`` node (k each, from ``reps[rows[j]]`` for node j, ``reps``
        [n_rows, R, H]) at ``level`` and return the k best (cumulative log-prob) as the next frontier."""
        k = self.options.top_k
        tok, lp, src = round_robin_children(self.log_probs(reps), k)  # [n_rows, k] each
        tok, lp, src = tok[rows], lp[rows], src[rows]                   # [m, k]
        m = len(parents.index)
        cum = (lp + parents.scores[:, None]).flatten()                 # [m*k]
        first = cands.add(tok.flatten(), cum, [p for p in parents.index for _ in range(k)], level)
        sel = torch.topk(cum, min(k, cum.shape[0])).indices             # [k]
        feats = reps[rows][torch.arange(m, device=tok.device).repeat_interleave(k), src.flatten()]  # [m*k, H]
        return _Frontier(index=(first + sel).tolist(), tokens=tok.flatten()[sel], scores=cum[sel],
                         features=feats[sel])

    def expand(self, root: int):
        """All candidates of one cycle (see the class docstring for what each mode computes)."""
        levels = self.options.depth + 1
        cands = _Candidates()
        out = self.stable_outputs(root, **self._outputs_needed(0))
        stable_len = self.cache.length
        device = out.mixture.device
        frontier = _Frontier(index=[-1], tokens=torch.full((1,), root, device=device),
                             scores=torch.zeros(1, device=device),
                             features=out.mixture)
        level, kv = 0, self.cache.kv
        while True:
            n_rows = len(frontier.index)
            rows = torch.arange(n_rows, device=device)
            nxt = self._grow(cands, frontier, self._first_reps(out), rows, level + 1)
            to_run = [nxt]
            if level + 1 == levels:
                break
            if self._wants_second(level):
                parent_row = _parent_rows(cands, nxt.index, frontier.index, device)
                rows2 = second_rows(len(nxt.index), parent_row, n_rows, self.options.alignment)
                nxt = self._grow(cands, nxt, self._second_rep(out)[:, None], rows2, level + 2)
                to_run.append(nxt)
                if level + 2 == levels:
                    break
            level = cands.levels[nxt.index[0]]
            nodes = [i for f in to_run for i in f.index]
            cols = cands.ancestry(nodes, device)
            pos = upload([stable_len - 1 + cands.levels[i] for i in nodes], device)
            feats = torch.cat([f.features for f in to_run])
            toks = torch.cat([f.tokens for f in to_run])
            out, kv = self.tree_outputs(feats, toks, pos, kv, cols, **self._outputs_needed(level))
            out = out.rows(slice(len(nodes) - len(nxt.index), len(nodes)))
            frontier = nxt
        parents = upload(cands.parents, device)
        return DynamicCandidates(torch.cat(cands.tokens), torch.cat(cands.scores), parents)


def _parent_rows(cands: _Candidates, nodes: list[int], rows: list[int], device: torch.device) -> torch.Tensor:
    """For each of ``nodes``, the position of its parent in the frontier list ``rows`` (-1 = the root's row 0)."""
    where = {c: r for r, c in enumerate(rows)}
    return upload([where[cands.parents[c]] for c in nodes], device)
