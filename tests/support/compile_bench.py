"""Compile seconds and forward latency of the compiled CPU runtime's two weight modes, side by side in one process
(docs/results.md, "Compiling once per machine"):

    python -m tests.support.compile_bench frozen,inputs 5   # a first run: both modes compile, then paired timings
    python -m tests.support.compile_bench inputs 1          # again, same $DRAFTBENCH_CACHE: what a second run loads

On the default model (fp32, one thread): each mode's runner compiles the three graphs the demo uses (a 40-token
prefill, a one-token decoding step, a 4-slot verification; the verification graph serves every tree size) and says
the seconds and torch's cache counters; then, ``reps`` times, for k = 1, 2, 4 and 8 slots, every mode runs ten
forwards at a 40-token cache (cropped back after each), the modes in turn so that a slow spell of a shared machine
hits both; the medians (ms per forward) and their ratio are printed. A repetition that compiled is dropped.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from harness.engine.compilecache import cache_counts
from harness.engine.kv import attention_layout
from harness.engine.runtime import CompiledRunner
from harness.models import load_target

SLOTS = (1, 2, 4, 8)
CACHED = 40


def _forward(runner, ids: torch.Tensor, k: int, cache) -> None:
    """One forward of ``k`` slots over a cache of CACHED positions, then the cache cropped back to CACHED."""
    if k == 1:
        runner.forward(ids[:, :1], cache)
    else:
        ancestors, depth = torch.tril(torch.ones(k, k, dtype=torch.bool)), torch.arange(k)
        i, pos, mask = runner.verify_inputs(ids[:, :k], ancestors, depth, CACHED, attention_layout(cache), cache)
        runner.forward(i, cache, position_ids=pos, attention_mask=mask)
    if cache.get_seq_length() > CACHED:
        cache.crop(CACHED - cache.get_seq_length())


def main(modes: list[str], reps: int) -> None:
    torch.set_num_threads(1)
    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    ids = torch.randint(100, 5000, (1, CACHED), generator=torch.Generator().manual_seed(0))
    runners, caches = {}, {}
    for mode in modes:
        runner = runners[mode] = CompiledRunner(target, freeze=mode == "frozen")
        t0 = time.perf_counter()
        cache = caches[mode] = runner.new_cache(100)
        runner.forward(ids, cache, prefill=True)
        _forward(runner, ids, 1, cache)
        _forward(runner, ids, 4, cache)
        print(f"{mode}: {runner.graphs} graphs ({runner.loaded} loaded from cache) in {time.perf_counter() - t0:.1f} s;"
              f" torch's cache counters so far {cache_counts()}", flush=True)
    ms: dict[tuple[str, int], list[float]] = {(m, k): [] for m in modes for k in SLOTS}
    for _ in range(reps):
        for k in SLOTS:
            for mode, runner in runners.items():
                graphs, t0 = runner.graphs, time.perf_counter()
                for _ in range(10):
                    _forward(runner, ids, k, caches[mode])
                if runner.graphs == graphs:
                    ms[(mode, k)].append((time.perf_counter() - t0) * 100)
    for k in SLOTS:
        med = {m: statistics.median(ms[(m, k)]) for m in modes}
        line = f"k={k}: " + "  ".join(f"{m} {v:.1f} ms" for m, v in med.items())
        if len(modes) == 2:
            line += f"  ratio {modes[1]}/{modes[0]} {med[modes[1]] / med[modes[0]]:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
