"""``draftbench list``: the methods (with their options' defaults), suites, presets, runtimes and embedded
targets."""

from __future__ import annotations

import argparse
import sys

from harness.run import suites
from harness.run.config import preset_names


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench list``."""
    sub.add_parser("list", help="list methods, suites and presets").set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    import dataclasses

    from harness.registry import get_method, method_names

    print("methods:")
    for name in method_names():
        cls = get_method(name)
        opts = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Options)
                         if f.default is not dataclasses.MISSING)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        print(f"  {name:<17}{doc[0] if doc else ''}")
        if opts:
            print(f"  {'':<17}options: {opts}")
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
