"""``draftbench reproduce TABLE``: run a published table's protocol and print measured next to reported
(:mod:`harness.published.reproduce`); ``--list`` the shipped tables, ``--dry-run`` what would load. An engine table
runs in the engine it names (launched, or ``--server-url LABEL=URL`` per row and baseline; ``--engine-option``)."""

from __future__ import annotations

import argparse

from harness.published.dryrun import dry_run, engine_dry_run
from harness.published.reproduce import (
    list_tables,
    parse_model_dir,
    parse_server_urls,
    plan,
    reproduce,
    run_config,
)
from harness.published.tables import load_table, table_names
from harness.run.config import parse_assignment


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench reproduce``."""
    p = sub.add_parser("reproduce", help="run a published table's protocol and print measured next to reported")
    p.add_argument("table", nargs="?", help=f"a shipped table ({', '.join(table_names())}) or a table YAML file")
    p.add_argument("--list", action="store_true", help="list the shipped tables with their rows and cells")
    p.add_argument("--rows", type=_csv, help="comma-separated row ids (default: every runnable row)")
    p.add_argument("--limit", type=int, help="first N questions of each suite (a quick look, not the protocol)")
    p.add_argument("--model-dir", action="append", default=[], metavar="ID=FOLDER|FILE",
                   help="local copy of a target or head id (repeatable), or a YAML/JSON file mapping ids to folders")
    p.add_argument("--dry-run", action="store_true", help="list what would load, its size and memory, generations")
    p.add_argument("--dtype", help="override the table's dtype (e.g. float32 on a CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--output-dir", default="results")
    p.add_argument("--data-dir", help="default: $DRAFTBENCH_DATA")
    p.add_argument("--server-url", action="append", default=[], metavar="LABEL=URL",
                   help="an engine table: measure a running server per row id and one for the baseline (vanilla) "
                        "instead of launching them (repeatable; started with the engine options --dry-run lists)")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine table: an engine option for every server reproduce launches (repeatable; YAML "
                        "value), e.g. gpu_memory_utilization=0.45 for two vLLM servers on one GPU")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for the speed-up CI")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    if args.list or not args.table:
        print(list_tables(), end="")
        return 0
    table = load_table(args.table)
    model_dir = parse_model_dir(args.model_dir)
    server_urls = parse_server_urls(args.server_url)
    engine_options = dict(parse_assignment(item) for item in args.engine_option)
    if args.dry_run and table.engine is not None:
        print(engine_dry_run(table, args.rows, args.limit, args.data_dir), end="")
        return 0
    if args.dry_run:
        parts = plan(table, args.rows, model_dir)
        print(dry_run(table, parts, lambda part: run_config(table, part, args.limit, args.dtype, args.device,
                                                            args.output_dir, args.data_dir), model_dir), end="")
        return 0
    results = reproduce(table, args.rows, args.limit, model_dir, args.dtype, args.device, args.output_dir,
                        args.data_dir, progress=not args.no_progress, n_boot=args.n_boot, server_urls=server_urls,
                        engine_options=engine_options)
    for res in results:
        print(f"run:  {res['run_dir']}\n")
        print(res["markdown"])
        for name, path in sorted(res["paths"].items()):
            print(f"{name + ':':<22}{path}")
    return 0
