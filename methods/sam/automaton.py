"""A suffix automaton over token ids, built online (Blumer et al. 1985), as SAM-Decoding drafts from it (Hu et al.,
arXiv:2411.10666 Sec. 3).

The automaton of a text accepts exactly the text's substrings. State 0 is the empty string; every other state is a
class of substrings with the same set of end positions, ``length[s]`` the longest of them, ``link[s]`` the state of
the longest suffix outside the class, ``first_end[s]`` the end position (0-based index of the last token) of their
first occurrence. :meth:`SuffixAutomaton.extend` appends one token in amortised O(1) states and transitions.

Drafting (:meth:`SuffixAutomaton.draft`): the longest suffix of ``text + [root]`` that occurs in the text is found by
one transition from the whole text's state, following suffix links where the root has no transition; the draft is
what followed its first occurrence.

Worked example (the tests): text [1, 2, 1, 2, 3], root 1 -> the longest suffix of [1, 2, 1, 2, 3, 1] that occurs in
the text is [1] (no [3, 1] occurs), first ending at position 0 -> draft [2, 1, 2, 3] (match length 1). Root 2 after
text [1, 2, 1] -> [1, 2] occurs ending first at position 1 -> draft [1] with match length 2.

The paper's second, static automaton over a corpus built once (Sec. 3; hyx1999/SAM-Decoding@18c41f0
``samd/sam/static_sam.py``) is :class:`StaticAutomaton`: the same construction, frozen into numpy arrays (transitions
as sorted edge lists per state) so that it can be saved, memory-mapped and searched without a Python object per
state. It is matched by a cursor that follows the context (:meth:`StaticAutomaton.step`, the matching statistics of
the context against the corpus), and :func:`choose_automaton` picks the dynamic or the static draft with the
paper's length bias.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from methods.rest.datastore import SEPARATOR, default_datastore_dir, read_manifest

STATIC_FORMAT = "draftbench-static-sam-1"
STATIC_ARRAYS = ("tokens", "link", "length", "first_end", "edge_start", "edge_token", "edge_target")


class SuffixAutomaton:
    """The suffix automaton of ``tokens`` (host lists; grows by :meth:`extend`)."""

    def __init__(self, tokens: list[int] | None = None):
        self.next: list[dict[int, int]] = [{}]  # transitions of every state
        self.link: list[int] = [-1]             # suffix link (-1 for state 0)
        self.length: list[int] = [0]            # the longest string of the state
        self.first_end: list[int] = [-1]        # end position of its first occurrence
        self.tokens: list[int] = []
        self.last = 0                           # the state of the whole text
        for token in tokens or []:
            self.extend(token)

    def extend(self, token: int) -> None:
        """Append ``token`` to the text (the standard online construction; a split state's clone keeps the first
        occurrence of the state it was split from)."""
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, pos, {})
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.first_end[q], dict(self.next[q]))
                self.link[clone] = self.link[q]
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def _new_state(self, length: int, first_end: int, transitions: dict[int, int]) -> int:
        self.next.append(transitions)
        self.link.append(-1)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def match(self, token: int) -> tuple[int, int]:
        """``(state, length)`` of the longest suffix of ``text + [token]`` that occurs in the text; ``(0, 0)`` when
        ``token`` does not occur at all. The automaton is not changed."""
        p = self.last
        while p != -1 and token not in self.next[p]:
            p = self.link[p]
        if p == -1:
            return 0, 0
        return self.next[p][token], self.length[p] + 1

    def draft(self, root: int, max_tokens: int) -> tuple[int, list[int]]:
        """``(match length, draft)``: the length of the longest suffix of ``text + [root]`` occurring in the text
        (:meth:`match`) and up to ``max_tokens`` tokens that followed its first occurrence. When that occurrence is
        too close to the end of the text to give ``max_tokens``, the draft follows the first occurrence of the longest
        shorter suffix (along the suffix links) that occurs earlier, if one is longer than the empty string; the match
        length stays the longest suffix's, as SAM-Decoding's code holds it against its threshold before it climbs
        (hyx1999/SAM-Decoding, ``samd/draft.py``'s ``DraftModel.lookup``, then ``samd/sam/dyn_sam.py``'s ``to_anc``).
        ``(0, [])`` without a match. Example: text [5, 6, 7, 5], root 6 -> match [5, 6] at 1 -> (2, [7, 5])."""
        state, length = self.match(root)
        if state == 0:
            return 0, []
        last = len(self.tokens) - 1
        while last - self.first_end[state] < max_tokens:
            up = self.link[state]
            while up > 0 and self.first_end[up] == self.first_end[state]:  # no earlier occurrence: no longer draft
                up = self.link[up]
            if up <= 0:
                break
            state = up
        start = self.first_end[state] + 1
        return length, self.tokens[start: start + max_tokens]


class StaticAutomaton:
    """The suffix automaton of a corpus, frozen: ``tokens [T]`` int32 (the corpus, documents separated by
    :data:`methods.rest.datastore.SEPARATOR`), per state ``link [S]``, ``length [S]``, ``first_end [S]`` (as in
    :class:`SuffixAutomaton`) and its transitions ``edge_start [S + 1]`` int64, ``edge_token [E]`` and
    ``edge_target [E]`` int32: the edges of state s are ``edge_start[s]:edge_start[s + 1]``, sorted by token.
    A separator is an ordinary token of the corpus that no context contains, so no match and no draft crosses a
    document's end."""

    def __init__(self, arrays: dict[str, np.ndarray], manifest: dict[str, Any] | None = None):
        for name in STATIC_ARRAYS:
            setattr(self, name, arrays[name])
        self.manifest = manifest or {}

    @classmethod
    def build(cls, tokens, **manifest: Any) -> StaticAutomaton:
        """The automaton of ``tokens`` (ids, separators included), built online by :class:`SuffixAutomaton` and then
        frozen; ``manifest`` entries are recorded with the counts and the build time.
        Example: [1, 2, 1] -> states {}, {1}, {1 2, 2}, {1 2 1, 2 1}; edges 0-1->1, 0-2->2, 1-2->2, 2-1->3."""
        started = time.perf_counter()
        sam = SuffixAutomaton([int(t) for t in tokens])
        counts = np.fromiter((len(n) for n in sam.next), dtype=np.int64, count=len(sam.next))  # [S]
        edge_start = np.zeros(len(counts) + 1, dtype=np.int64)  # [S + 1]
        np.cumsum(counts, out=edge_start[1:])
        edges = sorted((s, t, q) for s, nxt in enumerate(sam.next) for t, q in nxt.items())  # by state, then token
        arrays = {
            "tokens": np.asarray(sam.tokens, dtype=np.int32),
            "link": np.asarray(sam.link, dtype=np.int32),
            "length": np.asarray(sam.length, dtype=np.int32),
            "first_end": np.asarray(sam.first_end, dtype=np.int32),
            "edge_start": edge_start,
            "edge_token": np.asarray([t for _, t, _ in edges], dtype=np.int32),
            "edge_target": np.asarray([q for _, _, q in edges], dtype=np.int32),
        }
        del sam, edges
        return cls(arrays, {"format": STATIC_FORMAT, "tokens": len(arrays["tokens"]), "states": len(counts),
                            "edges": int(edge_start[-1]), "build_seconds": round(time.perf_counter() - started, 1),
                            **manifest})

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in STATIC_ARRAYS:
            np.save(folder / f"{name}.npy", getattr(self, name))
        (folder / "manifest.json").write_text(json.dumps(self.manifest, indent=1) + "\n")  # last: marks it complete
        return folder

    def transition(self, state: int, token: int) -> int:
        """The state reached from ``state`` by ``token``, -1 without such a transition (binary search)."""
        lo, hi = int(self.edge_start[state]), int(self.edge_start[state + 1])
        i = lo + int(np.searchsorted(self.edge_token[lo:hi], token))
        return int(self.edge_target[i]) if i < hi and int(self.edge_token[i]) == token else -1

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The cursor after ``token``: ``(state, length)`` of the longest suffix of (the text that led to ``state``,
        of which the last ``length`` tokens matched) + ``token`` that occurs in the corpus; ``(0, 0)`` when ``token``
        does not occur. Shorter suffixes along the suffix links, as the reference's ``transfer_state``.
        Example: corpus [1, 2, 3]: (0, 0) -1-> (state of [1], 1) -2-> ([1, 2], 2) -1-> ([1], 1)."""
        nxt = self.transition(state, token)
        while nxt < 0 and state > 0:
            state = int(self.link[state])
            length = int(self.length[state])
            nxt = self.transition(state, token)
        return (nxt, length + 1) if nxt >= 0 else (0, 0)

    def follow(self, state: int, length: int, tokens: list[int]) -> tuple[int, int]:
        """The cursor after every token of ``tokens`` in turn (:meth:`step`)."""
        for token in tokens:
            state, length = self.step(state, length, token)
        return state, length

    def draft(self, state: int, length: int, root: int, max_tokens: int) -> tuple[int, list[int]]:
        """``(match length, draft)`` for the cursor ``(state, length)`` and ``root``: the length of the longest
        suffix of context + ``root`` in the corpus (:meth:`step`) and up to ``max_tokens`` tokens that followed its
        first occurrence, up to the document's end; ``(0, [])`` without a match. Unlike
        :meth:`SuffixAutomaton.draft` it does not climb to a shorter suffix when the occurrence is near the end, as
        the reference's static ``gen_draft`` does not. Example: corpus [[5, 6, 7, 8], [6, 9]], cursor after [5],
        root 6 -> (2, [7, 8]); max_tokens 1 -> (2, [7])."""
        state, length = self.step(state, length, root)
        if state == 0:
            return 0, []
        start = int(self.first_end[state]) + 1
        chain = [int(t) for t in self.tokens[start: start + max_tokens]]
        return length, chain[: chain.index(SEPARATOR)] if SEPARATOR in chain else chain


def default_static_dir(cache: Path, identity: dict[str, Any], source: str = "sharegpt") -> Path:
    """Where ``draftbench data static-sam`` writes, and ``sam``'s ``static: <source>`` looks: the source's datastore
    folder (:func:`methods.rest.datastore.default_datastore_dir`, one per tokenizer) with ``-sam`` appended.
    Example: cache/datastores/smollm2-135m-ab12...-sharegpt -> cache/datastores/smollm2-135m-ab12...-sharegpt-sam."""
    folder = default_datastore_dir(cache, identity, source)
    return folder.with_name(folder.name + "-sam")


def load_static_automaton(folder: str | Path, identity: dict[str, Any] | None = None) -> StaticAutomaton:
    """The static automaton saved in ``folder`` (memory-mapped), built for ``identity``'s tokenizer; missing or built
    for another tokenizer: one line naming the command that builds it
    (:func:`methods.rest.datastore.read_manifest`)."""
    folder = Path(folder)
    target = identity["name"] if identity else "TARGET"
    build = (f"build it with: draftbench data datastore --source sharegpt --target {target}, then "
             f"draftbench data static-sam --target {target} --out {folder}")
    manifest = read_manifest(folder, STATIC_FORMAT, identity, "static SAM", build)
    return StaticAutomaton({name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in STATIC_ARRAYS},
                           {**manifest, "path": str(folder)})


def choose_automaton(dynamic_length: int, static_length: int, len_bias: int, threshold: int) -> str | None:
    """Which automaton drafts: ``"dynamic"``, ``"static"`` or None (the fallback), from the two match lengths
    (the root included), as SAM-Decoding's ``DraftModel.lookup`` (hyx1999/SAM-Decoding@18c41f0 ``samd/draft.py``):
    the static length less ``len_bias`` is compared; the longer drafts, the dynamic one on a tie, if it reaches
    ``threshold``. Example: threshold 4, bias 4: (3, 9) -> static (9 - 4 = 5 > 3); (5, 9) -> dynamic (tie);
    (2, 7) -> None (max(2, 3) < 4)."""
    static = static_length - len_bias
    if max(dynamic_length, static) < threshold:
        return None
    return "dynamic" if dynamic_length >= static else "static"
