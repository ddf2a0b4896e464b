"""``draftbench data static-sam``: SAM-Decoding's static automaton (arXiv:2411.10666 Sec. 3,
:class:`methods.sam.automaton.StaticAutomaton`) over the first ``--max-tokens`` tokens of REST's datastore (whole
documents; ``draftbench data datastore``, :mod:`methods.rest.build`), saved beside it (:func:`default_static_dir`),
where the method ``sam`` looks with ``static: sharegpt``; a command this package adds to ``draftbench data``
(:func:`harness.registry.register_data_command`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.models import DEFAULT_TARGET, cache_dir
from harness.registry import register_data_command
from methods.rest.build import load_tokenizer
from methods.rest.datastore import SEPARATOR, default_datastore_dir, load_datastore, tokenizer_identity
from methods.sam.automaton import StaticAutomaton, default_static_dir

STATIC_MAX_TOKENS = 1_000_000  # about 12 s and 0.8 GB peak to build on one CPU core (docs/reference.md)


def build_static_automaton(tokenizer, name: str, datastore: str | Path | None = None, out: str | Path | None = None,
                           max_tokens: int = STATIC_MAX_TOKENS) -> tuple[Path, StaticAutomaton]:
    """Build and save the static automaton of the first whole documents, at most ``max_tokens`` tokens separators
    included, of the datastore in ``datastore`` (default: the ShareGPT one of ``tokenizer`` in the cache, which must
    have been built for this tokenizer); returns (folder, automaton)."""
    if max_tokens < 2:
        raise ValueError(f"static-sam: --max-tokens must be >= 2, got {max_tokens}")
    identity = tokenizer_identity(tokenizer, name)
    source = Path(datastore).expanduser() if datastore else default_datastore_dir(cache_dir(), identity)
    store = load_datastore(source, identity)
    ends = np.flatnonzero(np.asarray(store.tokens[:max_tokens]) == SEPARATOR)  # [D] document ends within the cap
    if ends.size == 0:
        raise ValueError(f"static-sam: the first document of {source} is longer than --max-tokens {max_tokens}")
    tokens = np.asarray(store.tokens[: int(ends[-1]) + 1])
    automaton = StaticAutomaton.build(tokens, tokenizer=identity, datastore=str(source),
                                      source=store.manifest.get("source"), documents=int(ends.size))
    folder = Path(out).expanduser() if out else default_static_dir(cache_dir(), identity)
    return automaton.save(folder), automaton


@register_data_command("static_sam")
def add_static_sam_parser(subparsers) -> None:
    """Add ``static-sam`` to the ``data`` subcommand's subparsers."""
    s = subparsers.add_parser("static-sam", help="build SAM-Decoding's static suffix automaton over a REST datastore")
    s.add_argument("--target", default=DEFAULT_TARGET, help=f"whose tokenizer (default {DEFAULT_TARGET})")
    s.add_argument("--datastore", help="datastore folder (default: the target's ShareGPT datastore in the user cache)")
    s.add_argument("--out", help="output folder (default: beside the datastore, where sam's static: sharegpt looks)")
    s.add_argument("--max-tokens", type=int, default=STATIC_MAX_TOKENS,
                   help=f"the corpus's first whole documents up to this many tokens (default {STATIC_MAX_TOKENS})")
    s.set_defaults(func=cmd_static_sam)


def cmd_static_sam(args) -> int:
    folder, automaton = build_static_automaton(load_tokenizer(args.target), args.target, args.datastore, args.out,
                                               args.max_tokens)
    m = automaton.manifest
    print(f"{folder}: {m['tokens']} tokens of {m['documents']} documents, {m['states']} states, {m['edges']} edges "
          f"in {m['build_seconds']} s")
    return 0
