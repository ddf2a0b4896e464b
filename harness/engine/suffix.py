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
"""

from __future__ import annotations


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
