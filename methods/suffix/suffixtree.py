"""SuffixDecoding's suffix trees and its frequency-scored speculation (Oliaro et al., arXiv:2411.04975 Sec. 3-4).

:class:`SuffixTree` holds every suffix of the sequences given to it, cut at ``max_depth`` tokens (a suffix trie of
bounded depth, as the paper bounds its trees' depth), with a count per node: the number of positions at which the
node's token string occurs. Appending one token to a sequence updates the ``max_depth`` suffixes that end there, so a
tree grows as text is generated. The same candidates and counts as a (compressed) suffix tree of bounded depth, but
not its size: a trie holds up to ``max_depth`` nodes per token of text (about 64 x 10k = 640k Python nodes for 80
questions x 2 turns x 64 tokens), where a compressed tree holds O(1); a long run wants a smaller ``max_depth``.

:func:`speculate` is the paper's greedy speculation tree (Sec. 4, "tree expansion"): match a suffix of the context
in the tree (match length p), then grow a tree below the matched node best-first by the estimated
probability D(child) = D(parent) * count(child) / count(parent), D(matched node) = 1; stop at ``max_spec_factor * p``
tokens, at ``max_spec_tokens``, or when the best candidate's D falls below ``min_token_prob`` (and, as the trees
are cut at ``max_depth``, match length + tree depth <= ``max_depth``). Its score (the sum of
D over the tree: the expected number of accepted tokens) chooses between match lengths and between the prompt's
tree and the global one.

With ``branch=False`` the speculation is the single most likely path instead (the child of highest D at every
node), as the authors' implementation drafts by default (ArcticInference's ``use_tree_spec=False``, what vLLM's
``suffix`` method verifies). Siblings of equal count are taken in the order ArcticInference keeps them in (nearly:
it keeps each node's children sorted by decreasing count, a new child last, and a child whose count grows mostly
behind the siblings that already had that count), i.e. the child whose count last changed earliest first.

Worked example (used in the tests): the sequence [1, 2, 3, 1, 2, 4] with max_depth 3. The string [1, 2] occurs at
positions 0 and 3 (count 2), followed once by 3 and once by 4 (counts 1, 1). The context [7, 1, 2] matches [2]
(p = 1) and [1, 2] (p = 2; [7, 1, 2] does not occur). With max_spec_factor 1, p = 1 allows one token (3 or 4,
D = 1/2: score 0.5) and p = 2 two: 3 (D = 1/2) then 4 (D = 1/2), both children of the match: tokens [3, 4],
parents [-1, -1], score 1.0, which wins.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


class SuffixTree:
    """Every suffix (at most ``max_depth`` tokens) of the sequences added, with occurrence counts.

    Node 0 is the root (the empty string; its count is the number of positions). ``children[n]`` maps a token to a
    node, ``counts[n]`` counts the positions where node n's string ends, ``depths[n]`` is its length, ``stamps[n]``
    the update (``clock``) at which its count last changed, which orders siblings of equal count. :meth:`start`
    begins a new sequence (no suffix crosses from one sequence into the next); :meth:`extend` appends tokens to the
    current one. Example: extend([1, 1]) -> nodes "1" (count 2) and "1 1" (count 1).
    """

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.children: list[dict[int, int]] = [{}]
        self.counts: list[int] = [0]
        self.depths: list[int] = [0]
        self.stamps: list[int] = [0]
        self.clock = 0
        self._open: list[int] = []  # nodes of the current sequence's suffixes shorter than max_depth (root excluded)

    def __len__(self) -> int:
        return len(self.counts)

    def start(self) -> None:
        """Begin a new sequence: the next token starts suffixes of its own only."""
        self._open = []

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the current sequence: every suffix ending at each new token is counted once."""
        for token in tokens:
            grown = []
            for node in (0, *self._open):
                child = self.children[node].get(token)
                if child is None:
                    child = len(self.counts)
                    self.children[node][token] = child
                    self.children.append({})
                    self.counts.append(0)
                    self.depths.append(self.depths[node] + 1)
                    self.stamps.append(0)
                self.counts[child] += 1
                self.clock += 1
                self.stamps[child] = self.clock
                if self.depths[child] < self.max_depth:
                    grown.append(child)
            self.counts[0] += 1
            self._open = grown

    def add(self, tokens: list[int]) -> None:
        """A whole new sequence: :meth:`start` then :meth:`extend`."""
        self.start()
        self.extend(tokens)

    def find(self, tokens: list[int]) -> int | None:
        """The node that spells ``tokens`` from the root, or None. Example: after add([1, 2, 3]): find([2, 3]) is a
        node with count 1; find([3, 2]) is None."""
        node = 0
        for token in tokens:
            node = self.children[node].get(token)
            if node is None:
                return None
        return node

    def matches(self, context: list[int]) -> list[tuple[int, int]]:
        """(node, p) for every suffix of ``context`` of p < max_depth tokens that the tree holds (a node at full
        depth has no children), shortest first; a suffix that is absent ends the list, as every longer one contains
        it. Example: after add([1, 2, 3, 1, 2, 4]): matches([7, 1, 2]) -> [(node of [2], 1), (node of [1, 2], 2)]."""
        out = []
        for p in range(1, min(len(context), self.max_depth - 1) + 1):
            node = self.find(context[-p:])
            if node is None:
                break
            out.append((node, p))
        return out


@dataclass
class Speculation:
    """A speculation tree below the matched node: ``tokens [N]``, ``parents [N]`` (-1 = the matched node, i.e. the
    draft tree's root), ``probs [N]`` (D of every node), the match length and the score (sum of probs)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_length: int = 0

    @property
    def score(self) -> float:
        return float(sum(self.probs))


def speculate(tree: SuffixTree, context: list[int], max_spec_factor: float, min_token_prob: float,
              max_spec_tokens: int, branch: bool = True) -> Speculation:
    """The best greedy speculation tree of ``tree`` for ``context`` (arXiv:2411.04975 Sec. 4): for every match
    length p (:meth:`SuffixTree.matches`), the tree (``branch``; else the path) below that match of at most
    ``min(max_spec_tokens, floor(max_spec_factor * p))`` nodes (:func:`expand`); the one with the highest score
    wins, ties going to the longer match. Trying every p, not only the longest, is what the authors'
    implementation does: in a text that repeats with period k the longest match is the most recent repetition,
    followed by fewer than k tokens. Example: see the module docstring.
    """
    best = Speculation()
    for node, p in reversed(tree.matches(context)):
        budget = min(max_spec_tokens, int(max_spec_factor * p + 1e-9))
        spec = expand(tree, node, budget, min_token_prob, branch)
        if spec.score > best.score:
            best = spec
            best.match_length = p
    return best


def expand(tree: SuffixTree, node: int, budget: int, min_token_prob: float, branch: bool = True) -> Speculation:
    """The greedy tree below ``node``: at most ``budget`` nodes, best-first by D, none with D < ``min_token_prob``;
    with ``branch=False`` the path that takes the best child of every node.

    Nodes come out in the order they were chosen, so parents precede children and siblings come in decreasing D
    (preference order); ties go to the node whose count last changed earliest (:class:`SuffixTree` ``stamps``).
    Example: after add([5, 6, 7]) twice and add([5, 6, 8]), below [5] with budget 3 and no pruning: tokens
    [6, 7, 8], parents [-1, 0, 0], D [1, 2/3, 1/3]; with branch=False tokens [6, 7], parents [-1, 0], D [1, 2/3].
    """
    out = Speculation()
    # heap of candidates: (-D, stamp, token, tree node, parent index in `out` (-1 = the matched node))
    heap: list[tuple[float, int, int, int, int]] = []

    def push(parent_node: int, parent_prob: float, parent_index: int) -> None:
        total = tree.counts[parent_node]
        for token, child in tree.children[parent_node].items():
            heapq.heappush(heap, (-parent_prob * tree.counts[child] / total, tree.stamps[child], token, child,
                                  parent_index))

    if budget >= 1:
        push(node, 1.0, -1)
    while heap and len(out.tokens) < budget:
        neg_prob, _, token, child, parent = heapq.heappop(heap)
        if -neg_prob < min_token_prob:
            break
        if not branch:
            heap.clear()  # a chain: the most likely child only, its siblings dropped
        out.tokens.append(token)
        out.parents.append(parent)
        out.probs.append(-neg_prob)
        push(child, -neg_prob, len(out.tokens) - 1)
    return out
