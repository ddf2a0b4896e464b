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
    rep.add_argument("--cost-per-hour", type=float, metavar="PRICE",
                     help="the machine's price per hour (any currency): the headroom table's cost per million tokens")
    add_paths_flag(rep)
    rep.set_defaults(func=cmd_report)


def add_paths_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", action="store_true",
                        help="after the table, list every file of the report (tables, plots, summary.md)")


def print_report(run_dir: Path, paths: bool = False, cost_per_hour: float | None = None) -> None:
    """Write the run's report (:func:`harness.report.report.write_report`, ``cost_per_hour``: the user's price for
    the cost per million tokens) and print its ending (:func:`report_ending`); ``paths``: then every file written,
    one per line."""
    import pandas as pd

    from harness.report.report import write_report

    written = write_report(run_dir, cost_per_hour=cost_per_hour)
    if "load_csv" in written:  # a run of load levels: its Load section
        print(Path(written["summary_md"]).read_text(encoding="utf-8").rstrip())
        print(f"\nrun:  {run_dir}")
    else:
        summary = pd.read_parquet(written["summary_parquet"])
        checks = pd.read_csv(written["validity_csv"], keep_default_na=False)
        failed = [f"FAIL {r['name']}" + (f" ({r['scope']})" if r["scope"] else "") + f": {r['detail']}"
                  for r in checks.to_dict("records") if r["status"] == "fail"]
        print(report_ending(summary, Path(run_dir), Path(written["report_html"]), failed))
    if paths:
        for name, path in sorted(written.items()):
            print(f"{name + ':':<22}{path}")


def report_ending(summary, run_dir: Path, report_html: Path, failed_checks: list[str] | None = None) -> str:
    """What a person reads at the end of a run: the paper table, the speed-ups' 95% CIs, one line on what the
    numbers mean, a line per failed validity check (``failed_checks``, :mod:`harness.measure.validity`), then the
    report page (and how to open it), the run directory and the resume command.

    Example (one entry against vanilla): the table, "95% CI of the speed-up (paired bootstrap over questions):",
    "  pld  mt_bench 1.50 [1.20, 1.80]", "speed-up = tokens/s ÷ vanilla's on the same questions; ...", "report:  RUN/
    report.html", "open it: xdg-open RUN/report.html  (or python -m webbrowser RUN/report.html)", "run:  RUN",
    "resume: draftbench run --resume RUN", "every table and plot: draftbench report RUN --paths"."""
    import shlex

    from harness.report.formatting import interval
    from harness.report.markdown import collapse_warnings, not_deployable, paper_table

    bases = list(dict.fromkeys(summary["baseline"].dropna())) if "baseline" in summary else []
    base = " / ".join(bases) or "vanilla"
    lines = [paper_table(summary, bases[0] if bases else "vanilla").rstrip(), *collapse_warnings(summary)]
    cis: dict[str, list[str]] = {}  # label -> "suite estimate [lo, hi]" per suite and temperature
    for r in summary.to_dict("records"):
        if "speedup_ci_lo" in r and r["label"] not in bases and r["speedup"] == r["speedup"]:
            mark = " ‡" if not_deployable(r.get("deployable")) else ""  # the oracle: a bound, as in the tables
            cis.setdefault(str(r["label"]) + mark, []).append(
                f"{r['suite']} {interval(r['speedup'], r['speedup_ci_lo'], r['speedup_ci_hi'])}")
    if cis:
        width = max(map(len, cis))
        lines += ["", "95% CI of the speed-up (paired bootstrap over questions):"]
        lines += [f"  {label:<{width}}  {'; '.join(parts)}" for label, parts in cis.items()]
    lines += ["", f"speed-up = tokens/s ÷ {base}'s on the same questions; τ = tokens per target forward (accepted "
                  f"drafts + 1); lossless = greedy output identical to {base}'s (†: a method that is not)."]
    measured_base = set(bases) & set(summary["label"])  # the losslessness check needs the baseline's outputs
    if measured_base and "divergent_turns" in summary and summary["divergent_turns"].notna().any():  # greedy
        differ = int(summary["divergent_turns"].fillna(0).sum())
        lines.append(f"losslessness: {differ} greedy turn(s) differ from the baseline; see report.html"
                     if differ else "losslessness: every greedy output is identical to the baseline's")
    lines += [f"validity: {line}" for line in failed_checks or []]  # harness.measure.validity: speed not gated
    run, page = shlex.quote(str(run_dir)), shlex.quote(str(report_html))
    lines += ["",
              f"report:  {report_html}",
              f"open it: xdg-open {page}   (or: python -m webbrowser {page})",
              f"run:     {run_dir}",
              f"resume:  draftbench run --resume {run}   (an interrupted run continues where it stopped)",
              f"files:   draftbench report {run} --paths   (every table and plot; the run's manifest.json says how it "
              "was made)"]
    return "\n".join(lines)


def cmd_report(args) -> int:
    print_report(Path(args.run_dir), paths=args.paths, cost_per_hour=args.cost_per_hour)
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
