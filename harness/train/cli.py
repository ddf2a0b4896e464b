"""The training commands: ``draftbench data build | merge | vocab`` (feature datasets) and ``draftbench train``
(one head with an objective), also runnable as ``python -m harness.train <objective> ...`` under
``accelerate launch``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from harness.models import DEFAULT_TARGET, load_target
from harness.train.datastore import add_datastore_cli
from harness.train.features import (
    build_dataset,
    dataset_token_counts,
    merge_datasets,
    read_manifest,
)
from harness.train.loop import TrainConfig, train
from harness.train.objectives import objective_names
from harness.train.sources import SOURCES


def add_data_cli(subparsers) -> None:
    """Add ``build``, ``merge``, ``vocab`` and ``datastore`` (``draftbench data ...``) to the ``data`` subcommand's
    subparsers."""
    p = subparsers.add_parser("build", help="render training conversations and store the target's features")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"embedded alias, HF id or folder (default {DEFAULT_TARGET})")
    p.add_argument("--source", dest="sources", action="append", metavar="SOURCE",
                   help=f"{', '.join(SOURCES)} or a ShareGPT-format .json file; repeat for several (default: sharegpt)")
    p.add_argument("--out", required=True, help="output directory (an interrupted build resumes in place)")
    p.add_argument("--max-len", type=int, default=2048, help="tokens kept per conversation (default 2048)")
    p.add_argument("--limit", type=int, help="at most this many conversations per source")
    p.add_argument("--self-distill", action="store_true", help="regenerate assistant turns with the target (greedy)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="per regenerated turn (with --self-distill)")
    p.add_argument("--distill-batch", type=int, default=16, help="prompts generated together (with --self-distill)")
    p.add_argument("--shard-size", type=int, default=256, help="conversations per shard file")
    p.add_argument("--layers", help="also store these hidden-state levels, e.g. low,mid,high (what `train eagle3` "
                                    "reads: the inputs of layers 2, L/2, L-3) or indices 2,15,27")
    p.add_argument("--fail-on-contamination", action="store_true",
                   help="fail listing overlaps with evaluation questions instead of dropping them")
    p.add_argument("--data-dir", help="evaluation data and GSM8K train split (default: $DRAFTBENCH_DATA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="target dtype for the forwards (features are stored as fp16)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_build)

    mg = subparsers.add_parser("merge", help="combine feature datasets of the same target (links, no copies)")
    mg.add_argument("sources", nargs="+", help="dataset folders (an interrupted build gives its finished shards)")
    mg.add_argument("--out", required=True, help="new folder")
    mg.set_defaults(func=lambda args: _print_merge(merge_datasets(args.sources, args.out), args.out))

    v = subparsers.add_parser("vocab", help="write a head's token frequencies (for the methods' draft_vocab option)")
    v.add_argument("--data", required=True, help="feature dataset the head was trained on")
    v.add_argument("--out", required=True, help="head folder; token_counts.safetensors is written there")
    v.add_argument("--max-shards", type=int, help="count the first N shards only")
    v.set_defaults(func=cmd_vocab)
    add_datastore_cli(subparsers)


def _print_merge(m: dict, out: str) -> int:
    print(f"{out}: {m['count']} conversations, {m['tokens']} tokens in {len(m['shards'])} shards from "
          f"{len(m['sources'])} datasets")
    return 0


def cmd_vocab(args) -> int:
    from harness.engine.draftvocab import save_counts

    manifest = read_manifest(args.data, args.max_shards)
    config = Path(args.out, "config.json")
    vocab = json.loads(config.read_text()).get("vocab_size") if config.is_file() else None
    if not isinstance(vocab, int):
        raise ValueError(f"{args.out}: no config.json with vocab_size (an EAGLE or Jakiro head folder)")
    counts = dataset_token_counts(args.data, vocab, args.max_shards)
    path = save_counts(counts, args.out)
    print(f"{path}: {int(counts.sum())} loss tokens of {manifest['count']} conversations, "
          f"{int((counts > 0).sum())} distinct ids")
    return 0


def cmd_build(args) -> int:
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    m = build_dataset(target, args.sources or ["sharegpt"], args.out, max_len=args.max_len, limit=args.limit,
                      self_distill=args.self_distill, max_new_tokens=args.max_new_tokens, shard_size=args.shard_size,
                      drop_contaminated=not args.fail_on_contamination, data_dir=args.data_dir,
                      progress=not args.no_progress, distill_batch=args.distill_batch, layers=args.layers)
    print(f"{args.out}: {m['count']} conversations, {m['tokens']} tokens in {len(m['shards'])} shard(s); "
          f"{m['contaminated_dropped']} dropped as contaminated")
    return 0


def _assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"--option expects KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def add_train_cli(subparsers) -> None:
    """Add ``train {objective}`` (choices from the objective registry) to the top-level subparsers."""
    p = subparsers.add_parser("train", help="train a draft head on a feature dataset (see `data build`)")
    p.add_argument("objective", choices=objective_names())
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--data", required=True, help="feature dataset folder (from `draftbench data build`)")
    p.add_argument("--out", help="output folder (default: train-runs/<objective>-<target>)")
    for flag, kind in (("lr", float), ("weight-decay", float), ("epochs", int), ("max-steps", int),
                       ("batch-size", int), ("grad-accum", int), ("warmup-steps", int), ("warmup-ratio", float),
                       ("eval-every", int), ("save-every", int), ("eval-positions", int), ("max-len", int),
                       ("seed", int), ("log-every", int), ("max-shards", int)):
        p.add_argument("--" + flag, type=kind)
    p.add_argument("--noise", help="eagle (published), none, or a fixed scale")
    p.add_argument("--mixed-precision", choices=["auto", "no", "bf16", "fp16"])
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is present")
    p.add_argument("--no-resume", action="store_true", help="fail instead of continuing a run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="objective option")
    p.add_argument("--sweep", action="append", default=[], metavar="OPTION=V1,V2",
                   help="train one head per value into OUT/OPTION=VALUE/ (harness.train.sweep)")
    p.set_defaults(func=cmd_train)


def config_from_args(args) -> TrainConfig:
    values: dict[str, Any] = {}
    for name in ("lr", "weight_decay", "epochs", "max_steps", "batch_size", "grad_accum", "warmup_steps",
                 "warmup_ratio", "eval_every", "save_every", "eval_positions", "max_len", "seed", "log_every",
                 "max_shards", "mixed_precision"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if args.noise is not None:
        values["noise"] = args.noise if args.noise in ("eagle", "none") else float(args.noise)
    return TrainConfig(**values, cpu=args.cpu, resume=not args.no_resume, progress=not args.no_progress,
                       options=dict(_assignment(o) for o in args.option))


def cmd_train(args) -> int:
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


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.train.loop <objective> ...`` (e.g. under ``accelerate launch``): the ``train`` subcommand."""
    import argparse

    parser = argparse.ArgumentParser(prog="harness.train.loop")
    add_train_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
