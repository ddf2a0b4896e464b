"""A reduced draft vocabulary: the draft scores only the N most frequent tokens of its training data.

Why: an EAGLE-style draft turns every predicted feature into logits through the target's ``lm_head``
(V x H). For a small target that pass dominates the draft: SmolLM2-135M has V = 49,152 and H = 576, so its
lm_head is 28 M of the 135 M weights and about 85% of one EAGLE draft forward. EAGLE-3 restricts its draft to a
32k-token vocabulary (its ``d2t``/``t2d`` maps) for the same reason. Here the restriction needs no retraining:
the head still predicts a feature, and only the rows of the target's lm_head for the N kept tokens are scored.

Lossless by construction: the draft only proposes; verification runs on the target's full distribution. At T=0
the draft's top-k is the full top-k restricted to the kept tokens; at T>0 the sampled-draft rule uses the draft's
actual distribution q (zero outside the kept tokens), and the q-corrected rejection rule is exact for any q.

Token frequencies come from the training data (:func:`token_counts`: the tokens at loss positions, i.e. the
assistant tokens the draft learned to predict) and are stored beside a head as ``token_counts.json``
(``{"vocab_size": V, "counts": [V integers]}``). The option ``draft_vocab=N`` of the EAGLE/Jakiro methods keeps the
top N.

Why JSON and not safetensors: a head folder is also loaded by serving engines, and vLLM reads every
``*.safetensors`` file in it as weights (a ``token_counts.safetensors`` beside the head fails its load with "no
module or parameter named 'counts'"); a subfolder would not be safe either, since download filters such as
``*.safetensors`` match paths inside subfolders. No engine reads a ``.json`` file it does not name as weights, so the
counts ride along with the head unchanged. Integers are exact in JSON, and the file stays readable.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

COUNTS_FILE = "token_counts.json"


def token_counts(input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs at a loss position: ids, mask ``[T]`` -> int64 ``[vocab_size]``.

    Example: ids [5, 7, 5, 2], mask [1, 1, 1, 0], vocab 8 -> counts[5] = 2, counts[7] = 1, counts[2] = 0.
    """
    ids = input_ids.long()[loss_mask.bool()]
    return torch.bincount(ids, minlength=vocab_size)[:vocab_size].to(torch.int64)


def top_tokens(counts: torch.Tensor, n: int) -> torch.Tensor:
    """Sorted ids of the ``n`` most frequent tokens (ties broken by the smaller id): ``[V]`` -> int64 ``[n]``.

    Example: counts [0, 5, 5, 1], n 2 -> [1, 2]; n 3 -> [1, 2, 3].
    """
    if not 1 <= n <= counts.shape[0]:
        raise ValueError(f"draft vocabulary size must be in [1, {counts.shape[0]}], got {n}")
    V = counts.shape[0]
    key = counts.double() * V + (V - 1 - torch.arange(V, dtype=torch.double))  # frequency first, then smaller id
    return torch.sort(torch.topk(key, n).indices).values


def save_counts(counts: torch.Tensor, folder: str | Path) -> Path:
    """Write ``counts`` (``[V]``) as :data:`COUNTS_FILE` in ``folder``; returns the file."""
    path = Path(folder) / COUNTS_FILE
    values = [int(c) for c in counts.to(torch.int64).tolist()]
    path.write_text(json.dumps({"vocab_size": len(values), "counts": values}, separators=(",", ":")) + "\n")
    return path


def load_counts(folder: str | Path, vocab_size: int) -> torch.Tensor:
    """The counts stored beside a head (int64 ``[vocab_size]``); a clear error when they are missing, malformed or
    were made for another vocabulary."""
    path = Path(folder) / COUNTS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder}: no {COUNTS_FILE}; option draft_vocab needs the token frequencies of the head's training data "
            f"(`draftbench train` writes them; for another head run "
            f"`draftbench data vocab --data FEATURES --out {folder}`), or use draft_vocab=0 (the full vocabulary)")
    try:
        values = json.loads(path.read_text(encoding="utf-8")).get("counts")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: not a token-counts file ({e})") from None
    ok = isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
    if not ok or len(values) != vocab_size:
        got = f"{len(values)} counts" if ok else "no list of non-negative integers"
        raise ValueError(f"{path}: expected key 'counts' of shape ({vocab_size},) (the target's vocabulary), got {got}")
    return torch.tensor(values, dtype=torch.int64)


class DraftLMHead(nn.Module):
    """The target's ``lm_head`` as the draft sees it: all V rows, or only the rows of ``token_ids``.

    ``forward(features [..., H]) -> logits [..., V]``; with ``token_ids`` ([N], sorted) only those N logits are
    computed and every other token gets -inf, so callers (top-k, log-softmax, sampling) are unchanged and never
    pick a token outside the draft vocabulary. Costs N x H instead of V x H multiply-adds per row.
    Example: V = 4, token_ids [1, 3] -> logits [-inf, l1, -inf, l3].
    """

    def __init__(self, lm_head: nn.Module, token_ids: torch.Tensor | None = None):
        super().__init__()
        self.full = lm_head
        self.token_ids = None if token_ids is None else token_ids.to(lm_head.weight.device, torch.long)
        if self.token_ids is not None:
            self.sub_weight = lm_head.weight.detach()[self.token_ids].contiguous()  # [N, H]
            bias = getattr(lm_head, "bias", None)
            self.sub_bias = None if bias is None else bias.detach()[self.token_ids].contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The full lm_head weight ``[V, H]`` (shape queries: V is still the vocabulary)."""
        return self.full.weight

    @property
    def size(self) -> int:
        """Number of tokens the draft can propose."""
        return self.full.weight.shape[0] if self.token_ids is None else int(self.token_ids.shape[0])

    def compact(self, features: torch.Tensor) -> torch.Tensor:
        """Logits of the kept tokens only, ``[..., N]`` (column j = token ``token_ids[j]``; all V without a
        restriction). Softmax over them is the distribution renormalised to the draft vocabulary (training)."""
        if self.token_ids is None:
            return self.full(features)
        return F.linear(features, self.sub_weight, self.sub_bias)

    def token_of(self, columns: torch.Tensor) -> torch.Tensor:
        """Token id of each column of :meth:`compact`'s output (the inverse of :meth:`columns`).
        Example: kept [1, 3] -> columns [1, 0] -> [3, 1]."""
        return columns if self.token_ids is None else self.token_ids[columns]

    def argmax(self, features: torch.Tensor) -> torch.Tensor:
        """The draft's top-1 token id (in the full vocabulary) of every row: ``[..., H] -> [...]``."""
        return self.token_of(self.compact(features).argmax(-1))

    def columns(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Column of each token in :meth:`compact`'s output, -1 for a token outside the draft vocabulary.
        Example: kept [1, 3] -> tokens [3, 2, 1] -> [1, -1, 0]."""
        if self.token_ids is None:
            return token_ids
        where = torch.full((self.full.weight.shape[0],), -1, dtype=torch.long, device=token_ids.device)
        where[self.token_ids.to(token_ids.device)] = torch.arange(self.token_ids.shape[0], device=token_ids.device)
        return where[token_ids]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.token_ids is None:
            return self.full(features)
        sub = self.compact(features)  # [..., N]
        out = sub.new_full((*sub.shape[:-1], self.full.weight.shape[0]), float("-inf"))  # [..., V]
        return out.index_copy_(-1, self.token_ids, sub)


def check_draft_vocab(size, top_k: int = 1) -> None:
    """Option ``draft_vocab``: 0 (full vocabulary) or at least ``top_k`` tokens."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or 0 < size < top_k:
        raise ValueError(f"draft_vocab must be 0 (the full vocabulary) or an integer >= top_k ({top_k}), got {size!r}")


def draft_lm_head(lm_head: nn.Module, size: int, folder: str | Path | None, method: str) -> DraftLMHead:
    """``DraftLMHead`` for option ``draft_vocab=size`` (0 = the full vocabulary) of ``method``'s head in
    ``folder``; a missing or mismatched counts file is an :class:`harness.engine.method.OptionsError` naming the
    method."""
    from harness.engine.method import OptionsError

    V = lm_head.weight.shape[0]
    if size > V:
        raise OptionsError(f"method {method!r}: draft_vocab={size} is more than the target's vocabulary of {V} tokens "
                           "(0 scores the whole vocabulary)")
    if size == 0 or size == V:
        return DraftLMHead(lm_head)
    try:
        if folder is None:
            raise ValueError("option draft_vocab needs a head loaded from a folder (its token_counts.json)")
        return DraftLMHead(lm_head, top_tokens(load_counts(folder, V), size))
    except (FileNotFoundError, ValueError) as e:
        raise OptionsError(f"method {method!r}: {e}") from None
