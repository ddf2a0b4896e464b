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
