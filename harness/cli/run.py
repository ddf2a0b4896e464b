"""``draftbench run``: methods over suites into a new run directory (or ``--resume RUN_DIR``), then the report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from harness.cli.report import add_paths_flag, print_report
from harness.run.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_preset_dict,
    parse_assignment,
    preset_names,
)
from harness.run.sweep import add_cli_sweeps

RUN_FLAGS = {  # flag -> (config field, how to parse the text)
    "target": ("target", str), "dtype": ("dtype", str), "device": ("device", str),
    "device_map": ("device_map", str), "limit": ("limit", int), "max_new_tokens": ("max_new_tokens", int),
    "top_p": ("top_p", float), "top_k": ("top_k", int), "repeats": ("repeats", int), "warmup": ("warmup", int),
    "output_dir": ("output_dir", str), "data_dir": ("data_dir", str), "threads": ("threads", int),
    "attn_implementation": ("attn_implementation", str), "profile": ("profile", str), "engine": ("engine", str),
    "compile_weights": ("compile_weights", str),
}


# the only run flags that may accompany --resume: they change neither what is measured nor how
RESUME_FLAGS = ("no_progress", "no_report", "paths")


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench run``."""
    r = sub.add_parser("run", help="run methods over suites and write records, tables and plots")
    r.add_argument("--preset", "--config", dest="preset",
                   help=f"built-in preset ({', '.join(preset_names())}) or a YAML file")
    r.add_argument("--methods", type=_csv(str), help="comma-separated method names (default options)")
    r.add_argument("--suites", type=_csv(str), help="comma-separated suite names or paths to .jsonl files")
    r.add_argument("--questions", type=_csv(str), help="comma-separated question ids")
    r.add_argument("--temperature", "--temperatures", dest="temperatures", type=_csv(float))
    r.add_argument("--seeds", type=_csv(int))
    r.add_argument("--runtime", type=_csv(str), metavar="eager|compiled|eager,compiled",
                   help="how the target's forward runs: eager (default), compiled (torch.compile), or both side by "
                        "side (every method once per runtime; compiled labels end in @compiled)")
    r.add_argument("--ablate", type=_csv(str), metavar="OPTION,...",
                   help="method options that get ablation tables and plots (besides those of a sweep)")
    for flag, (_, kind) in RUN_FLAGS.items():
        r.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind)
    r.add_argument("--server-url", metavar="URL",
                   help="measure a running OpenAI-compatible server (vLLM, SGLang, trtllm-serve, llama-server): "
                        "engine_options server_url, and engine openai unless --engine says otherwise")
    r.add_argument("--concurrency", type=_csv(int), metavar="C1,C2,...",
                   help="load levels on a served engine (load.concurrency, harness.run.load): at most C requests in "
                        "flight per level, as vllm bench serve's --max-concurrency")
    r.add_argument("--request-rate", type=lambda t: t if t == "inf" else float(t), metavar="RATE|inf",
                   help="load levels: requests per second (load.request_rate; default inf, all at once)")
    r.add_argument("--burstiness", type=float, help="load levels: gamma shape of the arrivals (1.0: Poisson)")
    r.add_argument("--num-prompts", type=int, help="load levels: requests per level (default 2 x concurrency)")
    r.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="any run field, YAML value")
    r.add_argument("--opt", action="append", default=[], metavar="LABEL.OPTION=VALUE", help="a method option")
    r.add_argument("--sweep", action="append", default=[], metavar="LABEL.OPTION=V1,V2", help="a grid of option values")
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted run: its configuration comes from RUN_DIR/manifest.json, so only "
                        f"{' and '.join('--' + f.replace('_', '-') for f in RESUME_FLAGS)} may be given with it")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--no-report", action="store_true", help="do not build tables and plots at the end")
    add_paths_flag(r)
    r.set_defaults(func=cmd_run)


def config_from_args(args) -> RunConfig:
    data = load_preset_dict(args.preset) if args.preset else {}
    for flag, (field, _) in RUN_FLAGS.items():
        if getattr(args, flag) is not None:
            data[field] = getattr(args, flag)
    for field in ("suites", "questions", "temperatures", "seeds", "runtime", "ablate"):
        if getattr(args, field) is not None:
            data[field] = getattr(args, field)
    if args.methods is not None:
        data["methods"] = [{"name": m} for m in args.methods]
    load = {k: getattr(args, k) for k in ("concurrency", "request_rate", "burstiness", "num_prompts")
            if getattr(args, k) is not None}
    if load:
        data["load"] = {**(data.get("load") or {}), **load}
    for item in args.set:
        key, value = parse_assignment(item)
        data[key] = value
    if args.server_url is not None:
        data["engine_options"] = {**(data.get("engine_options") or {}), "server_url": args.server_url}
        if args.engine is None:
            data["engine"] = "openai"
    cfg = config_from_dict(add_cli_sweeps(data, args.sweep))
    for item in args.opt:
        key, value = parse_assignment(item)
        label, _, option = key.partition(".")
        specs = [m for m in cfg.methods if m.label == label]
        if not specs or not option:
            raise ConfigError(f"--opt {item!r}: expected LABEL.OPTION=VALUE with LABEL one of "
                              f"{[m.label for m in cfg.methods]}")
        specs[0].options[option] = value
    return cfg


def _flags_given(args, allowed: tuple[str, ...]) -> list[str]:
    """The run flags given on the command line (values other than their defaults), except ``resume`` and
    ``allowed``. Example: ``run --resume R --limit 3 --no-report`` -> ["--limit"]."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    defaults = vars(parser.parse_args(["run"]))
    skip = {"command", "resume", *allowed}
    return [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k not in skip and v != defaults.get(k)]


def cmd_run(args) -> int:
    from harness.run.runner import RunInterrupted, run

    if args.resume:
        extra = _flags_given(args, RESUME_FLAGS)
        if extra:
            ok = ", ".join("--" + f.replace("_", "-") for f in RESUME_FLAGS)
            raise ConfigError(f"--resume continues a run with the configuration in its manifest; {', '.join(extra)} "
                              f"cannot be given with it (only {ok})")
    config = None if args.resume else config_from_args(args)
    try:
        run_dir = run(config, resume=args.resume, progress=not args.no_progress)
    except RunInterrupted as e:
        if os.environ.get("RANK", "0") == "0":
            if e.run_dir is None:
                print("draftbench: interrupted before the run started; nothing was recorded", file=sys.stderr)
            else:
                print(f"draftbench: interrupted; the records so far are kept in {e.run_dir}; resume with: "
                      f"draftbench run --resume {shlex.quote(str(e.run_dir))}", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") != "0":  # data-parallel run: rank 0 reports
        return 0
    if args.no_report:
        print(f"run:  {run_dir}")
    else:
        try:
            print_report(run_dir, paths=args.paths)
        except KeyboardInterrupt:  # every report file is replaced whole, so none is left half-written
            print(f"draftbench: interrupted while writing the report; the run's records are complete; finish the "
                  f"report with: draftbench report {shlex.quote(str(run_dir))}", file=sys.stderr)
            return 130
        except OSError as e:  # a full disk: the records are complete, only the report is missing
            print(f"draftbench: error: {e}; the run's records are complete; finish the report with: draftbench "
                  f"report {shlex.quote(str(run_dir))}", file=sys.stderr)
            return 2
    return failed_entries_exit(run_dir)


def failed_entries_exit(run_dir: Path) -> int:
    """1, with one line per entry, when some entry of the run has no successful turn (it measured nothing; for a
    run of load levels, no successful request in their latest attempts); else 0."""
    from harness.measure.records import failed_entries, read_records
    from harness.report.load import latest_levels, read_load_rows

    load_rows = [r for level in latest_levels(read_load_rows(run_dir)).values() for r in level]  # a load run's
    failed = failed_entries(read_records(run_dir) + load_rows)
    for label, error in failed.items():
        print(f"draftbench: error: every turn of {label!r} failed (first: {error}); see {run_dir}", file=sys.stderr)
    return 1 if failed else 0
