"""Choosing EAGLE-2's tree size from timed target forwards (EAGLE's ``total_token=-1``; EAGLE-2, arXiv:2406.16858,
released ``eagle/model/ea_model.py``).

A verification forward over n tree tokens costs more as n grows, while a bigger tree accepts more tokens per step.
EAGLE's rule times the target over a few sizes and picks the size that minimises ``time(n) / gain(n)``, where the
gains are fixed guesses of how much a tree of n tokens accepts relative to one of 40:

    n      40    48    50    56    60
    gain   1.00  1.05  1.07  1.10  1.13      (EAGLE ``ea_model.py``, copied unchanged into Jakiro)

These gains come from the EAGLE authors' measurements on Vicuna-7B; they are used as published (a draftbench
run records the size it chose in ``counters["total_tokens"]``, so a table can show it). Timings are cached per
(model, device, dtype, sizes, repeats, context_len) for the life of the process.

Those gains are a 7B GPU's: they cannot size a tree for a small target on a CPU, where a forward over 8 slots
already costs 1.3 one-slot forwards and a draft accepts far less. The *adaptive* rule (option ``adaptive`` of the
dynamic-tree methods) sizes every step's tree from what is measured instead:

- the verification cost ``t(n)`` of n slots: :func:`time_tree_sizes` over :func:`adaptive_sizes`, once per
  process, through the method's runtime;
- the draft cost ``d``: the method's own drafting time, a running mean;
- the expected accepted length of the ``n - 1`` best candidates: with greedy verification a node is accepted only
  if its whole path equals the target's greedy tokens, at most one node per depth is, so the expected number of
  accepted drafts is the sum of the nodes' acceptance probabilities. EAGLE-2 (arXiv:2406.16858 Sec. 4.1, Fig. 6)
  shows a node's cumulative draft probability tracks its acceptance rate; :class:`AcceptanceCalibration` rescales it
  by what this run actually accepted (one factor, the ratio of accepted drafts to predicted ones so far).

:func:`best_tree_size` then keeps the n that maximises ``(1 + c * sum of the n - 1 best p) / (d + t(n))``, the
expected tokens per second of the step. The tree only decides which tokens are verified, never what is emitted,
so the rule changes speed only: greedy output stays vanilla's. The same measured costs tell when speculation no
longer pays at all (:func:`speculation_pays`, option ``stop_unprofitable``: the measured accepted drafts of the last
steps against a plain one-slot forward), and, before each step, whether to draft at all (:func:`best_arm`, option
``backoff``: the head's tree, the prompt-lookup chain alone or a plain step, from decayed means of what each
emitted, :func:`decayed`).
"""

from __future__ import annotations

import time
import weakref

import torch

from harness.engine.kv import attention_layout, compact_cache, prepare_cache
from harness.engine.runtime import target_runner
from harness.engine.tree import ancestor_matrix, slot_depths
from harness.measure.trackers import device_sync
from harness.models import Target

EAGLE_TREE_GAINS: dict[int, float] = {40: 1.0, 48: 1.05, 50: 1.07, 56: 1.1, 60: 1.13}
EAGLE_TREE_SIZES: tuple[int, ...] = tuple(EAGLE_TREE_GAINS)
# the tree sizes (slots, root included) the adaptive rule times and chooses among, up to the method's total_tokens
ADAPTIVE_SIZES: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 60, 64, 80, 96, 128)

_TIMINGS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, dict[int, float]]] = weakref.WeakKeyDictionary()


def bench_tree_parents(size: int, branching: int = 10) -> torch.Tensor:
    """Parents ``[size - 1]`` of a tree of ``size`` slots (root included) where every node has ``branching``
    children, filled breadth first (EAGLE's top_k = 10). Example: size 5, branching 2 -> [-1, -1, 0, 0]."""
    if size < 1:
        raise ValueError(f"tree size must be >= 1 (the root), got {size}")
    return torch.arange(size - 1, dtype=torch.long) // branching - 1


def time_tree_sizes(target: Target, sizes: tuple[int, ...] | list[int] = EAGLE_TREE_SIZES, repeats: int = 10,
                    context_len: int = 256, runtime: str = "eager") -> dict[int, float]:
    """Mean seconds of one target verification forward over each tree size (root included), after a context.

    The target first runs over ``context_len`` tokens; then, per size, one untimed warm-up forward and ``repeats``
    timed ones, each with the engine's 4D tree mask and tree position ids, the device synchronised around each
    and the cache cropped back to the context after each. Every forward goes through the runner of ``runtime``
    (:mod:`harness.engine.runtime`), as the method's own verification forwards do.
    """
    sizes = tuple(int(s) for s in sizes)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be a non-empty list of tree sizes >= 1, got {list(sizes)}")
    if repeats < 1 or context_len < 1:
        raise ValueError(f"repeats and context_len must be >= 1, got {repeats}, {context_len}")
    model = target.model
    runner = target_runner(target, runtime)
    key = (str(target.device), str(target.dtype), sizes, repeats, context_len, runtime)
    per_model = _TIMINGS.setdefault(model, {})
    if key in per_model:
        return dict(per_model[key])
    vocab = model.config.vocab_size
    device = target.device
    cache = runner.new_cache(context_len + max(sizes))
    layout = attention_layout(cache)
    timings: dict[int, float] = {}
    with torch.inference_mode():
        context = (torch.arange(context_len, device=device) * 7919 % vocab)[None]  # [1, C] arbitrary fixed tokens
        runner.forward(context, cache, prefill=True, logits_to_keep=1)
        prepare_cache(cache)
        for size in sizes:
            ancestors = ancestor_matrix(bench_tree_parents(size).to(device))
            depth = slot_depths(ancestors)
            tokens = (torch.arange(size, device=device) * 104729 % vocab)[None]  # [1, size]
            ids, pos, mask = runner.verify_inputs(tokens, ancestors, depth, context_len, layout, cache)
            elapsed = 0.0
            for run in range(repeats + 1):
                device_sync(device)
                t0 = time.perf_counter()
                runner.forward(ids, cache, attention_mask=mask, position_ids=pos)
                device_sync(device)
                if run > 0:  # run 0 warms up
                    elapsed += time.perf_counter() - t0
                compact_cache(cache, context_len, [])  # drop the tree slots again (sliding layers included)
            timings[size] = elapsed / repeats
    per_model[key] = timings
    return dict(timings)


def choose_tree_size(timings: dict[int, float], gains: dict[int, float] | None = None) -> int:
    """The size minimising ``timings[n] / gains[n]`` (EAGLE's rule; default gains :data:`EAGLE_TREE_GAINS`).

    Ties go to the smaller tree. Example: timings {40: 1.0, 60: 1.1} -> 1.0/1.0 vs 1.1/1.13 = 0.973 -> 60.
    """
    gains = EAGLE_TREE_GAINS if gains is None else gains
    if not timings:
        raise ValueError("choose_tree_size: no timings")
    missing = sorted(set(timings) - set(gains))
    if missing:
        raise ValueError(f"choose_tree_size: no gain for tree size(s) {missing}; gains are given for {sorted(gains)}")
    return min(sorted(timings), key=lambda n: timings[n] / gains[n])


def adaptive_sizes(cap: int) -> tuple[int, ...]:
    """The sizes the adaptive rule chooses among for a tree of at most ``cap`` slots: :data:`ADAPTIVE_SIZES` below
    ``cap``, and ``cap``. Example: cap 7 -> (1, 2, 3, 4, 5, 6, 7)."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1 slot, got {cap}")
    return tuple(s for s in ADAPTIVE_SIZES if s < cap) + (cap,)


def best_tree_size(node_probs: list[float], verify_s: dict[int, float], draft_s: float,
                   calibration: float = 1.0) -> int:
    """The tree size (slots, root included) with the most expected tokens per second.

    ``node_probs``: estimated acceptance probabilities of the candidates in rank order (best first; a prefix of
    that order is the tree, :func:`harness.engine.tree.rank_candidates`); ``verify_s``: seconds of one verification
    forward per size (the sizes chosen among; a size needing more candidates than there are is skipped);
    ``draft_s``: seconds of drafting per step; ``calibration``: the factor on the probabilities. The expected
    emitted tokens of n slots are ``1 + calibration * sum(node_probs[:n-1])`` (the bonus token plus the expected
    accepted drafts). Ties go to the smaller tree.

    Example: node_probs [0.9, 0.5, 0.1], verify_s {1: 1.0, 2: 1.0, 4: 1.5}, draft_s 0.5: size 1 -> 1 / 1.5 = 0.67,
    size 2 -> 1.9 / 1.5 = 1.27, size 4 -> 2.5 / 2.0 = 1.25, so 2 (with calibration 2, size 4 wins: 4.0 / 2.0).
    """
    if not verify_s:
        raise ValueError("best_tree_size: no verification timings")
    if draft_s < 0 or calibration < 0:
        raise ValueError(f"draft_s and calibration must be >= 0, got {draft_s}, {calibration}")
    fits = [n for n in sorted(verify_s) if 1 <= n <= len(node_probs) + 1]
    if not fits:
        raise ValueError(f"best_tree_size: none of the sizes {sorted(verify_s)} fits {len(node_probs)} candidates")
    rates = [expected_rate(node_probs, n, verify_s[n], draft_s, calibration) for n in fits]
    return fits[rates.index(max(rates))]  # index() finds the first maximum: ties go to the smaller tree


def expected_rate(node_probs: list[float], size: int, verify_s: float, draft_s: float,
                  calibration: float = 1.0) -> float:
    """Expected tokens per second of a step that verifies ``size`` slots (the ``size - 1`` first of ``node_probs``)
    at ``verify_s`` seconds after ``draft_s`` seconds of drafting: ``(1 + calibration * sum) / (draft_s + verify_s)``.
    Example: [0.9, 0.5, 0.1], size 2, 1.0 s, 0.5 s -> 1.9 / 1.5 = 1.267."""
    return (1.0 + calibration * float(sum(node_probs[: size - 1]))) / (draft_s + verify_s)


def worth_another_level(frontier_probs: float, level_s: float, rate: float | None, calibration: float = 1.0) -> bool:
    """Should drafting run one more level? Yes when the most that level can add, per second it costs, beats the
    step's expected rate (tokens per second).

    The children of a frontier node can never be likelier than it (cumulative probabilities only shrink), so the
    next level adds at most ``calibration * frontier_probs`` expected tokens (``frontier_probs``: the sum of the
    frontier's cumulative probabilities) for one more draft forward of ``level_s`` seconds. This is an upper bound,
    so a level is only skipped when even its best case does not pay. ``rate`` None (nothing measured yet): yes.

    Example: frontier [0.3, 0.1] (sum 0.4), 4 ms per level, rate 50 tok/s: 0.4 / 0.004 = 100 > 50 -> yes; with a
    frontier summing to 0.15: 37.5 < 50 -> no.
    """
    if rate is None or level_s <= 0:
        return True
    return calibration * frontier_probs / level_s > rate


def speculation_pays(accepted: list[int], verify_s: list[float], draft_s: float, plain_s: float) -> bool:
    """Did the measured speculative steps emit tokens at least as fast as plain decoding would have?

    ``accepted[i]``: the drafts accepted at step i; ``verify_s[i]``: the seconds of its verification forward (timed at
    its size, :func:`time_tree_sizes`); ``draft_s``: the drafting seconds per step; ``plain_s``: the seconds of a
    one-slot forward (a plain step, one token). The steps emitted ``len(accepted) + sum(accepted)`` tokens (each its
    bonus token and its accepted drafts) in ``len(accepted) * draft_s + sum(verify_s)`` seconds; speculation pays
    while that rate is at least ``1 / plain_s``.

    Example: accepted [0, 1], verify_s [1.2, 1.2], draft_s 0.3, plain_s 1.0: 3 tokens in 3.0 s = 1.0 >= 1.0 -> yes;
    accepted [0, 0]: 2 tokens in 3.0 s < 1.0 -> no.
    """
    if not accepted or len(verify_s) != len(accepted):
        raise ValueError(f"speculation_pays: expected one verification time per step, got {len(accepted)} steps and "
                         f"{len(verify_s)} times")
    if draft_s < 0 or plain_s <= 0:
        raise ValueError(f"draft_s must be >= 0 and plain_s > 0, got {draft_s}, {plain_s}")
    tokens = len(accepted) + sum(accepted)
    return tokens * plain_s >= len(accepted) * draft_s + sum(verify_s)


ARMS: tuple[str, ...] = ("plain", "chain", "head")  # what a step can run, cheapest first (the order ties go to)


def best_arm(plain_s: float, chain: tuple[float, float] | None = None,
             head: tuple[float, float] | None = None) -> str:
    """Which step emits the most expected tokens per second: ``"plain"`` (the root alone: 1 token in ``plain_s``
    seconds, a one-slot forward), ``"chain"`` (the prompt-lookup chain alone) or ``"head"`` (the head's tree, drafted).
    ``chain`` and ``head``: (expected tokens emitted, bonus token included; expected seconds, drafting included), None
    when the arm is not on offer. Ties go to the cheaper arm, in the order of :data:`ARMS`.

    Example: plain_s 1.0; chain (2.0, 1.1) -> 1.82 tokens/s, head (1.2, 1.4) -> 0.86: "chain"; without the chain:
    "plain" (1.0 > 0.86); head (3.0, 1.5) -> 2.0: "head".
    """
    if plain_s <= 0:
        raise ValueError(f"plain_s must be > 0, got {plain_s}")
    rates = {"plain": 1.0 / plain_s}
    for arm, offer in (("chain", chain), ("head", head)):
        if offer is not None:
            tokens, seconds = offer
            if tokens < 0 or seconds <= 0:
                raise ValueError(f"best_arm: {arm} needs tokens >= 0 and seconds > 0, got {offer}")
            rates[arm] = tokens / seconds
    best = max(rates.values())
    return next(arm for arm in ARMS if rates.get(arm) == best)


def decayed(mean: float | None, value: float, weight: float) -> float:
    """An exponentially decayed mean after one more ``value``: ``(1 - weight) * mean + weight * value``; the first
    value (``mean`` None) is taken as it is. Example: mean 2.0, value 0.0, weight 0.25 -> 1.5."""
    return value if mean is None else (1.0 - weight) * mean + weight * value


class AcceptanceCalibration:
    """The factor that maps predicted accepted drafts (sums of draft probabilities) to accepted ones: the ratio of
    the totals seen so far, starting from ``prior`` as if ``prior_weight`` predicted drafts had been seen.

    Example: prior 1, weight 4; after steps (predicted 2.0, accepted 1) and (1.0, 0): (4 + 1) / (4 + 3) = 0.714.
    """

    def __init__(self, prior: float = 1.0, prior_weight: float = 4.0):
        self.predicted, self.accepted = float(prior_weight), float(prior) * float(prior_weight)

    def update(self, predicted: float, accepted: int) -> None:
        self.predicted += float(predicted)
        self.accepted += float(accepted)

    @property
    def factor(self) -> float:
        return self.accepted / self.predicted if self.predicted > 0 else 1.0
