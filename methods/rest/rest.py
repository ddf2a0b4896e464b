"""REST, retrieval-based speculative decoding (He et al., arXiv:2311.08252 Sec. 3): drafts retrieved from a datastore.

Every step takes the context's longest suffix (``max_match`` tokens down to ``min_match``, the pending root
included) that occurs in the datastore, the ``depth`` tokens that follow its first ``max_candidates`` occurrences,
and proposes the trie of their ``num_draft`` most frequent prefixes (:func:`methods.rest.datastore.retrieve`,
:func:`methods.rest.datastore.trie_draft`); no match gives an empty tree (a plain target forward). Training-free
and a deterministic function of the context, so verification is lossless at every temperature. Defaults are the
authors' (64 draft tokens, suffixes of 16 tokens down to 2, continuations of 10 tokens from 5000 occurrences).

The datastore is built once (``draftbench data datastore --source sharegpt``: the assistant turns of ShareGPT in
the target's tokenizer; :mod:`methods.rest.build`) into the user cache, where ``datastore`` (default) looks for
the target's; a missing one, or one built for another tokenizer, is refused before the run in one line.

Differences from the authors' implementation: documents are separated, so no match or continuation crosses from one
conversation into the next; the suffix array orders suffixes by their first ``key_length`` (32) tokens only (ties
in corpus order), which finds the same occurrences; frequency ties are broken by depth, then corpus order; and the
tree keeps the ``num_draft`` most frequent nodes, where the authors' DraftRetriever (FasterDecoding/REST,
``DraftRetriever/src/lib.rs``, ``cut_to_choices``) then drops the paths with the most distinct tokens until the kept
paths' distinct-token counts sum to at most ``num_draft`` (about 21 of 64 nodes on MT-bench; ties in random hash
order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.engine.hostio import upload
from harness.engine.method import build_options, seeded
from harness.engine.sampling import SamplingParams
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree
from harness.models import Target, cache_dir
from harness.registry import register_method
from methods.rest.datastore import (
    Datastore,
    default_datastore_dir,
    load_datastore,
    retrieve,
    tokenizer_identity,
    trie_draft,
)


@dataclass
class RestOptions:
    """``datastore``: folder (default: the target's ShareGPT datastore in the user cache); ``num_draft``: tree nodes
    (64); ``max_match``/``min_match``: suffix lengths tried, longest first (16, 2); ``depth``: continuation tokens
    (10); ``max_candidates``: occurrences read (5000)."""

    datastore: str | None = None
    num_draft: int = 64
    max_match: int = 16
    min_match: int = 2
    depth: int = 10
    max_candidates: int = 5000

    def __post_init__(self):
        for name in ("num_draft", "max_match", "min_match", "depth", "max_candidates"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_draft > SpeculativeMethod.max_tree_slots - 1:
            raise ValueError(f"num_draft must be at most {SpeculativeMethod.max_tree_slots - 1} (the verification "
                             f"forward's slots, root included), got {self.num_draft}")
        if self.max_match < self.min_match:
            raise ValueError(f"max_match ({self.max_match}) must be >= min_match ({self.min_match})")


def example_documents(target: Target, seed: int = 0) -> list[list[int]]:
    """A corpus for the examples of the corpus-based methods: the target's greedy continuations (48 tokens) of 4
    prompts of 4 random tokens drawn from ``seed`` (prompts included)."""
    with seeded(seed):
        prompts = torch.randint(0, target.model.config.vocab_size, (4, 4))
    documents = []
    with torch.no_grad():
        for prompt in prompts:
            ids = prompt[None].to(target.device)
            for _ in range(48):
                ids = torch.cat([ids, target.model(ids).logits[:, -1:].argmax(-1)], dim=1)
            documents.append(ids[0].tolist())
    return documents


@register_method("rest")
class Rest(SpeculativeMethod):
    """REST (arXiv:2311.08252 Sec. 3): a trie of continuations retrieved from a datastore by the longest suffix."""

    Options = RestOptions

    def __init__(self, target: Target, options=None, store: Datastore | None = None):
        super().__init__(target, options)
        if store is None:
            identity = tokenizer_identity(target.tokenizer, target.name)
            folder = Path(self.options.datastore or default_datastore_dir(cache_dir(), identity)).expanduser()
            store = load_datastore(folder, identity)
            store.manifest = {**store.manifest, "path": str(folder)}
        if self.options.max_match > store.key_length:
            raise ValueError(f"method 'rest': max_match {self.options.max_match} is longer than the datastore's "
                             f"suffix keys ({store.key_length} tokens); rebuild it with a larger --key-length")
        self.store = store

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> Rest:
        """A datastore in memory of :func:`example_documents`, so that its text resembles what the target writes."""
        store = Datastore.build(example_documents(target, seed), source="example", tokenizer=None)
        return cls(target, build_options(cls.Options, options, f"method {cls.name!r}"), store=store)

    def describe(self) -> dict[str, Any]:
        """The options plus what the datastore holds (path, source, documents, tokens, tokenizer)."""
        manifest = self.store.manifest
        keep = ("path", "source", "documents", "tokens", "tokenizer")
        return {**super().describe(), "datastore": {k: manifest[k] for k in keep if k in manifest}}

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.context: list[int] = prompt_ids[0].tolist()

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        o = self.options
        query = self.context[max(0, len(self.context) - o.max_match + 1):] + [root]  # the last max_match tokens
        _, continuations = retrieve(self.store, query, o.max_match, o.min_match, o.max_candidates, o.depth)
        tokens, parents = trie_draft(continuations, o.num_draft)
        return DraftTree(tokens=upload(tokens, self.target.device), parents=upload(parents, self.target.device))

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.context.extend(tokens)
