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
gives (L = 30, 0.45: layers 1, 3, ..., 27). ``skip_attn`` and ``skip_mlp`` skip sub-layers (Draft & Verify and
SWIFT choose attention and MLP sub-layers separately, arXiv:2309.08168 Sec. 3.1 and arXiv:2410.06916 Sec. 4.1): a
skipped sub-layer adds nothing to the residual stream (its module is swapped for one that returns zeros for the
draft forwards, :class:`SkippedAttention` / :class:`SkippedMLP`), so a layer named in both is skipped whole; a layer
whose attention is skipped writes no K/V for drafted positions, as a skipped layer. Given alone they skip only what
they name (no ``skip_ratio`` default). ``k`` (default 25)
is the longest chain and ``stop_threshold`` (default 0.8) ends it after the first draft token whose top-1
probability is below it (SWIFT's "confidence-aware inference acceleration", arXiv:2410.06916, with those two
values; Draft & Verify's "adaptive draft-exiting mechanism", arXiv:2309.08168, adapts the threshold instead); 0 turns
the early stop off, and with it the one host read per draft token it costs. ``tree``: ``chain`` (default) verifies the
chain alone; ``confidence`` verifies SWIFT's tree (its released code, hemingkx/SWIFT@88caed7 ``get_choices_list``):
beside the chain token of each depth its draft's next-ranked candidates, 3 / 5 / 8 / 10 in all greedy (1 / 3 / 5 / 10
sampled, drawn without replacement) as the chain token's confidence is above 0.95 / 0.8 / 0.5 / not, so a wrong
chain token can still be replaced by a sibling (up to 1 + 10 k slots). The confidence is the draft's top-1
probability (at T > 0 the shaped distribution's; SWIFT's is the unshaped probability of the sampled token).

The set searched on the fly (``search``; SWIFT, arXiv:2410.06916, Sec. 4.1 "Context-based layer set optimization",
with its released defaults: window 32, 1000 candidates, patience 300, stop above matchness 0.95, every 25th candidate
Bayesian). Drafting starts from the set above; once more than ``search_window + 1`` tokens of a turn are committed,
every step scores one candidate set of as many layers, drawn among layers 1 .. L - 2: the skipping model runs once
over the turn's first ``search_window + 1`` tokens (after the prompt, in a copy of the prompt's cache taken at the
turn's start, as SWIFT clones its prefilled cache) and its *matchness* is the share of positions where its greedy
next token is the target's own (:mod:`methods.layer_skip.layersearch`). A candidate that beats the best matchness so far
drafts from the next step on. The target verifies every draft as before, so the output is unchanged at every
temperature; the search costs one forward of the skipping model and one host read per step while it runs
(``counters["search_forwards"]``), and a copy of the prompt's KV cache. ``search_space``: ``layers`` (default) moves
as many whole layers as the initial set skips; ``sub_layers`` is SWIFT's space, the attention and MLP sub-layers of
layers 1 .. L - 2 (``2 (L - 2)`` coordinates, :func:`methods.layer_skip.layersearch.sub_layer_ids`), each candidate
skipping ``int(2 (L - 2) skip_ratio)`` of them as SWIFT's ``swift_optimization`` (25 of 56 on a 30-layer model at
0.45), or as many as the given sets name. ``persist`` carries the search and its set
over turns and questions as SWIFT does (the manifest says ``order_dependent: true``); ``per_turn`` restarts it from
the initial set every turn. A turn's record holds ``method_notes``: the set it started with, each change (the first
verification step drafted with it, the set, its matchness) and the search's state.

Sliding-window layers: after the prefill the engine switches their past recording on (:func:`harness.engine.kv.
prepare_cache`), so a kept sliding layer keeps the drafted positions after its ``window - 1`` committed ones and the
crop rolls it back exactly; a decoder that reads layer i's type as ``config.layer_types[i]`` (Qwen2, Gemma 2/3) gets
the kept layers' types while the layers are swapped.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.engine.method import OptionsError
from harness.engine.runtime import bucket_slots
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.speculative import SpeculativeMethod, layer_types
from harness.engine.tree import CONFIDENCE_WIDTHS, DraftTree, chain_tree, confidence_widths, sibling_tree
from harness.models import Target
from harness.registry import register_method
from methods.layer_skip.layersearch import (
    bayes_skip,
    matchness,
    random_skip,
    skip_point,
    split_sub_layers,
    sub_layer_ids,
    sub_layer_sets,
)

DEFAULT_SKIP_RATIO = 0.45  # SWIFT's (arXiv:2410.06916, its experimental setup)
SET_OPTIONS = ("skip_layers", "skip_attn", "skip_mlp")  # options that name decoder layers
SEARCH_MODES = ("off", "persist", "per_turn")
SEARCH_SPACES = ("layers", "sub_layers")
TREE_SHAPES = ("chain", "confidence")
TREE_TOPK = 10  # the most candidates per depth of SWIFT's tree (hemingkx/SWIFT@88caed7 model/swift/utils.py TOPK)


def interleaved_skip(num_layers: int, ratio: float) -> list[int]:
    """``round(ratio * num_layers)`` layers spread evenly over the middle layers 1 .. L - 2 (the first and the last
    are kept; a 2-layer model may skip its last), at most all of them.
    Examples: (30, 0.45) -> [1, 3, 5, ..., 27] (14 layers); (30, 0.2) -> [1, 5, 10, 15, 19, 24]; (2, 0.5) -> [1];
    (1, 0.5) -> []."""
    candidates = list(range(1, num_layers - 1)) if num_layers > 2 else list(range(1, num_layers))
    n = min(round(ratio * num_layers), len(candidates))
    return [candidates[i * len(candidates) // n] for i in range(n)]


class SkippedAttention(nn.Module):
    """Stands in for a decoder layer's ``self_attn`` while it is skipped: the attention's update of the residual stream
    is zero (a Llama-style layer computes ``h + attn(norm(h))``; a Gemma-style post-norm of zeros is zero too), and it
    writes nothing into the cache. Returns what transformers' attention modules return: the output and no weights."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return torch.zeros_like(hidden_states), None


class SkippedMLP(nn.Module):
    """Stands in for a decoder layer's ``mlp`` while it is skipped: its update of the residual stream is zero."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


@dataclass
class LayerSkipOptions:
    """``skip_layers``: the skipped decoder layers (0-based); ``skip_ratio``: else the share of layers skipped in the
    interleaved pattern (default 0.45; give one of the two); ``skip_attn`` / ``skip_mlp``: layers whose attention / MLP
    sub-layer is skipped (a layer in both is skipped whole; not with ``skip_ratio``; a search moves them with
    ``search_space: sub_layers`` only); ``k``: the longest draft chain; ``stop_threshold``: end the chain after a draft
    token whose top-1 probability is below it (0: never). ``search``: SWIFT's on-the-fly search of the set (``off``;
    ``persist``: one search over the whole run, as SWIFT; ``per_turn``: started afresh from the initial set at every
    turn) with its budget: ``search_window`` tokens scored, at most ``search_iters`` candidates, stopped after
    ``search_patience`` candidates in a row that did not beat the best or once one scores above ``search_score``; every
    ``search_bayes_every``-th candidate from Bayesian optimization (0: random search only); ``search_seed`` seeds the
    candidates; ``search_space``: ``layers`` (whole layers) or ``sub_layers`` (SWIFT's: attention and MLP apart).
    ``tree``: ``chain`` drafts the chain alone; ``confidence`` adds SWIFT's ranked siblings beside each chain token (3 /
    5 / 8 / 10 candidates greedy, 1 / 3 / 5 / 10 sampled, by the chain token's confidence above 0.95 / 0.8 / 0.5 /
    otherwise)."""

    skip_layers: list[int] | None = None
    skip_ratio: float | None = None
    skip_attn: list[int] | None = None
    skip_mlp: list[int] | None = None
    k: int = 25
    stop_threshold: float = 0.8
    search: str = "off"
    search_window: int = 32
    search_iters: int = 1000
    search_patience: int = 300
    search_score: float = 0.95
    search_bayes_every: int = 25
    search_seed: int = 0
    search_space: str = "layers"
    tree: str = "chain"

    def __post_init__(self):
        for name in SET_OPTIONS:
            layers = getattr(self, name)
            if layers is None:
                continue
            if self.skip_ratio is not None:
                raise ValueError(f"give {name} or skip_ratio, not both")
            bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
            if bad:
                raise ValueError(f"{name} must be layer indices >= 0, got {bad[0]!r}")
            if len(set(layers)) != len(layers):
                raise ValueError(f"{name} names a layer twice: {layers}")
        whole = set(self.skip_layers or ())
        for name in SET_OPTIONS[1:]:
            both = sorted(whole & set(getattr(self, name) or ()))
            if both:
                raise ValueError(f"{name} names layer {both[0]}, which skip_layers skips whole")
        if self.search_space not in SEARCH_SPACES:
            raise ValueError(f"search_space must be one of {', '.join(SEARCH_SPACES)}, got {self.search_space!r}")
        if self.sub_layers and self.search != "off" and self.search_space == "layers":
            raise ValueError("search_space: layers moves whole layers; skip_attn and skip_mlp need search_space: "
                             "sub_layers (or search: off)")
        if self.skip_ratio is not None and not 0.0 <= self.skip_ratio < 1.0:
            raise ValueError(f"skip_ratio must be in [0, 1), got {self.skip_ratio}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 127:
            raise ValueError(f"k must be an integer in [1, 127] (a verification takes 128 slots), got {self.k!r}")
        if not 0.0 <= self.stop_threshold <= 1.0:
            raise ValueError(f"stop_threshold must be in [0, 1], got {self.stop_threshold}")
        if self.search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {', '.join(SEARCH_MODES)}, got {self.search!r}")
        for name, low in (("search_window", 1), ("search_iters", 1), ("search_patience", 1),
                          ("search_bayes_every", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.tree not in TREE_SHAPES:
            raise ValueError(f"tree must be one of {', '.join(TREE_SHAPES)}, got {self.tree!r}")
        if not 0.0 < self.search_score <= 1.0:
            raise ValueError(f"search_score must be in (0, 1], got {self.search_score}")

    @property
    def sub_layers(self) -> bool:
        """Whether a sub-layer is skipped (``skip_attn`` or ``skip_mlp`` given)."""
        return self.skip_attn is not None or self.skip_mlp is not None


@dataclass
class LayerSearch:
    """The state of SWIFT's layer set search (arXiv:2410.06916 Sec. 4.1): ``n`` of the searchable ``layers`` are
    skipped by every candidate; ``points`` / ``scores`` are the candidates scored so far (as
    :func:`methods.layer_skip.layersearch.skip_point`) and their matchness; ``best`` is the best matchness (0 at the
    start, as SWIFT: the first candidate replaces the initial set); ``stale`` counts candidates in a row that did not
    beat it."""

    layers: list[int]
    n: int
    generator: torch.Generator
    points: list[torch.Tensor] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    best: float = 0.0
    iterations: int = 0
    stale: int = 0
    done: bool = False

    def candidate(self, bayes_every: int) -> list[int]:
        """Every ``bayes_every``-th candidate from Bayesian optimization over the scores so far (once there are two),
        the others from random search (SWIFT's schedule)."""
        if bayes_every and (self.iterations + 1) % bayes_every == 0 and len(self.scores) > 1:
            return bayes_skip(torch.stack(self.points), torch.tensor(self.scores), self.layers, self.n, self.generator)
        return random_skip(self.layers, self.n, self.generator)

    def record(self, skip: list[int], score: float, options: LayerSkipOptions) -> bool:
        """Register a candidate's matchness; whether it is the new best. The search stops after ``search_iters``
        candidates, after ``search_patience`` in a row that were not better, or at a best above ``search_score``."""
        self.points.append(skip_point(skip, self.layers))
        self.scores.append(score)
        self.iterations += 1
        better = score > self.best
        if better:
            self.best, self.stale = score, 0
        else:
            self.stale += 1
        self.done = (self.best > options.search_score or self.stale >= options.search_patience
                     or self.iterations >= options.search_iters)
        return better


@register_method("layer_skip")
class LayerSkip(SpeculativeMethod):
    """Self-speculation (SWIFT arXiv:2410.06916): the target drafts a chain with a fixed or searched set skipped.

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
        for name in SET_OPTIONS:
            named = sorted(getattr(self.options, name) or ())
            if named and named[-1] >= n:
                raise OptionsError(f"{where}: option {name}: layer {named[-1]} does not exist, the target has {n} "
                                   f"decoder layers (0..{n - 1})")
        if self.options.skip_layers is not None or self.options.sub_layers:
            whole = set(self.options.skip_layers or ())  # both sub-layers of a layer named in both: the whole layer
            skip, attn_only, mlp_only = split_sub_layers(whole | set(self.options.skip_attn or ()),
                                                         whole | set(self.options.skip_mlp or ()))
        else:
            ratio = DEFAULT_SKIP_RATIO if self.options.skip_ratio is None else self.options.skip_ratio
            skip, attn_only, mlp_only = interleaved_skip(n, ratio), [], []
        if len(skip) >= n:
            raise OptionsError(f"{where}: the draft skips all {n} decoder layers; keep at least one")
        if set(range(n)) - set(skip) <= set(attn_only):
            raise OptionsError(f"{where}: option skip_attn skips the attention of every layer the draft keeps; keep "
                               "at least one")
        missing = [(i, part) for part, named in (("self_attn", attn_only), ("mlp", mlp_only))
                   for i in named if not isinstance(getattr(layers[i], part, None), nn.Module)]
        if missing:
            i, part = missing[0]
            raise OptionsError(f"{where}: decoder layer {i} ({type(layers[i]).__name__}) has no `{part}` module "
                               "to skip")
        self.decoder = decoder
        self.config = decoder.config  # the config the decoder reads layer_types from
        self.types = layer_types(target.model.config) or ["full_attention"] * n
        self.per_type = len(set(self.types)) > 1  # a mixed target takes a mask per attention type
        self.initial = (skip, attn_only, mlp_only)  # the set drafting starts from
        self.use_layers(*self.initial)
        self.sub_space = self.options.search_space == "sub_layers"
        if self.options.search != "off":
            self.searchable, self.candidate_size = self.search_coordinates(where, n)
        self.search = self.new_search()
        if self.options.tree == "confidence":  # up to TREE_TOPK nodes per depth, padded as the compiled runtime pads
            self.max_tree_slots = bucket_slots(1 + TREE_TOPK * self.options.k)  # the static cache's room
        self.window_cache = None  # the search's copy of the turn's prompt cache (None: not searching this turn)
        self.window: list[int] = []  # the turn's first search_window + 1 committed tokens, the scored context
        self.prompt_len = 0
        self.turn_start: dict[str, list[int]] = {}  # the set the turn started with (current_set)
        self.changes: list[dict[str, Any]] = []  # the turn's set changes
        self.turn_steps = 0  # verification steps of the turn so far
        self._proposal = "deterministic"
        self.cache = None   # the target's cache of the current turn (the engine's)
        self.committed = 0  # positions in it

    def search_coordinates(self, where: str, n: int) -> tuple[list[int], int]:
        """The search's coordinates (layers 1 .. L - 2, SWIFT keeps the first and the last; or their ``2 (L - 2)``
        sub-layers) and how many of them each candidate skips: as many as the initial set, or with ``sub_layers`` and
        the set from the ratio, SWIFT's ``int(2 (L - 2) skip_ratio)``. Refuses a set with nothing to move."""
        if self.sub_space:
            if n < 3:
                raise OptionsError(f"{where}: option search_space: sub_layers searches layers 1..L - 2; the target has "
                                   f"{n} decoder layers")
            try:
                ids = sub_layer_ids(*self.initial, n)
            except ValueError as err:
                raise OptionsError(f"{where}: option search_space: sub_layers: the initial set's {err}") from None
            space = list(range(2 * (n - 2)))
            given = self.options.skip_layers is not None or self.options.sub_layers
            ratio = DEFAULT_SKIP_RATIO if self.options.skip_ratio is None else self.options.skip_ratio
            size = len(ids) if given else int(len(space) * ratio)
            if not 0 < size <= len(space):
                raise OptionsError(f"{where}: option search moves the skipped sub-layers among the {len(space)} of "
                                   f"layers 1..{n - 2}: skip between 1 and {len(space)}, got {size}")
            return space, size
        skip = self.initial[0]
        space = list(range(1, n - 1)) if n > 2 else list(range(1, n))
        if not 0 < len(skip) <= len(space):
            raise OptionsError(f"{where}: option search moves the skipped layers among layers "
                               f"{space[0] if space else 1}..{n - 2} (the first and the last are "
                               f"kept): skip between 1 and {len(space)} layers, got {len(skip)}")
        return space, len(skip)

    def use_layers(self, skip: list[int], attn_only: list[int] = (), mlp_only: list[int] = ()) -> None:
        """Draft with ``skip`` skipped from now on, and the attention of ``attn_only`` and the MLP of ``mlp_only``:
        the kept layers, their attention types, the stand-ins for the skipped sub-layers, the kept layers whose
        attention runs (``attending``: they write the drafted positions' K/V) and per type the first of them (its
        cache slot sizes the draft mask of that type; a type none of whose kept layers attends gets a mask it never
        reads, sized from its first kept layer)."""
        layers = self.decoder.layers
        self.skipped, self.attn_only, self.mlp_only = sorted(skip), sorted(attn_only), sorted(mlp_only)
        self.stand_ins = ([(layers[i], "self_attn", SkippedAttention()) for i in self.attn_only]
                          + [(layers[i], "mlp", SkippedMLP()) for i in self.mlp_only])  # swapped in to draft
        self.kept = [i for i in range(len(layers)) if i not in set(skip)]
        self.kept_layers = nn.ModuleList([layers[i] for i in self.kept])
        self.kept_types = [self.types[i] for i in self.kept]  # what layer_types says of the kept layers, in order
        self.attending = [i for i in self.kept if i not in set(self.attn_only)]
        self.first_kept = {}
        for i in self.attending + self.kept:
            self.first_kept.setdefault(self.types[i], i)

    def new_search(self) -> LayerSearch | None:
        """A search from scratch (None with ``search=off``)."""
        if self.options.search == "off":
            return None
        return LayerSearch(self.searchable, self.candidate_size,
                           torch.Generator().manual_seed(self.options.search_seed))

    def use_candidate(self, candidate: list[int]) -> None:
        """Draft with a search candidate: skipped layers, or with ``sub_layers`` SWIFT's sub-layer coordinates."""
        if self.sub_space:
            self.use_layers(*sub_layer_sets(candidate, len(self.decoder.layers)))
        else:
            self.use_layers(candidate)

    def current_set(self) -> dict[str, list[int]]:
        """The set drafting now, as the notes record it: the skipped layers, and with ``sub_layers`` the layers of
        which only the attention or only the MLP is skipped."""
        if not self.sub_space:
            return {"skipped_layers": list(self.skipped)}
        return {"skipped_layers": list(self.skipped), "skipped_attention_only": list(self.attn_only),
                "skipped_mlp_only": list(self.mlp_only)}

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
        """The options plus the layers skipped first (from ``skip_ratio`` when no set is given), the layers of which
        only the attention or only the MLP is skipped, and ``order_dependent``: whether the searched set carries from
        one turn and question to the next."""
        skip, attn_only, mlp_only = self.initial
        return {**super().describe(), "skipped_layers": list(skip),
                "skipped_attention_only": list(attn_only), "skipped_mlp_only": list(mlp_only),
                "order_dependent": self.options.search == "persist"}

    def turn_notes(self) -> dict[str, Any] | None:
        """With ``search`` on: the set the turn started with, its changes (``step``: the first verification step
        drafted with it, an index of ``draft_depths``; the set; its matchness), and the search's candidates so far,
        best matchness and whether it has stopped."""
        if self.search is None:
            return None
        return {**self.turn_start, "layer_set_changes": self.changes,
                "search_iterations": self.search.iterations, "search_best_matchness": round(self.search.best, 4),
                "search_done": self.search.done}

    # ---- the target's cache ----------------------------------------------------------------------------------------
    def turn_cache(self, cache: object) -> None:
        self.cache = cache  # the draft forwards append to its kept layers and crop them back

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """A new turn; with ``search`` on, a copy of the prompt's cache for scoring candidates (SWIFT's clone of the
        prefilled cache) while the search runs, and with ``per_turn`` a fresh search from the initial set."""
        self.committed = self.prompt_len = prompt_ids.shape[1]
        self.turn_steps = 0
        if self.search is None:
            return
        if self.options.search == "per_turn":
            self.search = self.new_search()
            self.use_layers(*self.initial)
        self.turn_start, self.changes, self.window = self.current_set(), [], []
        self.window_cache = None if self.search.done else copy.deepcopy(self.cache)

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        """Commit ``tokens``; while searching, one candidate per step once more than ``search_window + 1`` tokens of
        the turn are committed (SWIFT's optimization phase, one iteration per decoding step)."""
        self.committed += len(tokens)
        self.turn_steps += 1
        if self.window_cache is None:
            return
        room = self.options.search_window + 1 - len(self.window)
        self.window.extend(tokens[:room])
        if self.committed - self.prompt_len > self.options.search_window + 1:
            self.search_step()

    # ---- the layer set search (SWIFT arXiv:2410.06916 Sec. 4.1) ------------------------------------------------
    def search_step(self) -> None:
        """Score one candidate on the turn's window; draft with it from the next step if it beats the best so far;
        drop the prompt cache's copy once the search stops."""
        candidate = self.search.candidate(self.options.search_bayes_every)
        score = self.score_set(candidate)
        if self.search.record(candidate, score, self.options):
            self.use_candidate(candidate)
            self.changes.append({"step": self.turn_steps, **self.current_set(), "matchness": round(score, 4)})
        if self.search.done:
            self.window_cache = None

    def score_set(self, candidate: list[int]) -> float:
        """The matchness of drafting with a search ``candidate`` (:meth:`use_candidate`) on the turn's window: one
        forward of the skipping model over the window's tokens (after the prompt, in the copy of its cache), its greedy
        next tokens against the target's own; the copy is cropped back to the prompt after it."""
        current = (self.skipped, self.attn_only, self.mlp_only)
        self.use_candidate(candidate)
        device = self.target.device
        ids = torch.tensor([self.window], dtype=torch.long, device=device)  # [1, w + 1]
        pos = torch.arange(self.prompt_len, self.prompt_len + ids.shape[1], device=device)[None]  # [1, w + 1]
        try:
            with self.skipping():
                logits = self.target.model(ids, cache=self.window_cache, use_cache=True,
                                           position_ids=pos).logits[0]  # [w + 1, V]
        finally:
            for i in self.attending:
                self.window_cache.layers[i].crop(-ids.shape[1])
            self.use_layers(*current)
        self.counters["search_forwards"] = self.counters.get("search_forwards", 0) + 1
        return matchness(logits[:-1].argmax(-1), ids[0, 1:].to(logits.device))

    # ---- drafting ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def skipping(self) -> Iterator[None]:
        """Within the block the target's decoder runs only the kept layers (its own modules, each writing the cache
        slot of its own ``layer_idx``), with the skipped sub-layers swapped for zero updates. A decoder that reads
        layer i's attention type as ``config.layer_types[i]`` (Qwen2, Gemma 2/3) sees the kept layers' types in the
        same order. Everything is put back on leaving the block."""
        layers, types = self.decoder.layers, getattr(self.config, "layer_types", None)
        swapped = self.stand_ins
        originals = [getattr(layer, part) for layer, part, _ in swapped]
        self.decoder.layers = self.kept_layers
        if types is not None:
            self.config.layer_types = self.kept_types
        for layer, part, stand_in in swapped:
            setattr(layer, part, stand_in)
        try:
            yield
        finally:
            for (layer, part, _), original in zip(swapped, originals):
                setattr(layer, part, original)
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
        probability is below ``stop_threshold``; the kept layers are cropped back to the committed text after it.
        With ``tree: confidence`` each chain token comes with its ranked siblings (:meth:`confidence_tree`)."""
        self._proposal = "deterministic" if sampling.greedy else "sampled"
        token = torch.full((1,), root, dtype=torch.long, device=self.target.device)
        tree, stop = self.options.tree == "confidence", self.options.stop_threshold
        tokens, rows, ranked, confidences, run = [], [], [], [], 0
        try:
            for i in range(self.options.k):
                logits = self.draft_forward(token, self.committed + i)
                run += 1
                if sampling.greedy:
                    token = logits.argmax(-1).view(1)
                    q = logits.softmax(-1) if stop or tree else None  # [V] for the confidence only
                    if tree:
                        ranked.append(logits.topk(TREE_TOPK).indices)  # [K] best first: the chain's token first
                else:
                    q = logits_to_probs(logits, sampling)  # [V] the draft's shaped distribution
                    on = generator.device if generator is not None else q.device  # draw where the generator lives
                    draws = min(TREE_TOPK, int((q > 0).sum())) if tree else 1
                    drawn = torch.multinomial(q.to(on), draws, generator=generator).to(q.device)  # [draws] no repeats
                    token = drawn[:1]
                    rows.append(q)
                    if tree:
                        ranked.append(drawn)
                tokens.append(token)
                if tree:
                    confidences.append(float(q.max()))  # the widths read every depth's
                if stop and i < self.options.k - 1 and (confidences[-1] if tree else float(q.max())) < stop:  # SWIFT's
                    break
        finally:
            for i in self.attending:  # the drafted positions leave the kept layers: the target's cache is as it was
                self.cache.layers[i].crop(-run)
        if tree:
            return self.confidence_tree(ranked, confidences, rows, sampling.greedy)
        chain = torch.cat(tokens).to(self.target.output_device)
        probs = None
        if rows:
            rows.append(torch.zeros_like(rows[0]))  # the last node has no children
            probs = torch.stack(rows).to(self.target.output_device)  # [n + 1, V]
        return chain_tree(chain, probs)

    def confidence_tree(self, ranked: list[torch.Tensor], confidences: list[float], rows: list[torch.Tensor],
                        greedy: bool) -> DraftTree:
        """SWIFT's tree (arXiv:2410.06916 Sec. 4.2; hemingkx/SWIFT@88caed7 ``get_choices_list``): below the chain
        node of depth d (the root for d = 0) the first :func:`harness.engine.tree.confidence_widths` of the ranked
        candidates ``ranked[d] [<= K]`` of depth d + 1 (greedy: the draft's top-k; sampled: draws without
        replacement from ``rows[d] [V]``, which becomes the chain node's ``draft_probs`` row)."""
        widths = confidence_widths(confidences, CONFIDENCE_WIDTHS["greedy" if greedy else "sampled"])
        candidates = [r.tolist() for r in ranked]
        tokens, parents, chain = sibling_tree(candidates, [min(w, len(c)) for w, c in zip(widths, candidates)])
        out = self.target.output_device
        probs = None
        if rows:
            probs = torch.zeros(len(tokens) + 1, rows[0].shape[0], dtype=rows[0].dtype, device=out)  # [N + 1, V]
            for slot, row in zip([0] + [node + 1 for node in chain], rows):  # the root, then each chain node
                probs[slot] = row
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=out),
                         torch.tensor(parents, dtype=torch.long, device=out), probs)
