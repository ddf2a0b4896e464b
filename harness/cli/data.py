"""``draftbench data fetch | build | merge | vocab | datastore | static-sam``: evaluation suites from their public
sources, the feature datasets that draft heads train on (:mod:`harness.train.features`), and the structures that
plugins build once from a corpus for their methods, through the commands they register
(:data:`harness.registry.DATA_COMMANDS`: the built-in ``datastore``, REST's datastore, and ``static-sam``,
SAM-Decoding's static automaton over it)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from harness.backends.vllm import PYTHON_ENV
from harness.models import DEFAULT_TARGET, load_target
from harness.registry import DATA_COMMANDS
from harness.run import suites
from harness.run.config import ConfigError
from harness.train.distill import GENERATORS
from harness.train.features import build_dataset, dataset_token_counts, merge_datasets, read_manifest
from harness.train.sources import SOURCES


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``draftbench data``."""
    data = sub.add_parser("data", help="evaluation data and training features")
    dsub = data.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download evaluation suites from their public sources (needs internet)")
    f.add_argument("suites", nargs="*", help="suite names (default: all)")
    f.add_argument("--data-dir", help="default: $DRAFTBENCH_DATA")
    f.add_argument("--if-missing", action="store_true", help="only fetch suites whose file is absent")
    f.set_defaults(func=cmd_fetch)
    _add_feature_parsers(dsub)


def cmd_fetch(args) -> int:
    """``draftbench data fetch``: download the evaluation suites (bundled ones are present already)."""
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


def _add_feature_parsers(subparsers) -> None:
    """``draftbench data build | merge | vocab``: feature datasets for training heads."""
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
    p.add_argument("--distill-batch", type=int, default=16,
                   help="prompts generated together (with --self-distill; vllm: its max_num_seqs)")
    p.add_argument("--generator", choices=GENERATORS, default="hf",
                   help="who generates with --self-distill: hf (model.generate, default) or vllm (vLLM's engine "
                        f"in its venv, ${PYTHON_ENV})")
    p.add_argument("--tokens", help="the generated token ids with --self-distill (default OUT/distilled); a build "
                                    "given the tokens of another (e.g. other --layers) reuses them")
    p.add_argument("--distill-part", type=int, default=128, help="conversations per token file (with --self-distill)")
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
    v.add_argument("--out", required=True, help="head folder; token_counts.json is written there")
    v.add_argument("--max-shards", type=int, help="count the first N shards only")
    v.set_defaults(func=cmd_vocab)
    for name in DATA_COMMANDS.names():  # a plugin's own commands (REST's datastore, SAM's static automaton)
        DATA_COMMANDS.get(name)(subparsers)


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
                      progress=not args.no_progress, distill_batch=args.distill_batch, layers=args.layers,
                      generator=args.generator, tokens_dir=args.tokens, part_size=args.distill_part)
    print(f"{args.out}: {m['count']} conversations, {m['tokens']} tokens in {len(m['shards'])} shard(s); "
          f"{m['contaminated_dropped']} dropped as contaminated")
    for name, stage in m.get("stages", {}).items():
        print(f"{name}: {stage['tokens']} tokens in {stage['seconds']:.1f} s = {stage['tokens_per_s'] or 0:.1f} "
              f"tokens/s{' (' + stage['dir'] + ')' if 'dir' in stage else ''}")
    return 0
