"""A self-drafting method's own cache, kept in step with what the engine committed.

Drafts that read the target's features (EAGLE-style heads: the pair ``(f_t, x_{t+1})`` predicts ``f_{t+1}``) keep
K/V for the committed positions (the *stable* KV, EAGLE-1 arXiv:2401.15077 Sec. 3.1; released code
``eagle/model/cnets.py``). Position t can only be run once ``x_{t+1}`` is known, so after every commit the last
committed feature waits for the next root. :class:`DraftCache` holds that bookkeeping once for every such method:

    begin(prompt_ids, hidden)    ->  cache.reset(prompt_ids, hidden)
    propose(root)                ->  feats, tokens, pos = cache.pending(root); out, kv = draft(...); cache.advance(kv)
    accept(tokens, hidden, ...)  ->  cache.commit(tokens, hidden)

Tree expansion then runs on a temporary continuation of ``cache.kv`` (a :class:`DraftKV` is immutable, so the
stable KV is never touched by a tree that is later thrown away).

A draft attention window ``W`` (``DraftCache(window=W)``, option ``draft_window`` of the head drafters eagle1, eagle2,
eagle3, jakiro and jakiro_star; not published: a sliding-window draft, as vllm-project/speculators#684, holds
acceptance at long context) limits what the draft attends to: a committed position ``p`` sees the positions
``(p - W, p]`` (:func:`default_draft_mask` with a window), and a tree node sees the window of the position it grows
from (the last ``W`` committed positions) and its ancestors. So the stable KV only ever needs its last ``W``
positions: :meth:`DraftCache.advance` drops the older ones, and the draft's cost per step stops growing with the
context. The target verifies every draft, so the window changes which tokens are proposed, never what is emitted.
With ``W`` at least the context, the masks and the KV are those without a window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.hostio import upload


@dataclass(frozen=True)
class DraftKV:
    """Keys and values of a draft layer for ``length`` positions (keys already rotated by RoPE).

    keys, values: [B, n_kv_heads, length, head_dim]. Immutable: extending returns a new object, so a tree expansion
    built on the stable KV leaves the stable KV untouched.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> DraftKV:
        """This KV followed by ``keys``/``values`` [B, n_kv, S, D] (new tensors; ``self`` is unchanged)."""
        return DraftKV(torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2))

    def crop(self, length: int) -> DraftKV:
        """The first ``length`` positions."""
        if not 0 <= length <= self.length:
            raise ValueError(f"DraftKV.crop: length must be in [0, {self.length}], got {length}")
        return DraftKV(self.keys[:, :, :length], self.values[:, :, :length])

    def tail(self, length: int) -> DraftKV:
        """The last ``length`` positions (``self`` when it holds no more)."""
        if length < 0:
            raise ValueError(f"DraftKV.tail: length must be >= 0, got {length}")
        if length >= self.length:
            return self
        start = self.length - length
        return DraftKV(self.keys[:, :, start:], self.values[:, :, start:])


def check_draft_window(window) -> None:
    """Option ``draft_window``: 0 (the draft sees the whole context) or a window of W >= 1 positions."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"draft_window must be an integer >= 0 (positions the draft attends to; 0 = the whole "
                         f"context), got {window!r}")


def default_draft_mask(new_len: int, kv_len: int, device: torch.device, window: int = 0) -> torch.Tensor:
    """Bool mask [new_len, kv_len + new_len] for new positions that follow the KV's ``kv_len`` contiguous positions:
    causal; with a ``window`` W > 0, new position i (column ``kv_len + i``) sees only the columns
    ``(kv_len + i - W, kv_len + i]``, i.e. itself and the W - 1 positions before it.

    Examples: new_len=2, kv_len=1 -> [[1, 1, 0], [1, 1, 1]]; new_len=3, kv_len=1, window=2 -> [[1, 1, 0, 0],
    [0, 1, 1, 0], [0, 0, 1, 1]]; a window >= kv_len + new_len gives the causal mask.
    """
    mask = torch.ones(new_len, kv_len + new_len, dtype=torch.bool, device=device).tril(kv_len)
    return mask.triu(kv_len - window + 1) if window else mask


class DraftCache:
    """The stable draft KV and the committed positions the draft has not run yet.

    Worked example: prompt ``[a, b, c]`` with target features ``[f0, f1, f2]`` and first root ``d``:
    ``pending(d)`` = features ``[f0, f1, f2]``, tokens ``[b, c, d]``, positions ``[0, 1, 2]``; after
    ``advance(kv)`` the stable KV holds 3 positions. Then ``commit([d, e], [fd, fe])`` (root d and one accepted
    draft e) and next root ``g``: ``pending(g)`` = features ``[fd, fe]``, tokens ``[e, g]``, positions ``[3, 4]``.
    With ``window`` 2 the stable KV keeps positions 1 and 2 after the first ``advance`` (``length`` stays 3).
    """

    def __init__(self, window: int = 0):
        check_draft_window(window)
        self.window = window                       # 0: the whole context; W > 0: the draft's attention window
        self.kv: DraftKV | None = None
        self.length = 0                            # positions the draft has run (the stable KV's last W of them)
        self.features: torch.Tensor | None = None  # [n, H] committed target features not yet run through the draft
        self.tokens: torch.Tensor | None = None    # [n - 1] the tokens that follow them (the root excluded)

    @property
    def kv_length(self) -> int:
        """Positions held in the stable KV (``length``, or its last ``window`` positions)."""
        return 0 if self.kv is None else self.kv.length

    def reset(self, prompt_ids: torch.Tensor, hidden: torch.Tensor) -> None:
        """A new turn: ``prompt_ids [1, P]`` with their features ``hidden [P, H]``; the stable KV is dropped."""
        self.kv = None
        self.length = 0
        self.features = hidden            # [P, H]: f_0 .. f_{P-1}
        self.tokens = prompt_ids[0, 1:]   # [P-1]: x_1 .. x_{P-1}; x_P (the root) comes with pending()

    def commit(self, tokens: list[int], hidden: torch.Tensor) -> None:
        """``tokens`` = [root] + accepted drafts were committed, with their features ``hidden [A, H]``."""
        self.features = hidden
        self.tokens = upload(tokens[1:], hidden.device)  # queued without a stream synchronisation

    def pending(self, root: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pairs to run next: (features [n, H], tokens [n] (the last one is ``root``), positions [n])."""
        feats = self.features
        root_t = torch.full((1,), root, dtype=torch.long, device=feats.device)  # a fill kernel, not a copy
        tokens = torch.cat([self.tokens.to(feats.device), root_t])
        pos = torch.arange(self.length, self.length + feats.shape[0], device=feats.device)
        return feats, tokens, pos

    def pending_mask(self, device: torch.device) -> torch.Tensor:
        """The draft's mask for the pending pairs after the stable KV, bool ``[n, kv_length + n]``
        (:func:`default_draft_mask`: causal, within the window)."""
        return default_draft_mask(self.features.shape[0], self.kv_length, device, self.window)

    def advance(self, kv: DraftKV) -> None:
        """The draft ran the pending pairs: ``kv`` is the stable KV followed by them (with a window, only its last
        ``window`` positions are kept: no later query sees an older one)."""
        n = self.features.shape[0]
        if kv.length != self.kv_length + n:
            raise ValueError(f"DraftCache.advance: expected a KV of {self.kv_length + n} positions, got {kv.length}")
        self.kv = kv.tail(self.window) if self.window else kv
        self.length += n

    def stable_columns(self, rows: int, device: torch.device) -> torch.Tensor:
        """Bool ``[rows, kv_length]`` of True: every tree node sees the whole stable KV (within a window: the last
        ``window`` committed positions)."""
        return torch.ones(rows, self.kv_length, dtype=torch.bool, device=device)
