"""``draftbench`` command line: run, report, list, data, train."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from pathlib import Path

from harness.measure.baseline import add_baseline_cli
from harness.measure.compare import add_compare_cli
from harness.run import suites
from harness.run.config import (
    ConfigError,
    config_from_dict,
    load_preset_dict,
    parse_assignment,
    preset_names,
)
from harness.run.reproduce import add_reproduce_cli, cmd_report_against
from harness.run.sweep import add_cli_sweeps
from harness.schema import InputError
from harness.train.cli import add_data_cli, add_train_cli

RUN_FLAGS = {  # flag -> (config field, how to parse the text)
    "target": ("target", str), "dtype": ("dtype", str), "device": ("device", str),
    "device_map": ("device_map", str), "limit": ("limit", int), "max_new_tokens": ("max_new_tokens", int),
    "top_p": ("top_p", float), "top_k": ("top_k", int), "repeats": ("repeats", int), "warmup": ("warmup", int),
    "output_dir": ("output_dir", str), "data_dir": ("data_dir", str), "threads": ("threads", int),
    "attn_implementation": ("attn_implementation", str), "profile": ("profile", str), "engine": ("engine", str),
}


# the only run flags that may accompany --resume: they change neither what is measured nor how
RESUME_FLAGS = ("no_progress", "no_report")


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="draftbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

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
    for flag, (_, kind) in RUN_FLAGS.items():
        r.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind)
    r.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="any run field, YAML value")
    r.add_argument("--opt", action="append", default=[], metavar="LABEL.OPTION=VALUE", help="a method option")
    r.add_argument("--sweep", action="append", default=[], metavar="LABEL.OPTION=V1,V2", help="a grid of option values")
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted run: its configuration comes from RUN_DIR/manifest.json, so only "
                        f"{' and '.join('--' + f.replace('_', '-') for f in RESUME_FLAGS)} may be given with it")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--no-report", action="store_true", help="do not build tables and plots at the end")

    rep = sub.add_parser("report", help="rebuild tables and plots of a run from its records")
    rep.add_argument("run_dir")

    sub.add_parser("list", help="list methods, suites and presets")

    data = sub.add_parser("data", help="evaluation data and training features")
    dsub = data.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download evaluation suites from their public sources (needs internet)")
    f.add_argument("suites", nargs="*", help="suite names (default: all)")
    f.add_argument("--data-dir", help="default: $DRAFTBENCH_DATA")
    f.add_argument("--if-missing", action="store_true", help="only fetch suites whose file is absent")
    add_data_cli(dsub)
    add_train_cli(sub)
    add_reproduce_cli(sub)
    add_compare_cli(sub)
    add_baseline_cli(sub)
    return p


def config_from_args(args) -> RunConfig:  # noqa: F821
    data = load_preset_dict(args.preset) if args.preset else {}
    for flag, (field, _) in RUN_FLAGS.items():
        if getattr(args, flag) is not None:
            data[field] = getattr(args, flag)
    for field in ("suites", "questions", "temperatures", "seeds", "runtime"):
        if getattr(args, field) is not None:
            data[field] = getattr(args, field)
    if args.methods is not None:
        data["methods"] = [{"name": m} for m in args.methods]
    for item in args.set:
        key, value = parse_assignment(item)
        data[key] = value
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
    defaults = vars(build_parser().parse_args(["run"]))
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
    print(f"run:  {run_dir}")
    if not args.no_report:
        _print_report(run_dir)
    return _failed_entries_exit(run_dir)


def _failed_entries_exit(run_dir: Path) -> int:
    """1, with one line per entry, when some entry of the run has no successful turn (it measured nothing); else 0."""
    from harness.measure.records import failed_entries, read_records

    failed = failed_entries(read_records(run_dir))
    for label, error in failed.items():
        print(f"draftbench: error: every turn of {label!r} failed (first: {error}); see {run_dir}", file=sys.stderr)
    return 1 if failed else 0


def _print_report(run_dir: Path) -> None:
    from harness.measure.report import write_report

    paths = write_report(run_dir)
    summary_md = paths.get("summary_md")
    if summary_md and Path(summary_md).exists():
        print(Path(summary_md).read_text())
    for name, path in sorted(paths.items()):
        print(f"{name + ':':<22}{path}")


def cmd_list(args) -> int:
    import dataclasses

    from harness.registry import get_method, method_names

    print("methods:")
    for name in method_names():
        cls = get_method(name)
        opts = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Options)
                         if f.default is not dataclasses.MISSING)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        print(f"  {name:<14}{doc[0] if doc else ''}")
        if opts:
            print(f"  {'':<14}options: {opts}")
    print("suites:")
    for name in suites.suite_names():
        info = suites.suite_info(name)
        print(f"  {name:<14}{info.get('records', '?'):>4} questions  scorer={info.get('scorer')}  "
              f"{info.get('description', '')}")
    print("presets:\n  " + ", ".join(preset_names()))
    print("runtimes (--runtime, or a method entry's runtime):\n  eager (default): the model as loaded; compiled: "
          "its forward through torch.compile (harness/engine/runtime.py)")
    from harness.models import EMBEDDED_TARGETS

    print("embedded targets:")
    for alias, (_, what) in EMBEDDED_TARGETS.items():
        print(f"  {alias:<14}{what}")
    return 0


def cmd_data(args) -> int:
    if args.data_command == "fetch":
        data_dir = args.data_dir or os.environ.get("DRAFTBENCH_DATA")
        if not data_dir:
            raise ConfigError("data fetch: set --data-dir or $DRAFTBENCH_DATA")
        for name in args.suites or suites.suite_names():
            info = suites.suite_info(name)
            path = suites.suite_path(info, data_dir)
            if info.get("bundled") or (args.if_missing and path.exists()):
                print(f"{name}: {path} (present)")
                continue
            print(f"{name}: {suites.fetch_suite(name, data_dir)}")
        return 0
    return args.func(args)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each: ``draftbench: warning: <message>``."""
    print(f"draftbench: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _dispatch(args)


def _dispatch(args) -> int:
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "report":
            _print_report(Path(args.run_dir))
            return cmd_report_against(args) if getattr(args, "against", None) else 0
        if args.command == "list":
            return cmd_list(args)
        if args.command == "data":
            return cmd_data(args)
        return args.func(args)
    # InputError (harness.schema): every bad option, configuration, table or suite; the other ValueErrors, KeyErrors
    # (unknown names) and OSErrors (FileNotFoundError, PermissionError) are printed as one line too
    except (InputError, KeyError, ValueError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"draftbench: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
