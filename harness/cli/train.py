"""``draftbench train OBJECTIVE``: one draft head trained on a feature dataset (:mod:`harness.train.loop`), also
runnable as ``python -m harness.train <objective> ...`` under ``accelerate launch`` (:func:`main`);
``draftbench train scale OBJECTIVE --tokens 30k,100k,...``: the data-scaling curve (:mod:`harness.train.scaling`);
``draftbench train eval OBJECTIVE --head PATH``: a saved head's held-out accuracy (:mod:`harness.train.evaluate`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from harness.models import DEFAULT_TARGET, load_target
from harness.train.evaluate import BOOTSTRAP_RESAMPLES
from harness.train.loop import TrainConfig, train
from harness.train.objectives import objective_names


def _assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"--option expects KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``draftbench train {objective}`` (choices from the objective registry)."""
    p = subparsers.add_parser("train", help="train a draft head on a feature dataset (see `data build`)")
    p.add_argument("objective", choices=[*objective_names(), "scale", "eval"],
                   help="an objective, `scale OBJECTIVE` for the data-scaling curve, or `eval OBJECTIVE --head PATH` "
                        "to score a saved head on the data's held-out split")
    p.add_argument("scale_objective", nargs="?", metavar="OBJECTIVE",
                   help="(after `scale` or `eval`) the objective to scale or to evaluate with")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--data", required=True, help="feature dataset folder (from `draftbench data build`)")
    p.add_argument("--out", help="output folder (default: train-runs/<objective>-<target>); with eval: a .csv file")
    p.add_argument("--head", action="append", default=[],
                   help="(eval) a head folder in the objective's published format or a checkpoints/step-N; give it "
                        "again to compare heads (each against the first, paired bootstrap CI)")
    p.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES, metavar="N",
                   help="(eval) resamples of the paired bootstrap over held-out conversations (default %(default)s)")
    for flag, kind in (("lr", float), ("weight-decay", float), ("epochs", int), ("max-steps", int),
                       ("batch-size", int), ("grad-accum", int), ("warmup-steps", int), ("warmup-ratio", float),
                       ("eval-every", int), ("save-every", int), ("eval-positions", int), ("max-len", int),
                       ("seed", int), ("log-every", int), ("max-shards", int), ("eval-fraction", float),
                       ("train-conversations", int)):
        p.add_argument("--" + flag, type=kind)
    p.add_argument("--noise", help="eagle (published), none, or a fixed scale")
    p.add_argument("--mixed-precision", choices=["auto", "no", "bf16", "fp16"])
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is present")
    p.add_argument("--no-resume", action="store_true", help="fail instead of continuing a run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="objective option")
    p.add_argument("--sweep", action="append", default=[], metavar="OPTION=V1,V2",
                   help="train one head per value into OUT/OPTION=VALUE/ (harness.train.sweep)")
    p.add_argument("--tokens", metavar="N1,N2,...", help="(scale) training sizes in tokens, e.g. 30k,100k,300k,1M")
    p.add_argument("--tau", action="store_true", help="(scale) also measure τ of every point's head (harness runner)")
    p.add_argument("--tau-questions", type=int, default=8, help="(scale, --tau) first N questions (default 8)")
    p.add_argument("--tau-max-new-tokens", type=int, default=64, help="(scale, --tau) per turn (default 64)")
    p.add_argument("--tau-suite", default="mt_bench", help="(scale, --tau) suite name or file (default mt_bench)")
    p.add_argument("--tau-method", help="(scale, --tau) method that runs the head (default: the objective's name)")
    p.add_argument("--tau-option", action="append", default=[], metavar="KEY=VALUE",
                   help="(scale, --tau) method option")
    p.set_defaults(func=cmd_train)


def config_from_args(args) -> TrainConfig:
    values: dict[str, Any] = {}
    for name in ("lr", "weight_decay", "epochs", "max_steps", "batch_size", "grad_accum", "warmup_steps",
                 "warmup_ratio", "eval_every", "save_every", "eval_positions", "max_len", "seed", "log_every",
                 "max_shards", "eval_fraction", "train_conversations", "mixed_precision"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if args.noise is not None:
        values["noise"] = args.noise if args.noise in ("eagle", "none") else float(args.noise)
    return TrainConfig(**values, cpu=args.cpu, resume=not args.no_resume, progress=not args.no_progress,
                       options=dict(_assignment(o) for o in args.option))


def cmd_train(args) -> int:
    if args.objective == "eval":
        return _train_eval(args)
    if args.objective == "scale" or args.scale_objective is not None:
        return _train_scale(args)
    cfg = config_from_args(args)
    device = "cpu" if cfg.cpu or not torch.cuda.is_available() else f"cuda:{_local_rank()}"
    target = load_target(args.target, dtype="float32", device=device)
    out = args.out or str(Path("train-runs") / f"{args.objective}-{Path(args.target).name}")
    if args.sweep:
        return _train_sweep(args, target, out, cfg)
    recipe = train(args.objective, target, args.data, out, cfg)
    if _local_rank() == 0:
        print(f"{out}: {recipe['steps']} steps in {recipe['wall_time_s']:.1f} s; held-out {recipe['final_eval']}")
    return 0


def _train_sweep(args, target, out: str, cfg: TrainConfig) -> int:
    from harness.train.sweep import parse_grid, train_sweep

    argv = sys.argv[1:]
    argv = argv[argv.index("train") + 1:] if "train" in argv else argv
    rows = train_sweep(args.objective, target, args.data, out, cfg, parse_grid(args.sweep), argv)
    for row in rows:
        print(f"{Path(out) / row['folder']}: {row['steps']} steps in {row['wall_time_s']:.1f} s; "
              f"held-out {row['final_eval']}")
    return 0


def _train_eval(args) -> int:
    from harness.train.evaluate import check_request, eval_heads, show

    if not args.scale_objective or not args.head:
        raise ValueError("train eval needs an objective and --head PATH (and --data FEATS)")
    check_request(args.scale_objective, args.head, args.out, args.bootstrap)  # bad input fails before the target loads
    cfg = config_from_args(args)
    target = load_target(args.target, dtype="float32", device="cpu" if cfg.cpu or not torch.cuda.is_available()
                         else "cuda")
    doc = eval_heads(args.scale_objective, target, args.head, args.data, cfg, cfg.options, args.out,
                     n_boot=args.bootstrap)
    print(show(doc))
    if args.out:
        print(f"{args.out}, {Path(args.out).with_suffix('.json')}")
    return 0


def _train_scale(args) -> int:
    from harness.train.scaling import TauSpec, parse_tokens, plan, train_scale

    if args.objective != "scale":
        raise ValueError(f"train {args.objective}: unexpected argument {args.scale_objective!r} "
                         "(the scaling curve is `draftbench train scale OBJECTIVE --tokens ...`)")
    if not args.scale_objective or not args.tokens or not args.out:
        raise ValueError("train scale needs an objective, --tokens N1,N2,... and --out DIR")
    if args.sweep:
        raise ValueError("train scale: --sweep cannot be combined with the scaling curve; scale one recipe at a time")
    sizes = parse_tokens(args.tokens)
    tau = TauSpec(args.tau_questions, args.tau_max_new_tokens, args.tau_suite, args.tau_method,
                  dict(_assignment(o) for o in args.tau_option)) if args.tau else None
    cfg = config_from_args(args)
    argv = sys.argv[1:]
    argv = argv[argv.index("train") + 1:] if "train" in argv else argv
    plan(args.scale_objective, args.data, args.out, cfg, sizes, argv, tau)  # bad input fails before the target loads
    target = load_target(args.target, dtype="float32", device="cpu" if cfg.cpu or not torch.cuda.is_available()
                         else "cuda")
    rows = train_scale(args.scale_objective, target, args.data, args.out, cfg, sizes, argv, tau)
    for r in rows:
        if r["position"] == 1 and r["objective"] == args.scale_objective:
            tau_text = f", τ {r['tau']:.2f}" if r["tau"] is not None else ""
            print(f"{args.scale_objective} {r['point']}: {r['train_tokens']} tokens, {r['steps']} steps, held-out "
                  f"acc@1 {r['acc']}{tau_text}")
    print(f"{Path(args.out) / 'scaling.csv'}, {Path(args.out) / 'scaling.png'}")
    return 0


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.train.loop <objective> ...`` (e.g. under ``accelerate launch``): the ``train`` subcommand."""
    parser = argparse.ArgumentParser(prog="harness.train.loop")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
