"""REST's datastore (He et al., arXiv:2311.08252 Sec. 3): a token corpus with a suffix array, the retrieval of the
continuations of the context's longest matching suffix, and the trie of the most frequent continuation prefixes.

A :class:`Datastore` holds ``tokens [T]`` (int32: the documents' token ids, each document followed by -1) and
``suffixes [T]`` (int64: every position, sorted by the first ``key_length`` tokens from it, ties in position order;
a suffix array truncated at ``key_length`` tokens, enough to find every pattern of at most ``key_length`` tokens by
binary search). :func:`retrieve` tries the context's last ``max_match`` tokens, then one fewer, down to ``min_match``;
the first length that occurs gives up to ``max_candidates`` continuations of ``depth`` tokens (the first ones in
suffix-array order; a continuation stops at a document's end). :func:`trie_draft` counts every prefix of the
continuations (the trie of Sec. 3.2) and keeps the ``num_draft`` most frequent: a parent is at least as frequent as
its child, so the kept nodes are a tree. Worked example in :func:`trie_draft`.

On disk (``draftbench data datastore``, :mod:`methods.rest.build`): ``tokens.npy``, ``suffixes.npy`` and
``manifest.json`` with the tokenizer's identity (:func:`tokenizer_identity`), checked on load so that a datastore
built for another tokenizer is refused in one line (:func:`load_datastore`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "draftbench-datastore-1"
SEPARATOR = -1  # after every document: no pattern contains it, so no match and no continuation crosses documents


def tokenizer_identity(tokenizer, name: str) -> dict[str, Any]:
    """``{"name", "vocab_size", "vocab_sha256"}`` of a transformers tokenizer: ``name`` (the target's, for messages),
    ``len(tokenizer)`` and the SHA-256 of its vocabulary (``token\\tid`` lines sorted by id), which two tokenizers
    share only when every id means the same token. Two identities match when size and hash do
    (:func:`same_tokenizer`)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256("\n".join(f"{t}\t{i}" for t, i in vocab).encode()).hexdigest()
    return {"name": name, "vocab_size": len(tokenizer), "vocab_sha256": digest}


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`tokenizer_identity` records mean the same ids (vocabulary size and hash; names may differ:
    one model under two names or paths)."""
    return (a.get("vocab_size"), a.get("vocab_sha256")) == (b.get("vocab_size"), b.get("vocab_sha256"))


def default_datastore_dir(cache: Path, identity: dict[str, Any], source: str = "sharegpt") -> Path:
    """Where ``draftbench data datastore`` writes, and the method ``rest`` looks, by default: one folder per
    tokenizer (name and vocabulary hash) and source under ``cache``.
    Example: name "smollm2-135m", hash "ab12..." -> cache/datastores/smollm2-135m-ab12... (12 hex digits)-sharegpt."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", identity["name"]).strip("-") or "tokenizer"
    return cache / "datastores" / f"{name}-{identity['vocab_sha256'][:12]}-{source}"


def concatenate(documents: list[list[int]]) -> np.ndarray:
    """``tokens [T]`` int32: every document followed by :data:`SEPARATOR`.
    Example: [[5, 6], [7]] -> [5, 6, -1, 7, -1]."""
    out: list[int] = []
    for doc in documents:
        out.extend(doc)
        out.append(SEPARATOR)
    return np.asarray(out, dtype=np.int32)


def suffix_array(tokens: np.ndarray, key_length: int) -> np.ndarray:
    """Positions ``[T]`` (int64) sorted by the first ``key_length`` tokens from each (a suffix that ends sooner sorts
    before its extensions), ties in position order: prefix doubling, ceil(log2(key_length)) sorts.

    Example: tokens [2, 1, 2, 1], key_length 2: keys (2,1), (1,2), (2,1), (1,) -> [3, 1, 0, 2].
    """
    n = tokens.shape[0]
    rank = tokens.astype(np.int64) + 2  # [T] >= 1 (the separator -1 -> 1); 0 = past the end
    span = 1
    while span < key_length:
        second = np.zeros(n, dtype=np.int64)  # [T] rank of the block that follows, 0 past the end
        second[: max(n - span, 0)] = rank[span:]
        order = np.lexsort((second, rank))  # [T] by (rank, second), stable
        pair_r, pair_s = rank[order], second[order]
        new = np.empty(n, dtype=np.int64)
        changed = np.ones(n, dtype=bool)
        changed[1:] = (pair_r[1:] != pair_r[:-1]) | (pair_s[1:] != pair_s[:-1])
        new[order] = np.cumsum(changed)  # dense ranks from 1
        rank = new
        span *= 2
    return np.argsort(rank, kind="stable").astype(np.int64)


@dataclass
class Datastore:
    """``tokens [T]`` int32 with a :data:`SEPARATOR` after every document, ``suffixes [T]`` int64
    (:func:`suffix_array` of ``key_length``) and the manifest (tokenizer identity, source, counts)."""

    tokens: np.ndarray
    suffixes: np.ndarray
    key_length: int
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, documents: list[list[int]], key_length: int = 32, **manifest: Any) -> Datastore:
        """The datastore of ``documents`` (lists of token ids); ``manifest`` entries are recorded as given."""
        tokens = concatenate(documents)
        return cls(tokens, suffix_array(tokens, key_length), key_length,
                   {"format": FORMAT, "documents": len(documents), "tokens": int(tokens.shape[0]),
                    "key_length": key_length, **manifest})

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "tokens.npy", self.tokens)
        np.save(folder / "suffixes.npy", self.suffixes)
        (folder / "manifest.json").write_text(json.dumps(self.manifest, indent=1) + "\n")  # last: marks it complete
        return folder

    def occurrences(self, pattern: list[int]) -> tuple[int, int]:
        """``(lo, hi)``: the range of :attr:`suffixes` whose first ``len(pattern)`` tokens equal ``pattern`` (at most
        ``key_length`` tokens), by binary search; ``lo == hi`` when it does not occur.
        Example: tokens [5, 6, 5, 7] (+ separator): pattern [5] -> a range of 2 positions (0 and 2)."""
        n = len(pattern)
        tokens, suffixes = self.tokens, self.suffixes

        def prefix(i: int) -> list[int]:
            start = int(suffixes[i])
            return tokens[start: start + n].tolist()

        lo, hi = 0, suffixes.shape[0]
        while lo < hi:  # first suffix >= pattern
            mid = (lo + hi) // 2
            if prefix(mid) < pattern:
                lo = mid + 1
            else:
                hi = mid
        start, hi = lo, suffixes.shape[0]
        while lo < hi:  # first suffix whose prefix > pattern
            mid = (lo + hi) // 2
            if prefix(mid) <= pattern:
                lo = mid + 1
            else:
                hi = mid
        return start, lo


def load_datastore(folder: str | Path, identity: dict[str, Any] | None = None) -> Datastore:
    """The datastore saved in ``folder``; ``identity`` (:func:`tokenizer_identity` of the target's tokenizer) must
    equal the one it was built with. A missing folder or manifest raises ``FileNotFoundError`` and a mismatch
    ``ValueError``, each one line saying how to build the right one (:func:`read_manifest`)."""
    folder = Path(folder)
    target = identity["name"] if identity else "TARGET"
    build = f"build it with: draftbench data datastore --source sharegpt --target {target} --out {folder}"
    manifest = read_manifest(folder, FORMAT, identity, "REST datastore", build)
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    suffixes = np.load(folder / "suffixes.npy", mmap_mode="r")
    return Datastore(tokens, suffixes, int(manifest["key_length"]), manifest)


def read_manifest(folder: Path, fmt: str, identity: dict[str, Any] | None, what: str, build: str) -> dict[str, Any]:
    """``folder/manifest.json`` of a file set in format ``fmt`` built for ``identity``'s tokenizer (None: any).
    Missing: ``FileNotFoundError``; another format or tokenizer: ``ValueError``; each one line naming ``what`` and
    ending with ``build`` (the command that builds the right one)."""
    if not (folder / "manifest.json").is_file():
        raise FileNotFoundError(f"{what} {folder} not found (no manifest.json); {build}")
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("format") != fmt:
        raise ValueError(f"{what} {folder}: format {manifest.get('format')!r}, expected {fmt!r}; {build}")
    built = manifest.get("tokenizer") or {}
    if identity is not None and not same_tokenizer(built, identity):
        raise ValueError(f"{what} {folder} was built for tokenizer {built.get('name')!r} (vocabulary "
                         f"{built.get('vocab_size')}, hash {str(built.get('vocab_sha256'))[:12]}), not the target's "
                         f"{identity['name']!r} (vocabulary {identity['vocab_size']}, hash "
                         f"{identity['vocab_sha256'][:12]}); {build}")
    return manifest


def retrieve(store: Datastore, context: list[int], max_match: int, min_match: int, max_candidates: int,
             depth: int) -> tuple[int, np.ndarray]:
    """``(n, continuations [k, depth])``: n = the longest length in ``max_match..min_match`` whose last-n-token
    suffix of ``context`` occurs in ``store`` (0 if none), and the ``depth`` tokens after each of its first
    ``k <= max_candidates`` occurrences in suffix-array order, :data:`SEPARATOR` from a document's end on.
    Example: documents [[1, 2, 3], [1, 2, 4, 5]], context [9, 1, 2], max_match 3, min_match 1, depth 2 ->
    n = 2, continuations [[3, -1], [4, 5]] (rows in suffix-array order: [1, 2, 3] before [1, 2, 4])."""
    for n in range(min(max_match, len(context), store.key_length), min_match - 1, -1):
        lo, hi = store.occurrences(context[-n:])
        if hi > lo:
            starts = np.asarray(store.suffixes[lo: min(hi, lo + max_candidates)], dtype=np.int64) + n  # [k]
            index = np.minimum(starts[:, None] + np.arange(depth), store.tokens.shape[0] - 1)  # [k, depth]
            conts = np.asarray(store.tokens[index], dtype=np.int64)  # [k, depth]; the last token is a separator
            alive = np.cumprod(conts != SEPARATOR, axis=1).astype(bool)  # [k, depth] before the document's end
            return n, np.where(alive, conts, SEPARATOR)
    return 0, np.zeros((0, depth), dtype=np.int64)


def trie_draft(continuations: np.ndarray, num_draft: int) -> tuple[list[int], list[int]]:
    """The ``num_draft`` most frequent prefixes of ``continuations [k, depth]`` (:data:`SEPARATOR` ends a row) as a
    draft tree ``(tokens [N], parents [N])`` (-1 = the root), N <= num_draft: nodes by frequency, ties to the
    shallower then to the smaller (parent, token); listed by depth, siblings most frequent first.

    Example: rows [[3, 4], [3, 4], [3, 5], [6, -1]], num_draft 3: prefix counts 3: 3, (3, 4): 2, (3, 5): 1, 6: 1 ->
    keep 3, (3, 4) and then (6,) (depth 1 beats depth 2 on a tie) -> tokens [3, 6, 4], parents [-1, -1, 0].
    """
    k, depth = continuations.shape
    if k == 0 or num_draft < 1:
        return [], []
    base = int(continuations.max()) + 1
    ids = np.zeros(k, dtype=np.int64)           # [k] node of each row's prefix so far (0 = root)
    alive = np.ones(k, dtype=bool)               # [k]
    node_token, node_parent, node_count, node_depth = [], [], [], []  # node i + 1 of the trie
    for d in range(depth):
        alive &= continuations[:, d] != SEPARATOR
        if not alive.any():
            break
        keys = ids[alive] * base + continuations[alive, d]  # [a] (parent node, token)
        unique, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        first = len(node_token) + 1
        node_token.extend((unique % base).tolist())
        node_parent.extend((unique // base).tolist())
        node_count.extend(counts.tolist())
        node_depth.extend([d + 1] * len(unique))
        ids[alive] = first + inverse
    order = np.lexsort((np.arange(len(node_count)), np.asarray(node_depth), -np.asarray(node_count)))[:num_draft]
    kept = sorted(order.tolist(), key=lambda i: (node_depth[i], -node_count[i], i))  # by depth, siblings by count
    index = {node + 1: j for j, node in enumerate(kept)}  # trie node -> draft index
    return [node_token[i] for i in kept], [index.get(node_parent[i], -1) for i in kept]
