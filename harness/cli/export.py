"""``draftbench export RUN_DIR --format aiperf|vllm``: a run's per-request acceptance records in AIPerf's or vLLM's
field names (:mod:`harness.report.exports`); ``draftbench compare`` reads such a file back as BASE or NEW."""

from __future__ import annotations

import argparse

from harness.gate.baseline import export_run
from harness.report.exports import FORMATS


def cmd_export(args) -> int:
    print(f"export: {export_run(args.run_dir, args.format, args.out)}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench export RUN_DIR --format aiperf|vllm [--out PATH]``."""
    e = sub.add_parser("export", help="write a run's per-request acceptance records in AIPerf's or vLLM's fields",
                       description=__doc__.split("\n\n")[0])
    e.add_argument("run_dir")
    e.add_argument("--format", choices=FORMATS, required=True,
                   help="aiperf: SpecDecodeAcceptanceRecord; vllm: metrics.speculative_decoding")
    e.add_argument("--out", metavar="PATH", help="default: RUN_DIR/exports/<format>.jsonl")
    e.set_defaults(func=cmd_export)
