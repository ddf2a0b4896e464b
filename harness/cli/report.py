"""``draftbench report RUN_DIR [--against TABLE]``: rebuild a run's tables and plots from its records, and put them
next to a published table."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench report``."""
    rep = sub.add_parser("report", help="rebuild tables and plots of a run from its records")
    rep.add_argument("run_dir")
    rep.add_argument("--against", metavar="TABLE", help="compare the run with a published table")
    rep.add_argument("--model-dir", action="append", default=[], metavar="ID=FOLDER|FILE",
                     help="with --against: which table target a local model folder stands for")
    rep.set_defaults(func=cmd_report)


def print_report(run_dir: Path) -> None:
    """Write the run's report (:func:`harness.measure.report.write_report`), print its summary and its files."""
    from harness.measure.report import write_report

    paths = write_report(run_dir)
    summary_md = paths.get("summary_md")
    if summary_md and Path(summary_md).exists():
        print(Path(summary_md).read_text())
    for name, path in sorted(paths.items()):
        print(f"{name + ':':<22}{path}")


def cmd_report(args) -> int:
    print_report(Path(args.run_dir))
    return cmd_report_against(args) if args.against else 0


def cmd_report_against(args) -> int:
    """The ``--against TABLE`` part of ``draftbench report RUN``: print the comparison and where it was written."""
    from harness.published.against import compare_run
    from harness.published.reproduce import parse_model_dir
    from harness.published.tables import load_table

    table = load_table(args.against)
    res = compare_run(Path(args.run_dir), table, model_dir=parse_model_dir(args.model_dir))
    print(res["markdown"])
    for name, path in sorted(res["paths"].items()):
        print(f"{name + ':':<22}{path}")
    return 0
