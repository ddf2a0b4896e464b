"""The method ``layer_skip``: self-speculative decoding by layer skipping, training-free: the target drafts with a
subset of its own decoder layers (Draft & Verify, Zhang et al., arXiv:2309.08168; SWIFT, Xia et al.,
arXiv:2410.06916; the drafting pass of LayerSkip, Elhoushi et al., arXiv:2404.16710, which drafts with the first
layers and needs its training recipe to pay off). The papers' sections are named below by their titles.

Drafting runs the target's own modules: for the draft forwards ``model.get_decoder().layers`` is swapped for a
``ModuleList`` of the kept layers and put back afterwards (:meth:`LayerSkip.skipping`), so no model code is copied. A
decoder layer writes its K/V into the cache slot of its own ``layer_idx``, so the draft shares the target's cache
where the layers overlap: a kept layer attends to the target's K/V of the committed text (computed by the full
model) and appends the drafted positions' K/V after them; a skipped layer's slot is untouched (its K/V for drafted
positions is simply absent, as in the papers). Each draft forward passes its position id and an explicit 4D mask
(the committed text + the drafts so far), so nothing reads the length of a skipped layer's slot. After the chain
every kept layer is cropped back to the committed length, so the engine's verification forward (one target forward
over all layers, :mod:`harness.engine.speculative`) finds the cache exactly as it left it and recomputes every layer
over the drafted positions; the compaction of :mod:`harness.engine.kv` then keeps the accepted ones.

- T = 0: the chain is the skipping model's greedy continuation; verification keeps the prefix equal to the target's
  argmax, so the output is the target's greedy output.
- T > 0: each draft token is drawn from the skipping model's distribution shaped like the target's, and the chain
  carries those rows as ``draft_probs`` ("sampled" proposal, as :mod:`methods.sps`), so the engine's rejection rule
  emits exactly the target's distribution.

Options. ``skip_layers``: the skipped decoder layers (0-based, checked against the target's layer count). Otherwise
``skip_ratio`` (default 0.45, SWIFT's) picks ``round(skip_ratio * L)`` of the L layers, spread evenly over the
middle layers with the first and the last kept (:func:`interleaved_skip`): SWIFT's initial layer set (every other
layer from 1 to L - 2, arXiv:2410.06916, "context-based layer set optimization") is what a ratio near 0.5
gives (L = 30, 0.45: layers 1, 3, ..., 27). Whole layers are skipped (Draft & Verify and SWIFT choose attention and
MLP sub-layers separately); SWIFT's on-the-fly Bayesian search of the set is not implemented. ``k`` (default 25)
is the longest chain and ``stop_threshold`` (default 0.8) ends it after the first draft token whose top-1
probability is below it (SWIFT's "confidence-aware inference acceleration", arXiv:2410.06916, with those two
values; Draft & Verify's "adaptive draft-exiting mechanism", arXiv:2309.08168, adapts the threshold instead); 0 turns
the early stop off, and with it the one host read per draft token it costs.

Sliding-window layers: after the prefill the engine switches their past recording on (:func:`harness.engine.kv.
prepare_cache`), so a kept sliding layer keeps the drafted positions after its ``window - 1`` committed ones and the
crop rolls it back exactly; a decoder that reads layer i's type as ``config.layer_types[i]`` (Qwen2, Gemma 2/3) gets
the kept layers' types while the layers are swapped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.speculative import SpeculativeMethod, layer_types
from harness.engine.tree import DraftTree, chain_tree
from harness.models import Target
from harness.registry import register_method

DEFAULT_SKIP_RATIO = 0.45  # SWIFT's (arXiv:2410.06916, its experimental setup)


def interleaved_skip(num_layers: int, ratio: float) -> list[int]:
    """``round(ratio * num_layers)`` layers spread evenly over the middle layers 1 .. L - 2 (the first and the last
    are kept; a 2-layer model may skip its last), at most all of them.
    Examples: (30, 0.45) -> [1, 3, 5, ..., 27] (14 layers); (30, 0.2) -> [1, 5, 10, 15, 19, 24]; (2, 0.5) -> [1];
    (1, 0.5) -> []."""
    candidates = list(range(1, num_layers - 1)) if num_layers > 2 else list(range(1, num_layers))
    n = min(round(ratio * num_layers), len(candidates))
    return [candidates[i * len(candidates) // n] for i in range(n)]


@dataclass
class LayerSkipOptions:
    """``skip_layers``: the skipped decoder layers (0-based); ``skip_ratio``: else the share of layers skipped in the
    interleaved pattern (default 0.45; give one of the two); ``k``: the longest draft chain; ``stop_threshold``:
    end the chain after a draft token whose top-1 probability is below it (0: never)."""

    skip_layers: list[int] | None = None
    skip_ratio: float | None = None
    k: int = 25
    stop_threshold: float = 0.8

    def __post_init__(self):
        if self.skip_layers is not None:
            if self.skip_ratio is not None:
                raise ValueError("give skip_layers or skip_ratio, not both")
            bad = [i for i in self.skip_layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
            if bad:
                raise ValueError(f"skip_layers must be layer indices >= 0, got {bad[0]!r}")
            if len(set(self.skip_layers)) != len(self.skip_layers):
                raise ValueError(f"skip_layers names a layer twice: {self.skip_layers}")
        if self.skip_ratio is not None and not 0.0 <= self.skip_ratio < 1.0:
            raise ValueError(f"skip_ratio must be in [0, 1), got {self.skip_ratio}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 127:
            raise ValueError(f"k must be an integer in [1, 127] (a verification takes 128 slots), got {self.k!r}")
        if not 0.0 <= self.stop_threshold <= 1.0:
            raise ValueError(f"stop_threshold must be in [0, 1], got {self.stop_threshold}")


@register_method("layer_skip")
class LayerSkip(SpeculativeMethod):
    """Self-speculation (SWIFT arXiv:2410.06916): the target drafts a chain with some of its layers skipped.

    Lossless at every temperature; see the module docstring."""

    Options = LayerSkipOptions

    def __init__(self, target: Target, options=None):
        super().__init__(target, options)
        where = f"method {self.name!r}"
        decoder = target.model.get_decoder()
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise OptionsError(f"{where}: the target's decoder ({type(decoder).__name__}) has no ModuleList "
                               "`layers` to skip layers of")
        n = len(layers)
        if self.options.skip_layers is not None:
            skip = sorted(self.options.skip_layers)
            if skip and skip[-1] >= n:
                raise OptionsError(f"{where}: option skip_layers: layer {skip[-1]} does not exist, the target has {n} "
                                   f"decoder layers (0..{n - 1})")
        else:
            ratio = DEFAULT_SKIP_RATIO if self.options.skip_ratio is None else self.options.skip_ratio
            skip = interleaved_skip(n, ratio)
        if len(skip) >= n:
            raise OptionsError(f"{where}: option skip_layers skips all {n} decoder layers; keep at least one")
        self.decoder = decoder
        self.config = decoder.config  # the config the decoder reads layer_types from
        types = layer_types(target.model.config) or ["full_attention"] * n
        self.skipped = skip
        self.kept = [i for i in range(n) if i not in set(skip)]
        self.kept_layers = nn.ModuleList([layers[i] for i in self.kept])
        self.kept_types = [types[i] for i in self.kept]  # what layer_types says of the kept layers, in their order
        self.per_type = len(set(types)) > 1  # a mixed target takes a mask per attention type
        # the first kept layer of each attention type: its cache slot sizes the draft mask of that type
        self.first_kept = {}
        for i, kind in zip(self.kept, self.kept_types):
            self.first_kept.setdefault(kind, i)
        self._proposal = "deterministic"
        self.cache = None   # the target's cache of the current turn (the engine's)
        self.committed = 0  # positions in it

    @classmethod
    def example(cls, target: Target, seed: int = 0, **options: Any) -> LayerSkip:
        """The method as :meth:`create` builds it, except that ``k`` is 5 and ``stop_threshold`` 0 unless given: a
        random test target is never confident, so the published 0.8 would end every chain after one token and the
        tests' oracle and partial accepts would not reach a longer chain. Nothing is learned, so ``seed`` is unused."""
        return cls.create(target, {"k": 5, "stop_threshold": 0.0, **options})

    @property
    def proposal(self) -> str:  # type: ignore[override]
        return self._proposal

    def describe(self) -> dict[str, Any]:
        """The options plus the layers actually skipped (from ``skip_ratio`` when ``skip_layers`` is not given)."""
        return {**super().describe(), "skipped_layers": list(self.skipped)}

    # ---- the target's cache ----------------------------------------------------------------------------------------
    def turn_cache(self, cache: object) -> None:
        self.cache = cache  # the draft forwards append to its kept layers and crop them back

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.committed = prompt_ids.shape[1]

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        self.committed += len(tokens)

    # ---- drafting ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def skipping(self) -> Iterator[None]:
        """Within the block the target's decoder runs only the kept layers (its own modules, each writing the cache
        slot of its own ``layer_idx``). A decoder that reads layer i's attention type as ``config.layer_types[i]``
        (Qwen2, Gemma 2/3) sees the kept layers' types in the same order."""
        layers, types = self.decoder.layers, getattr(self.config, "layer_types", None)
        self.decoder.layers = self.kept_layers
        if types is not None:
            self.config.layer_types = self.kept_types
        try:
            yield
        finally:
            self.decoder.layers = layers
            if types is not None:
                self.config.layer_types = types

    def draft_masks(self, position: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The ``attention_mask`` of a draft forward of one token at ``position``: per attention type, ``[1, 1, 1,
        kv]`` with kv the key length a kept layer of that type attends to (transformers' ``get_mask_sizes``: the
        committed text and the drafts so far; a sliding layer's last ``window`` positions, all inside its window; a
        static cache's whole buffer, whose slots after ``position`` are blocked). A dict keyed by type when the
        target mixes types (as :func:`harness.engine.kv.verification_masks`)."""
        device, dtype = self.target.device, self.target.dtype
        masks = {}
        for kind, layer in self.first_kept.items():
            kv = self.cache.get_mask_sizes(1, layer)[0]
            blocked = torch.arange(kv, device=device) > position
            masks[kind] = torch.zeros(kv, dtype=dtype, device=device).masked_fill(
                blocked, torch.finfo(dtype).min).view(1, 1, 1, kv)
        return masks if self.per_type else masks[self.kept_types[0]]

    def draft_forward(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """The skipping model over ``token [1]`` at ``position`` (after the committed text and the drafts so far in
        the kept layers' cache); its logits ``[V]``."""
        device = self.target.device
        mask = self.draft_masks(position)
        pos = torch.full((1, 1), position, dtype=torch.long, device=device)
        with self.skipping():
            out = self.target.model(token.view(1, 1).to(device), cache=self.cache, use_cache=True,
                                    attention_mask=mask, position_ids=pos, logits_to_keep=1)
        self.counters["draft_forwards"] = self.counters.get("draft_forwards", 0) + 1
        return out.logits[0, -1]

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """A chain of at most ``k`` draft tokens below ``root``, ended after the first token whose draft top-1
        probability is below ``stop_threshold``; the kept layers are cropped back to the committed text after it."""
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        token = torch.full((1,), root, dtype=torch.long, device=self.target.device)
        tokens, rows, run, stop = [], [], 0, self.options.stop_threshold
        try:
            for i in range(self.options.k):
                logits = self.draft_forward(token, self.committed + i)
                run += 1
                if sampling.greedy:
                    token = logits.argmax(-1).view(1)
                    q = logits.softmax(-1) if stop else None  # [V] for the confidence only
                else:
                    q = logits_to_probs(logits, sampling)  # [V] the draft's shaped distribution
                    on = generator.device if generator is not None else q.device  # draw where the generator lives
                    token = torch.multinomial(q.to(on), 1, generator=generator).to(q.device)
                    rows.append(q)
                tokens.append(token)
                if stop and i < self.options.k - 1 and float(q.max()) < stop:  # SWIFT's confidence-aware stop
                    break
        finally:
            for i in self.kept:  # the drafted positions leave the kept layers: the target's cache is as it was
                self.cache.layers[i].crop(-run)
        chain = torch.cat(tokens).to(self.target.output_device)
        probs = None
        if rows:
            rows.append(torch.zeros_like(rows[0]))  # the last node has no children
            probs = torch.stack(rows).to(self.target.output_device)  # [n + 1, V]
        return chain_tree(chain, probs)
