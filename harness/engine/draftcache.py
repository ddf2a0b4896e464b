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


def default_draft_mask(new_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Bool mask [new_len, kv_len + new_len]: every new position sees the whole KV and is causal inside its block.

    Example: new_len=2, kv_len=1 -> [[1, 1, 0], [1, 1, 1]].
    """
    return torch.ones(new_len, kv_len + new_len, dtype=torch.bool, device=device).tril(kv_len)


class DraftCache:
    """The stable draft KV and the committed positions the draft has not run yet.

    Worked example: prompt ``[a, b, c]`` with target features ``[f0, f1, f2]`` and first root ``d``:
    ``pending(d)`` = features ``[f0, f1, f2]``, tokens ``[b, c, d]``, positions ``[0, 1, 2]``; after
    ``advance(kv)`` the stable KV holds 3 positions. Then ``commit([d, e], [fd, fe])`` (root d and one accepted
    draft e) and next root ``g``: ``pending(g)`` = features ``[fd, fe]``, tokens ``[e, g]``, positions ``[3, 4]``.
    """

    def __init__(self):
        self.kv: DraftKV | None = None
        self.features: torch.Tensor | None = None  # [n, H] committed target features not yet run through the draft
        self.tokens: torch.Tensor | None = None    # [n - 1] the tokens that follow them (the root excluded)

    @property
    def length(self) -> int:
        """Positions in the stable KV."""
        return 0 if self.kv is None else self.kv.length

    def reset(self, prompt_ids: torch.Tensor, hidden: torch.Tensor) -> None:
        """A new turn: ``prompt_ids [1, P]`` with their features ``hidden [P, H]``; the stable KV is dropped."""
        self.kv = None
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

    def advance(self, kv: DraftKV) -> None:
        """The draft ran the pending pairs: ``kv`` is the stable KV followed by them."""
        n = self.features.shape[0]
        if kv.length != self.length + n:
            raise ValueError(f"DraftCache.advance: expected a KV of {self.length + n} positions, got {kv.length}")
        self.kv = kv

    def stable_columns(self, rows: int, device: torch.device) -> torch.Tensor:
        """Bool ``[rows, length]`` of True: every tree node sees the whole stable KV."""
        return torch.ones(rows, self.length, dtype=torch.bool, device=device)
