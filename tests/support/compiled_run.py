"""One process's compiled greedy turns on the tiny target, for the compile-cache tests (tests/test_compilecache.py,
tests/test_gpu.py): ``python -m tests.support.compiled_run FLAVOUR [DEVICE]`` (dynamic | static; cpu | cuda) runs
vanilla then pld through one compiled runner (cache folder under $DRAFTBENCH_CACHE) and prints one JSON line: the
graphs, how many were loaded from the cache, the cache note, every compile event and the tokens. A fresh process
each time (:func:`run_in_process`): inductor also keeps graphs in memory, which would hide what the disk holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PROMPT = [[40, 41, 42, 43, 40, 41, 42, 43, 40, 41]]


def run_in_process(cache: Path, flavour: str = "static", device: str = "cpu") -> dict:
    """This module's JSON line from a fresh Python process with ``$DRAFTBENCH_CACHE`` = ``cache``."""
    env = {**os.environ, "DRAFTBENCH_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.support.compiled_run", flavour, device], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(flavour: str, device: str = "cpu") -> None:
    from harness.engine.runtime import CompiledRunner
    from harness.models import target_from_model
    from tests.support.helpers import GREEDY, build_example, char_tokenizer, tiny_llama

    torch.set_num_threads(1)
    target = target_from_model(tiny_llama().to(device), char_tokenizer(), name="tiny-llama")
    target.eos_ids = frozenset()  # turns run to the budget
    runner = target.runners["compiled"] = CompiledRunner(target, static=flavour == "static")
    events: list = []
    runner.on_compile = events.append
    tokens = {}
    for name in ("vanilla", "pld"):
        method = build_example(name, target)
        method.runtime = "compiled"
        tokens[name] = method.generate(torch.tensor(PROMPT, device=device), 16, GREEDY).token_ids
    print(json.dumps({"graphs": runner.graphs, "loaded": runner.loaded, "note": runner.cache_note,
                      "cudagraphs": runner.cudagraphs, "events": [[e.phase, e.graph, e.cache, e.loaded, e.note]
                                                                  for e in events],
                      "tokens": tokens, "folder": str(runner.cache_dir)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
