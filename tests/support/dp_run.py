"""Script for tests/test_runner.py::test_data_parallel_run: run a tiny suite under `accelerate launch`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run
from tests.support.helpers import tiny_target

out = Path(sys.argv[1])
questions = out / "q.jsonl"
cfg = RunConfig(methods=[MethodSpec("vanilla")], suites=[str(questions)], max_new_tokens=4, warmup=0,
                output_dir=str(out / "results"))
run(cfg, target=tiny_target(eos=False), progress=False)
