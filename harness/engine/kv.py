"""Keeping the target's KV cache equal to the committed sequence after a tree verification.

The verification forward appends all ``N + 1`` tree slots to the cache after the ``prev_len`` committed positions.
Only the root and the accepted path survive; their K/V are moved to the contiguous positions right after the
prefix and everything else is dropped. K/V of a slot do not depend on where they sit in memory (the position is
already rotated into the keys), so the result equals the cache of running the accepted tokens directly.
"""

from __future__ import annotations

import torch


def compact_cache(cache, prev_len: int, keep: torch.Tensor | list[int]) -> None:
    """Keep tree slots ``keep`` (0 = root; in this order) after the first ``prev_len`` positions of every layer.

    Works in place on a transformers ``DynamicCache`` (``cache.layers[i].keys/.values`` shaped
    ``[B, n_kv_heads, S, head_dim]``). Example: prev_len 5, 4 tree slots (S = 9), keep [0, 2] -> positions
    [0..4, 5, 7] remain (S = 7).
    """
    keep_list = keep.tolist() if isinstance(keep, torch.Tensor) else list(keep)
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"compact_cache needs a transformers DynamicCache with .layers, got {type(cache).__name__}")
    contiguous = keep_list == list(range(len(keep_list)))
    for i, layer in enumerate(layers):
        if getattr(layer, "is_sliding", False):
            raise TypeError(f"cache layer {i} is a sliding-window layer ({type(layer).__name__}); tree compaction "
                            "needs full (DynamicLayer) caches")
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        seq = layer.keys.shape[-2]
        if keep_list and (min(keep_list) < 0 or prev_len + max(keep_list) >= seq):
            raise ValueError(f"compact_cache: keep {keep_list} is out of range for layer {i} with {seq} positions "
                             f"and prev_len {prev_len}")
        end = prev_len + len(keep_list)
        if contiguous:
            layer.keys = layer.keys[:, :, :end]
            layer.values = layer.values[:, :, :end]
            continue
        idx = torch.tensor(keep_list, dtype=torch.long, device=layer.keys.device) + prev_len  # [A]
        # index_select copies the kept slots first, so the in-place write cannot read what it overwrites
        layer.keys[:, :, prev_len:end] = layer.keys.index_select(2, idx)
        layer.values[:, :, prev_len:end] = layer.values.index_select(2, idx)
        layer.keys = layer.keys[:, :, :end]
        layer.values = layer.values[:, :, :end]
