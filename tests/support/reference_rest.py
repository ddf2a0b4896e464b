"""REST against its authors' retriever: DraftRetriever built from the REST repository's source
(FasterDecoding/REST at 50a5fc1, ``DraftRetriever/``: Rust with pyo3 0.17 and libsais; docs/reference.md says how it
was built), queried as REST's generation loop queries it (``rest/model/utils.py``,
``generate_candidates_and_draft_buffer``: the context with the pending token appended, its last 16 tokens down to 2,
the first non-empty answer of ``Reader.search(..., choices=64)``, and one draft token, id 100, when none answers),
beside the harness's ``rest`` on the same datastore.

    python tests/support/reference_rest.py index OUT.idx [DATASTORE]          # DraftRetriever's index, same documents
    python tests/support/reference_rest.py compare OUT.idx [QUESTIONS] [TOKENS] [OUT.json]

``index`` writes the documents of the harness's datastore (default: the default model's ShareGPT datastore in the
user cache) with DraftRetriever's ``Writer``, one ``add_entry`` per document, as REST's
``datastore/get_datastore_chat.py`` writes its corpus. ``compare`` decodes MT-bench's first QUESTIONS (5) questions,
both turns (turn 2's prompt holds vanilla's turn-1 answer), TOKENS (64) new tokens, greedy, on the default model:
vanilla, the harness's ``rest``, and the harness's engine drafting DraftRetriever's trees (:class:`RestDraftRetriever`).
Along the harness's steps it compares, per step, the drafted trees (as sets of token paths), the tokens each would get
accepted (the longest path that vanilla's output continues with), the match length, and DraftRetriever's tree with
the harness's retrieval run on DraftRetriever's corpus (the documents concatenated without separators) and
DraftRetriever's rule of selection (:func:`selection_allows`), to trace each difference to its stage. Needs the built
``draftretriever`` importable (without it both commands say so and exit 0) and ``$DRAFTBENCH_DATA`` with ``mt_bench``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import torch

try:
    import draftretriever
except ImportError:
    draftretriever = None

SPANS = range(16, 1, -1)  # REST's token_spans: 16 tokens down to 2
CHOICES = 64  # REST's max_num_draft
NO_MATCH_TOKEN = 100  # REST drafts this one token when no span answers ("just randomly guess one token")


def documents(tokens: np.ndarray) -> list[np.ndarray]:
    """The documents of a datastore's ``tokens [T]`` (each followed by the separator -1)."""
    from methods.rest.datastore import SEPARATOR

    ends = np.flatnonzero(np.asarray(tokens) == SEPARATOR)
    return [np.asarray(tokens[s:e]) for s, e in zip(np.r_[0, ends[:-1] + 1], ends)]


def default_store(folder: str | None = None):
    from pathlib import Path

    from harness.models import cache_dir
    from methods.rest.build import load_tokenizer
    from methods.rest.datastore import default_datastore_dir, load_datastore, tokenizer_identity

    identity = tokenizer_identity(load_tokenizer("smollm2-135m"), "smollm2-135m")
    return load_datastore(Path(folder or default_datastore_dir(cache_dir(), identity)), identity)


def write_index(out: str, folder: str | None = None) -> None:
    store = default_store(folder)
    vocab = int(store.manifest["tokenizer"]["vocab_size"])
    assert vocab <= 65536, "DraftRetriever stores tokens as u16"
    writer = draftretriever.Writer(index_file_path=out, max_chunk_len=512 * 1024 * 1024, vocab_size=vocab)
    docs = documents(store.tokens)
    for doc in docs:
        writer.add_entry(doc.tolist())
    writer.finalize()
    print(f"{out}: {len(docs)} documents, {sum(len(d) for d in docs)} tokens")


def rest_query(reader, context: list[int], root: int) -> tuple[int, set[tuple[int, ...]]]:
    """``(n, paths)``: REST's loop over ``Reader.search``: the query length that answered (0: none) and the paths it
    returned (-2 padding removed); the tree is their prefix closure (:func:`closure`), as REST's
    ``get_draft_choices`` builds it."""
    extended = context + [root]
    for span in SPANS:
        query = extended[-span:]
        paths = reader.search(query, choices=CHOICES)[0]
        if paths:
            return len(query), {tuple(t for t in p if t != -2) for p in paths}
    return 0, set()


def closure(paths) -> set[tuple[int, ...]]:
    """Every prefix of every path: the nodes of their trie."""
    return {p[:i] for p in paths for i in range(1, len(p) + 1)}


def tree_paths(tokens: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    """The token path of every node of a draft tree (parents -1 = the root, topological order)."""
    paths: list[tuple[int, ...]] = []
    for t, p in zip(tokens, parents):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    return set(paths)


def draft_tree(paths: set[tuple[int, ...]]):
    """The :class:`DraftTree` of a prefix-closed set of token paths (by depth, then token order)."""
    from harness.engine.tree import DraftTree

    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    return DraftTree(tokens=torch.tensor([p[-1] for p in ordered], dtype=torch.long),
                     parents=torch.tensor([index.get(p[:-1], -1) for p in ordered], dtype=torch.long))


def accepted(paths: set[tuple[int, ...]], following: list[int]) -> int:
    """Draft tokens greedy verification accepts: the longest path that ``following`` (the target's next tokens after
    the root) starts with."""
    return max((len(p) for p in paths if tuple(following[:len(p)]) == p), default=0)


def prefix_counts(continuations: np.ndarray) -> Counter:
    """How many continuations (rows of ``[k, depth]``, cut at the separator) start with each path."""
    from methods.rest.datastore import SEPARATOR

    counts: Counter = Counter()
    for row in continuations.tolist():
        row = row[:row.index(SEPARATOR)] if SEPARATOR in row else row
        counts.update(tuple(row[:i]) for i in range(1, len(row) + 1))
    return counts


def selection_allows(counts: Counter, paths: set[tuple[int, ...]], choices: int) -> bool:
    """Whether DraftRetriever's choice of nodes (``Reader.search`` after the retrieval, as ``DraftRetriever/src/
    lib.rs`` describes it) can return ``paths`` (its answer before the prefix closure) from these prefix counts under
    some order of its ties (hash order in Rust's ``HashMap``/``HashSet``, random per process): a heap keeps
    ``choices`` prefixes of the highest counts (ties at the threshold: any), then ``cut_to_choices`` drops the kept
    paths with the most distinct tokens first until the kept paths' distinct-token counts sum to at most ``choices``.
    Example: counts {(3,): 2, (3, 4): 1, (5,): 1}, choices 2: the heap keeps (3,) and one of the tied (3, 4), (5,);
    with (5,) the cut drops nothing (1 + 1 <= 2), with (3, 4) it drops (3, 4) (2 + 1 > 2): {(3,), (5,)} and {(3,)}
    are allowed, {(3, 4)} is not."""
    if not paths or any(p not in counts for p in paths):
        return not paths and not counts
    size = min(choices, len(counts))
    threshold = sorted(counts.values(), reverse=True)[size - 1]
    if any(counts[p] < threshold for p in paths):
        return False
    above = [p for p in counts if counts[p] > threshold]
    free = size - len(above) - sum(counts[p] == threshold for p in paths)  # tied nodes the heap kept, cut later
    tied = sorted((len(set(p)) for p in counts if counts[p] == threshold and p not in paths), reverse=True)
    if not 0 <= free <= len(tied):
        return False
    removed = [len(set(p)) for p in above if p not in paths] + tied[:free]  # the cut's, largest first
    kept = sum(len(set(p)) for p in paths)
    if kept > choices:
        return False
    return not removed or (min(removed) >= max(len(set(p)) for p in paths) and kept + min(removed) > choices)


def rest_classes(reader):
    from methods.rest.rest import Rest

    class LoggedRest(Rest):
        """The harness's ``rest``, recording every step's context, root and tree."""

        def begin(self, prompt_ids, hidden):
            super().begin(prompt_ids, hidden)
            self.log = []

        def propose(self, root, sampling, generator):
            tree = super().propose(root, sampling, generator)
            self.log.append((list(self.context), root, tree_paths(tree.tokens.tolist(), tree.parents.tolist())))
            return tree

    class RestDraftRetriever(Rest):
        """The harness's engine drafting what REST's loop gets from DraftRetriever (token 100 when nothing)."""

        def propose(self, root, sampling, generator):
            _, paths = rest_query(reader, self.context, root)
            return draft_tree(closure(paths) or {(NO_MATCH_TOKEN,)})

    return LoggedRest, RestDraftRetriever


def compare(index: str, questions: int, tokens: int, out: str | None) -> None:
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from methods.rest.datastore import Datastore, retrieve, suffix_array, trie_draft
    from tests.support.mt_bench_turns import vanilla_turns

    reader = draftretriever.Reader(index_file_path=index)
    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    store = default_store()
    docs = np.concatenate(documents(store.tokens)).astype(np.int32)  # DraftRetriever's corpus: no separators
    joined = np.r_[docs, np.int32(-1)]
    joined_store = Datastore(joined, suffix_array(joined, store.key_length), store.key_length)
    logged_cls, dr_cls = rest_classes(reader)
    harness, dr = logged_cls(target, None, store=store), dr_cls(target, None, store=store)
    o = harness.options
    rows, steps = [], []
    for qid, turn, ids, v in vanilla_turns(target, questions, tokens):
        h = harness.generate(ids, tokens, SamplingParams())
        d = dr.generate(ids, tokens, SamplingParams())
        rows.append({"qid": qid, "turn": turn, "vanilla": v, "rest": h.token_ids,
                     "rest_forwards": len(h.accept_lengths), "draftretriever": d.token_ids,
                     "draftretriever_forwards": len(d.accept_lengths)})
        prompt_len = ids.shape[1]
        for context, root, tree in harness.log:
            n = len(context) - prompt_len + 1  # tokens emitted, the root included
            following = v[n:]
            dr_n, dr_paths = rest_query(reader, context, root)
            dr_tree, again = closure(dr_paths), closure(rest_query(reader, context, root)[1])
            h_n, h_conts = retrieve(store, context[-o.max_match + 1:] + [root], o.max_match, o.min_match,
                                    o.max_candidates, o.depth)
            j_n, conts = retrieve(joined_store, context[-o.max_match + 1:] + [root], o.max_match, o.min_match,
                                  o.max_candidates, o.depth)
            counts = prefix_counts(conts)
            joined_tree = tree_paths(*trie_draft(conts, o.num_draft))  # the harness rule, DraftRetriever corpus
            steps.append({"qid": qid, "turn": turn, "emitted": n, "harness_n": h_n, "dr_n": dr_n,
                          "joined_n": j_n, "same_tree": tree == dr_tree, "dr_repeatable": dr_tree == again,
                          "harness_nodes": len(tree), "dr_nodes": len(dr_tree),
                          "same_continuations": prefix_counts(h_conts) == counts,
                          "occurrences_capped": len(conts) == o.max_candidates,
                          "selection_allows": selection_allows(counts, dr_paths, CHOICES),
                          "joined_same_tree": joined_tree == tree,
                          "harness_accepts": accepted(tree, following),
                          "joined_accepts": accepted(joined_tree, following),
                          "dr_accepts": accepted(dr_tree or {(NO_MATCH_TOKEN,)}, following)})
    if out:
        with open(out, "w") as f:
            json.dump({"turns": rows, "steps": steps}, f)
    count = len(steps)

    def share(key):
        return sum(bool(s[key]) for s in steps)

    emitted = sum(len(r["vanilla"]) for r in rows)
    print(f"{len(rows)} turns, {count} steps of the harness's rest")
    print(f"outputs equal to vanilla: rest {sum(r['rest'] == r['vanilla'] for r in rows)}/{len(rows)}, "
          f"draftretriever {sum(r['draftretriever'] == r['vanilla'] for r in rows)}/{len(rows)}")
    print(f"tau: rest {emitted / sum(r['rest_forwards'] for r in rows):.3f}, draftretriever "
          f"{emitted / sum(r['draftretriever_forwards'] for r in rows):.3f}")
    print(f"same match length {sum(s['harness_n'] == s['dr_n'] for s in steps)}/{count} (joined corpus: "
          f"{sum(s['joined_n'] == s['dr_n'] for s in steps)}); same continuations (separated and joined documents) "
          f"{share('same_continuations')}/{count} ({share('occurrences_capped')} capped at {o.max_candidates}); "
          f"same tree {share('same_tree')}/{count}; two DraftRetriever calls give the same tree "
          f"{share('dr_repeatable')}/{count}; its answer is one its selection allows from the harness's retrieval "
          f"on its corpus {share('selection_allows')}/{count}; the harness's tree on DraftRetriever's corpus is the "
          f"harness's {share('joined_same_tree')}/{count}")
    print(f"nodes per step: harness {sum(s['harness_nodes'] for s in steps) / count:.1f}, draftretriever "
          f"{sum(s['dr_nodes'] for s in steps) / count:.1f}; accepted per step on the harness's steps: harness "
          f"{sum(s['harness_accepts'] for s in steps) / count:.3f}, draftretriever "
          f"{sum(s['dr_accepts'] for s in steps) / count:.3f}, harness on DraftRetriever's corpus "
          f"{sum(s['joined_accepts'] for s in steps) / count:.3f}; same accepted "
          f"{sum(s['harness_accepts'] == s['dr_accepts'] for s in steps)}/{count}")


if __name__ == "__main__":
    if draftretriever is None:
        print("reference_rest: draftretriever (built from REST's DraftRetriever source) is not importable; skipped")
        sys.exit(0)
    torch.set_num_threads(1)
    command, args = sys.argv[1], sys.argv[2:]
    if command == "index":
        write_index(args[0], args[1] if len(args) > 1 else None)
    else:
        compare(args[0], int(args[1]) if len(args) > 1 else 5, int(args[2]) if len(args) > 2 else 64,
                args[3] if len(args) > 3 else None)
