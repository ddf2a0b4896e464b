"""``draftbench compare BASE NEW``: two runs or baselines compared cell by cell (:mod:`harness.gate.compare`);
exit 0 pass, 1 regression, 2 error."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.gate import compare as compare_module
from harness.gate.baseline import load_side
from harness.gate.compare import Thresholds, compare_sides
from harness.gate.formats import FORMATS, write_html


def cmd_compare(args) -> int:
    th = Thresholds(tau_rtol=args.tau_rtol, speed_tol=args.speed_tol, gate_speed=not args.no_speed,
                    tps_tol=args.tps_tol, quality_tol=args.quality_tol, gate_outputs=not args.no_outputs,
                    n_boot=args.n_boot, seed=args.seed, acceptance_rtol=args.acceptance_rtol,
                    fit=not args.no_fit, allow_invalid=args.allow_invalid)
    base = load_side(args.base, n_boot=th.n_boot, seed=th.seed)
    new = load_side(args.new, n_boot=th.n_boot, seed=th.seed)
    cmp = compare_sides(base, new, th, args.labels, allow_mismatch=args.allow_mismatch)
    print(FORMATS[args.format](cmp), end="")
    for path, fmt in ((args.markdown_out, "markdown"), (args.json_out, "json")):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(FORMATS[fmt](cmp), encoding="utf-8")
    if args.html_out:
        Path(args.html_out).parent.mkdir(parents=True, exist_ok=True)
        write_html(cmp, args.html_out)
    return cmp.exit_code


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench compare BASE NEW``: exit 0 pass, 1 regression, 2 error."""
    c = sub.add_parser("compare", help="compare two runs or baselines; exit 0 pass, 1 regression, 2 error",
                       description=compare_module.__doc__.split("\n\n")[0],
                       epilog="BASE and NEW: run directories (results/<run_id>) or baseline directories "
                              "(results/baselines/<device>/<preset>). The rules: `harness/gate/compare.py`.")
    c.add_argument("base")
    c.add_argument("new")
    c.add_argument("--tau-rtol", type=float, default=0.01, help="allowed relative drop of τ (default %(default)s)")
    c.add_argument("--speed-tol", type=float, default=0.05,
                   help="fail when the Δ speed-up CI's upper end is below 1 − this (default %(default)s)")
    c.add_argument("--no-speed", action="store_true", help="do not gate speed-ups (e.g. CI machines differ)")
    c.add_argument("--tps-tol", type=float, default=None,
                   help="also gate absolute tokens/s with this tolerance (dedicated runners only; default off)")
    c.add_argument("--quality-tol", type=float, default=0.0,
                   help="allowed drop of the mean quality score (default %(default)s)")
    c.add_argument("--no-outputs", action="store_true", help="do not gate changed greedy outputs")
    c.add_argument("--acceptance-rtol", type=float, default=None, metavar="R",
                   help="where exact gating does not apply (other device or dtype, T > 0, engines): τ within ±R and "
                        "acc@i >= BASE's × (1 − R) instead of the τ rule (default: engines 0.05, others the τ rule)")
    c.add_argument("--no-fit", action="store_true",
                   help="ignore a baseline's repeats: the fixed tolerances, as for a baseline without repeats")
    c.add_argument("--allow-invalid", action="store_true",
                   help="gate speed even on a side that failed a validity check (harness.measure.validity); "
                        "refused otherwise")
    c.add_argument("--allow-mismatch", action="store_true",
                   help="compare sides of different targets or dtypes (an error otherwise), with a warning")
    c.add_argument("--labels", type=lambda t: [x for x in t.split(",") if x],
                   help="only these labels (comma-separated)")
    c.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default %(default)s)")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed (default %(default)s)")
    c.add_argument("--format", choices=sorted(FORMATS), default="table", help="stdout format (default table)")
    c.add_argument("--markdown-out", metavar="PATH", help="also write the Markdown report to PATH")
    c.add_argument("--json-out", metavar="PATH", help="also write the JSON report to PATH")
    c.add_argument("--html-out", metavar="PATH", help="also write a self-contained HTML page to PATH")
    c.set_defaults(func=cmd_compare)
