"""``draftbench`` command line: run, report, list, data, train, reproduce, compare, baseline, export, cache.

Every parser of the command lives in this package, a module per command (``run``, ``report``, ``list``, ``data``,
``train``, ``reproduce``, ``compare``, ``baseline``, ``export``, ``cache``): each adds its subparser
(``add_parser``) and a ``cmd_*`` function that calls the domain modules' plain functions; the one exception is a
``draftbench data`` command that a plugin registers to build its method's structure
(:func:`harness.registry.register_data_command`). Errors a user can fix print one line, ``draftbench: error: ...``,
and exit 2; Ctrl-C exits 130, and so does SIGTERM (``kill``, ``timeout``, a CI runner or job scheduler stopping the
command), which takes the same way out: servers and workers a run launched are stopped and the run is left
resumable. ``__main__``: ``python -m harness.cli``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings

from harness.cli import baseline, cache, compare, data, export, report, reproduce, run, train
from harness.cli import list as list_cmd
from harness.run.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="draftbench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for command in (run, report, list_cmd, data, train, reproduce, compare, baseline, export, cache):
        command.add_parser(sub)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each: ``draftbench: warning: <message>``."""
    print(f"draftbench: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _dispatch(args)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame) -> None:
    """SIGTERM ends a command as Ctrl-C does (a KeyboardInterrupt), so that the run's ``finally`` blocks stop the
    servers it launched instead of leaving them running."""
    raise KeyboardInterrupt


def _dispatch(args) -> int:
    try:
        return args.func(args)
    except (ConfigError, KeyError, ValueError, OSError) as e:  # FileNotFoundError, PermissionError: OSError
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"draftbench: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftbench: interrupted", file=sys.stderr)
        return 130
