"""One process's compiled greedy turns on the tiny target, for the compile-cache tests (tests/test_compilecache.py):
``python -m tests.support.compiled_run FLAVOUR`` (dynamic | static) runs vanilla then pld through one compiled runner
(cache folder under $DRAFTBENCH_CACHE) and prints one JSON line: the graphs, how many were loaded from the cache, the
cache notes, every compile event and the tokens. A fresh process each time: inductor also keeps graphs in memory."""

from __future__ import annotations

import json
import sys

import torch

from harness.engine.runtime import CompiledRunner
from tests.support.helpers import GREEDY, build_example, tiny_target

PROMPT = torch.tensor([[40, 41, 42, 43, 40, 41, 42, 43, 40, 41]])


def main(flavour: str) -> None:
    torch.set_num_threads(1)
    target = tiny_target(eos=False)
    runner = target.runners["compiled"] = CompiledRunner(target, static=flavour == "static")
    events: list = []
    runner.on_compile = events.append
    tokens = {}
    for name in ("vanilla", "pld"):
        method = build_example(name, target)
        method.runtime = "compiled"
        tokens[name] = method.generate(PROMPT, 16, GREEDY).token_ids
    print(json.dumps({"graphs": runner.graphs, "loaded": runner.loaded, "note": runner.cache_note,
                      "events": [[e.phase, e.graph, e.cache, e.loaded, e.note] for e in events],
                      "tokens": tokens, "folder": str(runner.cache_dir)}))


if __name__ == "__main__":
    main(sys.argv[1])
