"""The method ``lookahead``: Lookahead decoding (Fu et al., arXiv:2402.02057 Sec. 3), training-free.

One target forward per step does two things (Sec. 3.3, "decode, predict and verify in the same step"):

- the *lookahead branch* (Sec. 3.1): a 2-D window of Jacobi guesses, ``W`` columns by ``N - 1`` levels, runs as the
  engine's side branch (:meth:`harness.engine.speculative.SpeculativeMethod.side_branch`: never verified, never
  accepted, its K/V dropped). Level l, column i sits at position ``root + i + l``; level 0 is a chain below the root
  (its column 0 *is* the root) and column i's later levels hang below level 0's column i, so every slot sees the
  committed prefix and exactly the guesses at the positions before its own (the paper's Fig. 2b mask, expressed as
  a tree: :func:`window_tree`). The target's argmax at the last level's slots (the root's for column 0 when the
  last level is level 0) is the next Jacobi iterate: each column gives an n-gram (its level-0 token, its later
  levels, the new token; :func:`window_ngrams`) for the pool, and the window moves one level up
  (:func:`advance_window`);
- the *verification branch* (Sec. 3.2): the pool's n-grams keyed by the pending root (at most ``G`` per key, least
  recently added dropped first, :func:`pool_add`) are verified as the draft tree, by the engine's lossless greedy
  or speculative-sampling verification.

The pool and the window start empty and from the prompt at every turn (the pool persists across the steps of a turn,
as published). The window's first level is filled with tokens drawn from the prompt (``random.Random(10)`` per
turn: the reference code's ``random.seed(10)`` and draws); during the first ``N - 2`` steps it grows one level per
step before any n-gram is collected, as the reference code's warm-up does (level lengths ``W + N - 2 - step`` until
they reach ``W``).

Differences from the paper and its reference code (``hao-ai-lab/LookaheadDecoding``, ``lade/decoding.py``), none of
which changes the output (verification is lossless):

- the pool's n-grams that share a prefix are merged into one trie (:func:`harness.engine.tree.graft_chain`) rather
  than verified as ``G`` disjoint rows: the accepted path is the same, in fewer slots;
- the window's first level runs in the first step's forward: the reference runs it in the prefill's (its first draw
  at the root's position), so its window is one step ahead and one draw on. Started that way and keeping
  end-of-sequence tokens in the window, the harness verifies the same n-grams at every step as the reference's
  greedy path (``docs/reference.md``, "Lookahead vs lade");
- the window always moves by one position per step, whatever the number of tokens accepted (the reference's default
  ``ALWAYS_FWD_ONE``); end-of-sequence tokens entering the window are replaced by prompt tokens at every temperature
  (the reference's ``filter_window`` does so only when sampling, drawing from the prompt and the text so far);
- the window is advanced with the target's argmax at every temperature (as the reference does when sampling).

Defaults: ``W = 15, N = 5, G = 15``, the 7B setting of the paper's experiments (Sec. 5; the reference README suggests
``N = 5, W = 7, G = 7`` for a 7B model on smaller GPUs). One forward then carries up to 1 + (W - 1) + W (N - 2) +
G (N - 1) = 120 slots, which is cheap on a GPU and costly on a CPU: choose a small window there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from harness.engine.hostio import fetch, upload
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, graft_chain
from harness.models import Target
from harness.registry import register_method

REFERENCE_SEED = 10  # the reference code seeds Python's random with 10 per generate call (lade/decoding.py)


def window_tree(levels: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """The window as a side tree below the root: ``(tokens [M], parents [M], last [C])``.

    ``levels[l][i]`` is the guess at position ``root + i + l``; ``levels[0][0]`` stands for the root itself (it is
    not a node). Level 0's columns 1.. form a chain below the root; level l >= 1, column i hangs below level l - 1,
    column i (every level has at most as many columns as the one below it). ``last[i]``: the node of the last
    level's column i (-1 = the root), whose logits predict position ``root + i + len(levels)``.

    Example: levels [[r, a, b], [c, d, e]] -> tokens [a, b, c, d, e], parents [-1, 0, -1, 0, 1] (c below the root,
    d below a, e below b), last [2, 3, 4]; levels [[r, a]] -> tokens [a], parents [-1], last [-1, 0].
    """
    tokens: list[int] = []
    parents: list[int] = []
    below = [-1]  # the node of the previous level's column i (-1 = the root)
    for i in range(1, len(levels[0])):
        tokens.append(levels[0][i])
        parents.append(below[-1])
        below.append(len(tokens) - 1)
    for level in levels[1:]:
        here = []
        for i, token in enumerate(level):
            tokens.append(token)
            parents.append(below[i])
            here.append(len(tokens) - 1)
        below = here
    return tokens, parents, below


def window_ngrams(levels: list[list[int]], outputs: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """The n-grams a full window's step yields, one per column: ``(key, rest)`` with key = level 0's column i (the
    root for i = 0) and rest = the later levels' column i, then ``outputs[i]`` (the target's token after it).

    Example: levels [[r, a, b], [c, d, e]], outputs [x, y, z] -> [(r, (c, x)), (a, (d, y)), (b, (e, z))].
    """
    return [(levels[0][i], tuple(level[i] for level in levels[1:]) + (out,)) for i, out in enumerate(outputs)]


def advance_window(levels: list[list[int]], outputs: list[int], size: int) -> list[list[int]]:
    """The window after one step, with ``outputs`` (the target's argmax at :func:`window_tree`'s ``last`` slots)
    and ``size`` = N - 1 levels once full; position ``root + 1`` becomes column 0 (the next root).

    Full (``len(levels) == size``): level l takes level l + 1, the last level takes ``outputs``. Warm-up (fewer
    levels): every level drops its column 0 and ``outputs[1:]`` becomes a new last level. Column 0 of the new level
    0 stands for the next root (the caller writes it). Examples: ([[r, a, b], [c, d, e]], [x, y, z], 2) ->
    [[c, d, e], [x, y, z]]; ([[r, a, b, f]], [w, x, y, z], 2) -> [[a, b, f], [x, y, z]].
    """
    if len(levels) >= size:
        return [list(level) for level in levels[1:]] + [list(outputs)]
    return [level[1:] for level in levels] + [list(outputs[1:])]


def pool_add(pool: dict[int, list[tuple[int, ...]]], key: int, gram: tuple[int, ...], cap: int) -> None:
    """Add n-gram ``gram`` under ``key`` to ``pool`` (in place), at most ``cap`` per key, most recent last: a gram
    already there moves to the end; a full key drops its oldest.

    Example: pool {1: [(2,), (3,)]}, cap 2: add (2,) -> [(3,), (2,)]; then add (4,) -> [(2,), (4,)].
    """
    grams = pool.setdefault(key, [])
    if gram in grams:
        grams.remove(gram)
    elif len(grams) >= cap:
        grams.pop(0)
    grams.append(gram)


def pool_trie(grams: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """The verification branch: ``grams`` (in pool order) merged into one trie below the root, ``(tokens,
    parents)``. Example: [(5, 6), (5, 7), (8, 6)] -> tokens [5, 6, 7, 8, 6], parents [-1, 0, 0, -1, 3]."""
    tokens: list[int] = []
    parents: list[int] = []
    for gram in grams:
        tokens, parents = graft_chain(tokens, parents, list(gram))
    return tokens, parents


@dataclass
class LookaheadOptions:
    """``window`` (W): columns of the Jacobi window; ``ngram`` (N): n-gram size (the window has N - 1 levels);
    ``guess`` (G): n-grams kept per key and verified per step. Together they must fit one verification forward:
    1 + (W - 1) + W (N - 2) + G (N - 1) slots at most (128, the engine's static cache room)."""

    window: int = 15
    ngram: int = 5
    guess: int = 15

    def __post_init__(self):
        for name, low in (("window", 1), ("ngram", 2), ("guess", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.slots > SpeculativeMethod.max_tree_slots:
            raise ValueError(f"window={self.window}, ngram={self.ngram}, guess={self.guess} need {self.slots} slots "
                             f"per forward (1 + (W - 1) + W (N - 2) + G (N - 1)), more than the "
                             f"{SpeculativeMethod.max_tree_slots} a verification forward may take")

    @property
    def slots(self) -> int:
        """The most slots one forward takes: the root, the full window and G disjoint (N - 1)-token guesses."""
        w, n, g = self.window, self.ngram, self.guess
        return 1 + (w - 1) + w * (n - 2) + g * (n - 1)


@register_method("lookahead")
class Lookahead(SpeculativeMethod):
    """Lookahead decoding: a Jacobi window (W x N-1) and n-gram verification in one forward (arXiv:2402.02057 Sec. 3).

    State (reset every turn): ``pool`` (key token -> up to G n-gram tails), ``levels`` (the window, host lists).
    Counters: ``window_tokens`` (side slots run, never accepted) beside the engine's.
    """

    Options = LookaheadOptions
    logit_topk = 1  # the argmax at every slot: the window's next iterate

    def __init__(self, target: Target, options=None):
        super().__init__(target, options)
        self.device = target.device
        self.eos = target.eos_ids
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.levels: list[list[int]] = []
        self.rng = random.Random(REFERENCE_SEED)
        self.prompt: list[int] = []
        self._side: DraftTree | None = None
        self._drafts = 0          # nodes in the current draft tree
        self._last: list[int] = []  # the side nodes of the window's last level (-1 = the root)
        self.outputs: list[int] = []

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "state": "n-gram pool and window reset every turn"}

    def _prompt_token(self) -> int:
        return self.rng.choice(self.prompt)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        o = self.options
        self.prompt = prompt_ids[0].tolist()
        self.rng = random.Random(REFERENCE_SEED)
        self.pool = {}
        # warm-up starts from one level of W + N - 2 columns (column 0 = the root), drawn from the prompt
        self.levels = [[0] + [self._prompt_token() for _ in range(o.window + o.ngram - 3)]]

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        self.levels[0][0] = root
        tokens, parents = pool_trie(self.pool.get(root, []))
        side_tokens, side_parents, self._last = window_tree(self.levels)
        self._drafts = len(tokens)
        self._side = DraftTree(upload(side_tokens, self.device), upload(side_parents, self.device))
        self.counters["window_tokens"] = self.counters.get("window_tokens", 0) + len(side_tokens)
        return DraftTree(upload(tokens, self.device), upload(parents, self.device))

    def side_branch(self) -> DraftTree | None:
        return self._side

    def observe(self, slot_ids: torch.Tensor, top_ids: torch.Tensor) -> None:
        slots = [0 if node < 0 else self._drafts + 1 + node for node in self._last]
        self.outputs = fetch(top_ids[upload(slots, top_ids.device), 0])

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        size = self.options.ngram - 1
        if len(self.levels) == size:
            for key, gram in window_ngrams(self.levels, self.outputs):
                pool_add(self.pool, key, gram, self.options.guess)
        self.levels = advance_window(self.levels, self.outputs, size)
        self.levels[-1] = [self._prompt_token() if t in self.eos else t for t in self.levels[-1]]
