"""``draftbench baseline save RUN | device``: the small committed baselines that ``draftbench compare`` reads
(:mod:`harness.gate.baseline`)."""

from __future__ import annotations

import argparse
import sys

from harness.gate.baseline import BASELINE_FILE, BASELINES_ROOT, Side, current_device_slug, save_baseline
from harness.measure.noise import MIN_FIT_REPEATS


def repeats_line(n: int) -> str:
    """What ``compare`` will do with a baseline of ``n`` repeats per cell. Example: 6 -> "repeats: 6 per cell:
    compare fits each tolerance on their spread"."""
    if n >= MIN_FIT_REPEATS:
        return f"repeats: {n} per cell: compare fits each tolerance on their spread"
    return (f"repeats: {max(n, 1)} per cell: compare keeps the fixed default tolerances (a calibrated baseline comes "
            f"from a run of --repeats {MIN_FIT_REPEATS} or more)")


def cmd_baseline(args) -> int:
    if args.baseline_command == "save":
        out = save_baseline(args.run_dir, args.out, args.preset, args.root, args.force, args.allow_partial)
        print(f"baseline: {out / BASELINE_FILE}")
        print(repeats_line(Side.from_baseline(out).n_repeats))
        return 0
    print(current_device_slug(args.device))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench baseline save RUN`` and ``draftbench baseline device``."""
    b = sub.add_parser("baseline", help="committed baselines for `draftbench compare`")
    bsub = b.add_subparsers(dest="baseline_command", required=True)
    s = bsub.add_parser("save", help="write the small committed baseline of a run "
                                     "(results/baselines/<device>/<preset>/baseline.json)")
    s.add_argument("run_dir")
    s.add_argument("--preset", help="baseline name (default: the preset named in the run's command)")
    s.add_argument("--out", help="baseline folder (default: ROOT/<device slug>/<preset>)")
    s.add_argument("--root", default=str(BASELINES_ROOT), help="default: %(default)s")
    s.add_argument("--force", action="store_true", help="replace an existing baseline (refresh)")
    s.add_argument("--allow-partial", action="store_true",
                   help="save the baseline of a run that did not finish (questions missing); refused otherwise")
    d = bsub.add_parser("device", help="print this machine's device slug (the baseline folder name)")
    d.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:1")
    b.set_defaults(func=_run_baseline)


def _run_baseline(args) -> int:
    try:
        return cmd_baseline(args)
    except FileExistsError as e:
        print(f"draftbench: error: {e}", file=sys.stderr)
        return 2
