"""The target's KV cache during tree verification: which attention each layer does, and keeping the cache equal to
the committed sequence after a verification forward.

The verification forward appends all ``N + 1`` tree slots to every layer after its committed positions. Only the
root and the accepted path survive; their K/V are moved right after the committed ones and everything else is
dropped. K/V of a slot do not depend on where they sit in memory (the position is already rotated into the keys),
so the result equals the cache of running the accepted tokens directly.

Sliding-window layers (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``...) use transformers'
``DynamicSlidingWindowLayer``, which keeps only the last ``window - 1`` positions. :func:`prepare_cache` switches
their *past recording* on after the prefill (transformers' own mechanism for rolling a sliding cache back), so a
verification forward appends the tree after the ``window - 1`` committed positions instead of cutting the
committed ones; :func:`compact_cache` then keeps the accepted slots and cuts the layer back to ``window - 1``
positions, with ``cumulative_length`` = the committed length, exactly the state vanilla decoding would have.

A transformers ``StaticCache`` (the compiled runtime's static flavour, :mod:`harness.engine.runtime`) keeps fixed
``[B, H, max_cache_len, D]`` buffers and writes each forward at ``cumulative_length`` (a tensor, so that compiled
graphs do not specialise on it); compaction moves the kept slots inside the buffer and sets ``cumulative_length``
to the committed length in place. The positions beyond it hold stale K/V, which every mask blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.hostio import upload
from harness.engine.tree import windowed_tree_mask

# cache layer types whose attention the tree masks reproduce (transformers' ``layer_types`` names)
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class AttentionLayout:
    """Which attention every layer of the target does, as the verification masks need it.

    ``types``: the layer types present, in first-seen order (``"full_attention"``, ``"sliding_attention"``);
    ``window``: type -> sliding window (None for full attention); ``first_layer``: type -> the index of its first
    layer (whose cache tells how many committed positions that type keeps); ``per_type``: pass the masks as a dict
    keyed by layer type (models with mixed layers: Gemma 2/3, Qwen2/3 with sliding layers) rather than one tensor.
    """

    types: tuple[str, ...]
    window: dict[str, int | None]
    first_layer: dict[str, int]

    @property
    def per_type(self) -> bool:
        return len(self.types) > 1


def attention_layout(cache) -> AttentionLayout:
    """The :class:`AttentionLayout` of a transformers ``DynamicCache`` built from the model config
    (``DynamicCache(config=...)``): full layers are ``DynamicLayer``, sliding ones ``DynamicSlidingWindowLayer``; a
    ``StaticCache``'s full layers are ``StaticLayer`` (its sliding layers are refused).

    Raises ``ValueError`` naming the layer for anything the tree masks do not reproduce (chunked attention,
    linear-attention / recurrent layers) and for two windows under one layer type.
    """
    types: list[str] = []
    window: dict[str, int | None] = {}
    first: dict[str, int] = {}
    for i, layer in enumerate(getattr(cache, "layers", [])):
        kind = type(layer).__name__
        if kind in ("DynamicLayer", "StaticLayer"):
            name, w = "full_attention", None
        elif kind == "DynamicSlidingWindowLayer":
            name, w = "sliding_attention", int(layer.sliding_window)
        else:
            raise ValueError(f"target layer {i} keeps a {kind} cache; tree verification supports full and "
                             "sliding-window attention layers only (not chunked, linear or recurrent layers)")
        if name in window and window[name] != w:
            raise ValueError(f"target layer {i} has sliding window {w} but layer {first[name]} has {window[name]}; "
                             "one window per layer type is supported")
        if name not in window:
            types.append(name)
            window[name] = w
            first[name] = i
    return AttentionLayout(tuple(types), window, first)


def check_layer_types(layer_types) -> None:
    """Refuse a config whose ``layer_types`` name attention the tree masks cannot express (e.g. chunked)."""
    for i, t in enumerate(layer_types or []):
        if t not in SUPPORTED_LAYER_TYPES:
            raise ValueError(f"target layer {i} is of type {t!r}; tree verification supports "
                             f"{' and '.join(SUPPORTED_LAYER_TYPES)} layers only")


def prepare_cache(cache) -> None:
    """After the prefill: sliding-window layers keep the past of the next forward until :func:`compact_cache`."""
    for layer in getattr(cache, "layers", []):
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()


def verification_masks(layout: AttentionLayout, cache, ancestors: torch.Tensor, depth: torch.Tensor, committed: int,
                       dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """The ``attention_mask`` argument of a verification forward: one mask, or a dict per layer type (see
    :mod:`harness.engine.speculative`). A sliding layer type's mask covers the committed positions its cache holds."""
    masks = {}
    for kind in layout.types:
        window = layout.window[kind]
        kept = committed if window is None else cached_length(cache, layout.first_layer[kind])
        masks[kind] = windowed_tree_mask(ancestors, depth, committed, kept, window, dtype)
    return masks if layout.per_type else masks[layout.types[0]]


def static_cache_length(tokens: int, minimum: int = 1024) -> int:
    """``max_cache_len`` of a static cache for a turn of ``tokens`` positions (prompt, new tokens, tree slots): the
    next power of two, at least ``minimum``, so that few cache shapes (and compiled graphs) exist.
    Examples: (300, 1024) -> 1024; (1500, 1024) -> 2048; (4096, 1024) -> 4096."""
    if tokens < 1:
        raise ValueError(f"a cache must hold at least one position, got {tokens}")
    return max(minimum, 1 << (tokens - 1).bit_length())


def cached_length(cache, layer: int) -> int:
    """Positions currently held by cache layer ``layer`` (a sliding layer holds at most ``window - 1``)."""
    entry = cache.layers[layer]
    if not getattr(entry, "is_initialized", True) or entry.keys is None:
        return 0
    return int(entry.keys.shape[-2])


def compact_cache(cache, prev_len: int, keep: torch.Tensor | list[int]) -> None:
    """Keep tree slots ``keep`` (0 = root; in this order) after the ``prev_len`` committed positions of every layer.

    Works in place on a transformers ``DynamicCache`` (``cache.layers[i].keys/.values`` shaped
    ``[B, n_kv_heads, S, head_dim]``) or ``StaticCache`` (fixed S; ``cumulative_length`` becomes prev_len + kept).
    Example: prev_len 5, 4 tree slots (S = 9), keep [0, 2] -> positions [0..4, 5, 7] remain (S = 7).
    A sliding-window layer (past recording on, see :func:`prepare_cache`) holds fewer committed positions than
    ``prev_len``; its tree slots are the last ``cumulative_length - prev_len`` entries, and after the selection it
    is cut back to its last ``window - 1`` positions.

    ``keep`` is a host list (or tensor, read once); the index goes to each device once (not once per layer) and is
    uploaded without synchronising the stream.
    """
    keep_list = keep.tolist() if isinstance(keep, torch.Tensor) else list(keep)
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"compact_cache needs a transformers DynamicCache with .layers, got {type(cache).__name__}")
    contiguous = keep_list == list(range(len(keep_list)))
    index: dict[tuple[torch.device, int], torch.Tensor] = {}
    for i, layer in enumerate(layers):
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        static = type(layer).__name__ == "StaticLayer"
        seq = layer.keys.shape[-2]  # positions held (a static buffer's whole length: its fill is not read back)
        sliding = getattr(layer, "is_sliding", False)
        if sliding:
            if static or not layer.record_past:
                raise ValueError(f"compact_cache: sliding-window layer {i} does not record its past; call "
                                 "prepare_cache after the prefill (static sliding caches are not supported)")
            base = seq - (layer.cumulative_length - prev_len)  # committed positions this layer holds
        else:
            base = prev_len
        if keep_list and (min(keep_list) < 0 or base + max(keep_list) >= seq):
            raise ValueError(f"compact_cache: keep {keep_list} is out of range for layer {i} with {seq} positions "
                             f"and prev_len {prev_len}")
        end = base + len(keep_list)
        if not contiguous:
            key = (layer.keys.device, base)
            if key not in index:
                index[key] = upload([k + base for k in keep_list], layer.keys.device)  # [A]
            idx = index[key]
            # index_select copies the kept slots first, so the in-place write cannot read what it overwrites
            layer.keys[:, :, base:end] = layer.keys.index_select(2, idx)
            layer.values[:, :, base:end] = layer.values.index_select(2, idx)
        if static:  # fixed buffers: only the length moves (in place: compiled graphs hold the tensor)
            layer.cumulative_length.fill_(end)
            continue
        start = max(0, end - (layer.sliding_window - 1)) if sliding else 0
        layer.keys = layer.keys[:, :, start:end]
        layer.values = layer.values[:, :, start:end]
        if sliding:
            layer.cumulative_length = prev_len + len(keep_list)
