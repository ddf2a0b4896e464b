"""The one speculative decoding loop: every speculative method only proposes draft trees and hears what was accepted.

A method subclasses :class:`SpeculativeMethod` and implements three verbs::

    begin(prompt_ids [1, P], hidden [P, H] | None)    # new turn; the prompt is committed in the target cache
    propose(root, sampling, generator) -> DraftTree    # a tree below the pending token `root`
    accept(tokens, hidden [A, H] | None, next_root)    # tokens = [root] + accepted drafts, now committed

(a method that sets ``logit_topk = k > 0`` also hears ``observe(slot_ids [N+1], top_ids [N+1, k])`` after every
verification forward: the top-k of the target's logits at each slot, best first, on the device; Token Recycling
recycles them; a method may also hand the engine a *side branch* right after each proposal, ``side_branch() ->
DraftTree | None``: slots that ride along in the same forward, each seeing the committed prefix, the root and its own
side ancestors, never verified, never accepted, their K/V dropped by the compaction and their top-k handed to
``observe`` after the draft's slots; Lookahead decoding's Jacobi window, arXiv:2402.02057 Sec. 3.3) and the engine
(:meth:`SpeculativeMethod.generate`) does the rest:

1. prefill (``_prefill``): the target runs over the prompt with a transformers ``DynamicCache``; x0 =
   ``next_token`` of the last logits is emitted as step 0 (accept length 1) and becomes the first root (emitted,
   not yet in the cache);
2. loop: ``tree = propose(root)``; a verification step (``_verify_step``): ONE target forward over
   ``[root, *tree.tokens]`` (then the side branch's tokens, if any) with position ids ``committed_len + depth`` and
   a 4D mask (causal over the committed prefix, ancestor-or-self inside the tree);
   :meth:`SpeculativeMethod.verify` picks the accepted path and the bonus token; the accepted drafts and the bonus
   are emitted (cut by :func:`harness.engine.method.cut_at_stop`: never past EOS or ``max_new_tokens``); the cache is
   compacted to the committed prefix + root + accepted path (:func:`harness.engine.kv.compact_cache`); ``accept`` is
   called and the bonus becomes the next root.

Every target forward goes through the method's :attr:`~harness.engine.method.Method.target_runner`
(:mod:`harness.engine.runtime`): the model itself (``runtime: eager``), or its compiled forward, which may pad a
tree with slots no real slot sees and may keep a ``StaticCache`` (``runtime: compiled``).

After a turn the cache holds exactly ``P + len(token_ids) - 1`` positions: everything emitted except the last,
pending token (``last_cache_length`` records it).

What transformers 5.24 does with the inputs (checked on ``LlamaForCausalLM``, eager and sdpa):

- ``attention_mask`` of shape ``[B, 1, q, kv]`` is passed through unchanged (``masking_utils.
  _preprocess_mask_arguments`` returns a 4D mask as-is) and reaches the attention function. ``eager`` *adds* it to
  the scores, so it must be a float additive mask; ``sdpa`` accepts either a bool mask (True = attend) or a float
  additive one. The engine therefore builds a float mask in the model dtype (0 = attend, dtype min = blocked),
  which is correct for both. With a mask, transformers' ``sdpa`` copies the K/V heads of a grouped-query model
  (``repeat_kv``) in every layer; draftbench's ``sdpa_gqa`` (:func:`harness.models.sdpa_gqa_attention`, what
  ``attn_implementation: auto`` loads) passes them grouped, with the same result bit for bit. flash-attention
  backends cannot take an arbitrary 4D mask and are refused.
  Explicit ``position_ids`` are used for RoPE; the cache appends the new K/V after the committed ones.
- Sliding-window attention: a model whose layers all slide (Mistral, Mixtral, Phi-3 with ``sliding_window``) takes
  one 4D mask; a model with mixed layers (Gemma 2/3, Qwen2/3 with sliding layers) takes ``attention_mask`` as a
  dict ``{"full_attention": mask, "sliding_attention": mask}`` and hands each layer its type's mask (models that
  check ``isinstance(attention_mask, dict)``). A 4D mask bypasses the window, so the engine applies it itself
  (:func:`harness.engine.tree.windowed_tree_mask`: a slot at position p sees keys at positions > p - window), and
  the sliding caches record their past during a verification forward (:mod:`harness.engine.kv`). Chunked and
  linear-attention layers are refused.
- ``output_hidden_states=True`` returns ``num_layers + 1`` tensors and the last one is the output of the final
  norm (``capture_outputs(tie_last_hidden_states=True)`` overwrites it with ``last_hidden_state``), i.e. the input
  of ``lm_head``: ``lm_head(hidden_states[-1]) == logits``. 5.24 also accepts a selection, so the engine asks for
  ``output_hidden_states=[-1]`` and only the post-norm features are kept (the other entries are None). Entry i < L
  (of L decoder layers) is the input of layer i (entry 0: the embedding output). A method that reads other levels
  (EAGLE-3 fuses a low, a middle and a high layer, arXiv:2503.01840 Sec. 3) declares them in ``hidden_layers``
  (:func:`resolve_hidden_layers`); only those are kept, and the method receives them concatenated in that order.

Host round trips: the masks, position ids and (at temperature 0) the acceptance walk are computed on the device
(:func:`harness.engine.tree.ancestor_matrix`, :func:`harness.engine.verify.verify_greedy_on_device`), and what the
host needs from a greedy step (the accepted tokens, the bonus, the tree's depth and validity flags) comes back in
ONE transfer (:func:`harness.engine.hostio.pack_step` on the device, ``unpack_step`` on the host; the prefill reads
its one token); the logit margins of the emitted tokens stay on the device and come back once, at the turn's end
(:class:`harness.engine.sampling.LogitTrace`); the compaction index goes to each device once, without a stream
synchronisation. ``tests/test_syncs.py`` counts what is left per step.
A method whose ``verify`` must also run at temperature 0 sets ``greedy_argmax = False`` (then the engine calls it
and reads its result on the host).

Every speculative method takes the engine's option ``max_spec_context`` (:func:`with_engine_options`; 0 = off, N > 0 =
speculation off for the rest of a turn once the context exceeds N tokens, :class:`SpeculationStop`), whatever its own
options: a method's ``Options`` gains the field when its class is created, unless it declares the field itself.

Timings: ``draft_s`` (propose, begin and accept), ``verify_s`` (the target forward and the acceptance walk),
``overhead_s`` (everything else in the loop: masks, cache compaction, bookkeeping). The device is synchronised
around each part only when profiling (the ``profile`` attribute, which the runner sets from the run's ``profile``
option; default: on for CPU, where synchronising is free, off otherwise). Without it, on an
asynchronous device the split is indicative only; ``Generation.timings_synchronised`` says which it was.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.engine.hostio import fetch, pack_dtype, pack_step, unpack_step, upload
from harness.engine.kv import (
    attention_layout,
    check_layer_types,
    compact_cache,
    prepare_cache,
)
from harness.engine.method import Generation, Method, NoOptions, cut_at_stop
from harness.engine.sampling import LogitTrace, SamplingParams, next_token
from harness.engine.speculationstop import SpeculationStop
from harness.engine.tree import (
    DraftTree,
    ancestor_matrix,
    chain_tree,
    check_tree,
    join_side,
    slot_depths,
    tree_flags,
    windowed_tree_mask,
)
from harness.engine.verify import verify_greedy, verify_greedy_on_device, verify_sampling
from harness.measure.trackers import device_sync
from harness.models import SDPA_GQA

# the attention backends that take the verification forward's 4D float mask (flash kernels know only causal and
# sliding masks; flex attention wants a BlockMask; paged attention has no per-query mask)
TREE_BACKENDS = ("eager", "sdpa", SDPA_GQA)


def check_tree_backend(target, method: str) -> None:
    """Raise ``ValueError`` with the reason when ``target`` runs an attention backend tree verification cannot use."""
    impl = getattr(getattr(getattr(target, "model", None), "config", None), "_attn_implementation", None)
    if impl is not None and impl not in TREE_BACKENDS:
        raise ValueError(f"method {method!r} verifies a draft tree with a 4D attention mask, which attn_implementation "
                         f"{impl!r} cannot take (only eager, sdpa and sdpa_gqa take an arbitrary mask; flash kernels "
                         f"know only causal and sliding ones); load the target with attn_implementation 'auto', "
                         f"'sdpa' or 'eager'")


ENGINE_OPTION = "max_spec_context"  # the option every speculative method takes from the engine


def check_stop_option(name: str, value) -> None:
    """Options ``max_spec_context`` and ``stop_unprofitable`` (:class:`SpeculationStop`), and the dynamic-tree
    methods' ``backoff``: an integer >= 0, 0 = off."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0 = off), got {value!r}")


def with_engine_options(options_cls: type) -> type:
    """``options_cls`` (a method's options dataclass) with the engine's option ``max_spec_context: int = 0`` after
    its own fields, checked after its own ``__post_init__``; ``options_cls`` itself when it declares the field (the
    dynamic-tree methods, beside ``stop_unprofitable``). Same name, module and docstring, so that error messages and
    manifests read as before; the field is recorded with the method's options (last).
    Example: ``PldOptions(n: int = 3)`` -> a subclass with fields (n, max_spec_context); ``max_spec_context=-1``
    raises ``max_spec_context must be an integer >= 0 (0 = off), got -1``."""
    if ENGINE_OPTION in {f.name for f in dataclasses.fields(options_cls)}:
        return options_cls

    def __post_init__(self) -> None:
        own = getattr(options_cls, "__post_init__", None)
        if own is not None:
            own(self)
        check_stop_option(ENGINE_OPTION, self.max_spec_context)

    extended = dataclasses.make_dataclass(
        options_cls.__name__, [(ENGINE_OPTION, int, dataclasses.field(default=0))], bases=(options_cls,),
        namespace={"__post_init__": __post_init__, "__doc__": options_cls.__doc__},
        frozen=options_cls.__dataclass_params__.frozen)
    extended.__module__, extended.__qualname__ = options_cls.__module__, options_cls.__qualname__
    return extended


def tree_mask_4d(committed_len: int, parents: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """Additive attention mask ``[1, 1, N+1, committed_len + N + 1]`` for one verification forward (full attention).

    Every tree slot sees the whole committed prefix and, inside the tree block, its ancestors and itself.
    Example: committed_len 2, parents [-1, -1] -> rows (0 = attend, m = dtype min)
    [[0, 0, 0, m, m], [0, 0, 0, 0, m], [0, 0, 0, m, 0]].
    """
    ancestors = ancestor_matrix(parents.to(device))
    return windowed_tree_mask(ancestors, slot_depths(ancestors), committed_len, committed_len, None, dtype)


def resolve_hidden_layers(spec, num_layers: int) -> tuple[int, ...]:
    """The ``output_hidden_states`` indices named by ``spec`` for a decoder of ``num_layers`` layers.

    ``spec``: a comma-separated string or a sequence of integers and names. An integer i is the hidden state with
    that index (0 = the embedding output, i < L = the input of layer i, -1 or L = the output of the final norm);
    ``low``, ``mid`` and ``high`` are EAGLE-3's feature levels, the inputs of layers 2, L // 2 and L - 3
    (arXiv:2503.01840 Sec. 3; released code ``eagle/traineagle3/modeling_llama_kv.py``), each clipped to [low, L - 1]
    so that models with fewer than 6 layers get valid, non-decreasing levels; ``last`` is -1.
    Examples: ("low,mid,high", 32) -> (2, 16, 29); ("low,mid,high", 30) -> (2, 15, 27); ("low,mid,high", 2) ->
    (1, 1, 1); ("0,last", 4) -> (0, -1). A bad entry raises ``ValueError`` naming it.
    """
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"hidden layers: the target must have at least one decoder layer, got {num_layers!r}")
    items = [x.strip() for x in spec.split(",")] if isinstance(spec, str) else list(spec)
    if not items:
        raise ValueError("hidden layers: expected at least one entry (an index, low, mid, high or last)")
    low = min(2, num_layers - 1)
    mid = min(max(num_layers // 2, low), num_layers - 1)
    named = {"low": low, "mid": mid, "high": min(max(num_layers - 3, mid), num_layers - 1), "last": -1}
    out = []
    for item in items:
        if isinstance(item, str) and item in named:
            out.append(named[item])
            continue
        try:
            index = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"hidden layers: {item!r} is neither an integer nor one of low, mid, high, last") from None
        if not -(num_layers + 1) <= index <= num_layers:
            raise ValueError(f"hidden layers: index {index} is out of range for a target with {num_layers} layers "
                             f"(hidden states 0..{num_layers}, or negative from the end)")
        out.append(index)
    return tuple(out)


def layer_types(config) -> list[str] | None:
    """The decoder's per-layer attention types as transformers' ``DynamicCache`` derives them from ``config``."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    return get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0]


class _Clock:
    """Accumulates wall time into named buckets, synchronising ``device`` at each mark when ``sync``."""

    def __init__(self, device: torch.device, sync: bool):
        self.device, self.sync = device, sync
        self.totals: dict[str, float] = {}
        self.last = self._now()

    def _now(self) -> float:
        if self.sync:
            device_sync(self.device)
        return time.perf_counter()

    def mark(self, bucket: str) -> None:
        """Charge the time since the previous mark to ``bucket``."""
        now = self._now()
        self.totals[bucket] = self.totals.get(bucket, 0.0) + now - self.last
        self.last = now


class SpeculativeMethod(Method):
    """Base class of tree-drafting methods; subclasses implement ``begin``, ``propose`` and ``accept``.

    Class attributes: ``proposal`` = "deterministic" (the tree is a function of the context: top-k, lookup,
    static trees) or "sampled" (children drawn without replacement from ``DraftTree.draft_probs``);
    ``needs_hidden_states`` = True makes the engine pass the target's features (on :attr:`feature_device`): by
    default the post-norm last hidden state (``hidden_layers = (-1,)``); a method that reads other levels sets
    ``hidden_layers`` (indices of ``output_hidden_states``, e.g. from :func:`resolve_hidden_layers`, possibly per
    instance) and receives ``[n, len(hidden_layers) * H]``, the levels concatenated in that order;
    ``greedy_argmax`` = True (default): at temperature 0 verification is the argmax walk,
    computed on the device by the engine (:meth:`verify` is then not called).
    ``logit_topk`` = k > 0 makes the engine call :meth:`observe` after every verification forward with the top-k
    token ids of the target's logits at each slot (computed on the device, no host read; default 0: not called).
    Methods increment ``self.counters["draft_forwards"]`` (and any other counter they like); the engine resets
    ``counters`` at the start of every turn and adds ``target_forwards`` and ``tree_tokens``.
    A method with a non-lossless acceptance rule (Medusa's typical acceptance) overrides :meth:`verify` and
    ``lossless``. Trees are best proposed on the target's device (the engine moves them otherwise).
    A method that holds a :class:`~harness.engine.speculationstop.SpeculationStop` in ``speculation_stop`` lets the
    engine stop speculating for the rest of a turn: from the step the policy names a reason on, every step is a plain
    one-token forward (an empty tree), the method is neither asked to propose nor told what was accepted, and the
    turn's :attr:`Generation.speculation_off <harness.engine.method.Generation.speculation_off>` says at which
    step and why. Option ``max_spec_context`` (the engine's, every speculative method's: :func:`with_engine_options`)
    holds one that stops past that context; a method that sets its own policy (the dynamic-tree methods, whose
    ``stop_unprofitable`` reads their measured costs) replaces it.
    """

    Options: ClassVar[type] = with_engine_options(NoOptions)  # a subclass's own: see __init_subclass__
    proposal: ClassVar[str] = "deterministic"
    needs_hidden_states: ClassVar[bool] = False
    hidden_layers: tuple[int, ...] = (-1,)
    greedy_argmax: ClassVar[bool] = True
    profile: bool | None = None
    last_cache_length: int | None = None
    logit_topk: int = 0
    max_tree_slots: int = 128  # the most slots (root included) a verification forward may take: static cache room
    speculation_stop: SpeculationStop | None = None  # when to stop speculating for the rest of a turn (None: never)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.Options = with_engine_options(cls.Options)

    def __init__(self, target, options=None):
        if options is not None and not isinstance(options, self.Options):  # the method's own dataclass, as declared:
            options = self.Options(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
        super().__init__(target, options)
        self.counters: dict[str, int] = {}
        check_tree_backend(target, self.name)  # before a run starts, not at its first turn
        self.speculation_stop = self.build_speculation_stop()  # asked by the loop (generate); None: never stop

    def build_speculation_stop(self) -> SpeculationStop | None:
        """The policy that turns speculation off for the rest of a turn (``max_spec_context``), built once in
        ``__init__``; a method with more reasons to stop (a sizer's measured costs) overrides it."""
        return SpeculationStop(max_context=self.options.max_spec_context) if self.options.max_spec_context else None

    @property
    def feature_device(self) -> torch.device:
        """Where the target's features are handed to the method (and its draft modules live): the device of the
        target's ``lm_head`` (with a device map, the last shard; the features are moved there once per step)."""
        return self.target.output_device

    # ---- the three verbs a method implements -------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """A new turn: ``prompt_ids [1, P]`` are committed; ``hidden [P, H]`` their target features (or None;
        ``[P, len(hidden_layers) * H]`` for a method that reads several levels)."""

    def propose(self, root: int, sampling: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """A draft tree below ``root`` (the pending token: emitted, not yet run through the target)."""
        raise NotImplementedError

    def accept(self, tokens: list[int], hidden: torch.Tensor | None, next_root: int) -> None:
        """``tokens`` = [root] + accepted drafts, now committed; ``hidden [len(tokens), H]``; the next root."""

    def observe(self, slot_ids: torch.Tensor, top_ids: torch.Tensor) -> None:
        """After a verification forward (only when ``logit_topk`` = k > 0): ``slot_ids [N+1]`` the tokens the target
        ran on (the root, then the tree's nodes), ``top_ids [N+1, k]`` the top-k ids of its logits at each, best
        first; on the target's device. Called before :meth:`accept` (also on the turn's last step). With a side
        branch of M slots, ``slot_ids`` and ``top_ids`` have N+1+M rows: the side's slots come last, in its order."""

    def turn_cache(self, cache: object) -> None:
        """The target's KV cache of a new turn, handed over before the prefill. A method that drafts with the
        target's own layers (layer skipping) keeps it, appends its drafted positions to it and crops them back before
        :meth:`propose` returns; the engine's forwards must find it as they left it. Default: not kept."""

    def turn_notes(self) -> dict[str, Any] | None:
        """What the method chose during the turn, asked for at its end: a JSON-able dict the run writes to the
        turn's record as ``method_notes`` (layer skipping's searched layer sets). Default None: no notes."""
        return None

    def side_branch(self) -> DraftTree | None:
        """Slots to run in the next verification forward without verifying them, asked for right after
        :meth:`propose` (Lookahead decoding's Jacobi window, arXiv:2402.02057 Sec. 3.3): a tree below the root whose
        ``parents`` index its own nodes (-1 = the root). A side slot sits at position ``committed + depth``, sees the
        committed prefix, the root and its side ancestors; no draft slot sees it (:func:`join_side`). It is never
        accepted, its K/V is dropped with the rejected slots, and its logits reach :meth:`observe` (set
        ``logit_topk``). Default None: the forward is the draft tree alone."""
        return None

    # ---- verification (overridable) ----------------------------------------------------------------------------
    def verify(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        """Accepted path and bonus token; lossless greedy / speculative sampling unless a method overrides it."""
        if sampling.greedy:
            return verify_greedy(tree, logits)
        return verify_sampling(tree, logits, sampling, generator)

    # ---- the loop -----------------------------------------------------------------------------------------------
    def _profiling(self) -> bool:
        if self.profile is not None:
            return bool(self.profile)
        return self.target.device.type == "cpu"

    def _check_inputs(self, prompt_ids: torch.Tensor) -> None:
        if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] < 1:
            raise ValueError(f"prompt_ids must be [1, P] with P >= 1 (batch size 1), got {tuple(prompt_ids.shape)}")
        check_tree_backend(self.target, self.name)
        if self.proposal not in ("deterministic", "sampled"):
            raise ValueError(f"{type(self).__name__}.proposal must be 'deterministic' or 'sampled', "
                             f"got {self.proposal!r}")
        check_layer_types(layer_types(self.target.model.config))
        if self.needs_hidden_states:
            layers = self.target.model.config.get_text_config(decoder=True).num_hidden_layers
            bad = [i for i in self.hidden_layers if not isinstance(i, int) or not -(layers + 1) <= i <= layers]
            if not self.hidden_layers or bad:
                raise ValueError(f"{type(self).__name__}.hidden_layers must be non-empty indices of the target's "
                                 f"{layers + 1} hidden states, got {tuple(self.hidden_layers)!r}")

    def _check_proposal(self, tree: DraftTree, vocab: int) -> None:
        """The host-side checks of a proposed tree (the token range is checked on the device, :func:`tree_flags`)."""
        check_tree(tree, None, values=False)
        if self.proposal == "sampled" and tree.draft_probs is None and len(tree):
            raise ValueError(f"{type(self).__name__} declares proposal='sampled' but its DraftTree has no "
                             "draft_probs")
        if tree.draft_probs is not None and tree.draft_probs.shape[1] != vocab:
            check_tree(tree, vocab, values=False)

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Generation:
        """Speculative decoding of one turn (see the module docstring for the exact steps)."""
        self._check_inputs(prompt_ids)
        self.counters = {"draft_forwards": 0}
        self.last_cache_length = None
        if max_new_tokens <= 0:
            return Generation(token_ids=[], accept_lengths=[], stop_reason="max_new_tokens")
        eos = self.target.eos_ids
        turn = self._start_turn(prompt_ids, max_new_tokens, sampling, generator)
        self.turn_cache(turn.cache)
        clock, stats = turn.clock, turn.stats
        with torch.inference_mode():
            t0 = clock.last
            out, root_dev, root = self._prefill(turn, prompt_ids)
            clock.mark("prefill_s")
            prefill_s = clock.last - t0
            prepare_cache(turn.cache)
            emitted, stop = cut_at_stop([root], 0, max_new_tokens, eos)
            stats.accept_lengths.append(len(emitted))
            if stop is None:
                self.begin(prompt_ids, self._features(out.hidden_states) if turn.want_hidden else None)
                clock.mark("draft_s")
            del out
            policy, off = self.speculation_stop, None  # off: {"step", "reason", "context"} once speculation stopped
            if policy is not None:
                policy.begin()
            while stop is None:
                if off is None and policy is not None:
                    off = _stopped(policy, stats.target_forwards, turn.committed + 1)  # the pending root counts
                side = None
                if off is None:
                    tree = self.propose(root, sampling, generator)
                    side = self.side_branch()
                    clock.mark("draft_s")
                    self._check_proposal(tree, turn.vocab)
                else:  # a plain step: the root alone
                    tree = chain_tree(torch.zeros(0, dtype=torch.long, device=turn.device))
                forward = tree if side is None else join_side(tree, side)  # the slots the target runs on
                step, out = self._verify_step(turn, tree, root_dev, forward)
                clock.mark("verify_s")
                if self.logit_topk and off is None:
                    self.observe(*slot_top_ids(root_dev, forward.tokens, out.logits[0], self.logit_topk))
                    clock.mark("draft_s")
                new = step.path_tokens + [step.bonus]
                kept, stop = cut_at_stop(new, len(emitted), max_new_tokens, eos)
                # the last emitted token stays pending (not in the cache); a cut drops the slots after it
                keep = ([0] + [i + 1 for i in step.path])[: len(kept)]
                if step.logits is not None:
                    stats.trace.add(step.logits, keep)
                    step.logits = None  # freed with the forward's output below, as before (device peak memory)
                compact_cache(turn.cache, turn.committed, keep)
                turn.committed += len(keep)
                emitted.extend(kept)
                stats.step(len(tree), step.depth if len(tree) else 0, len(step.path), len(kept))
                hidden = None
                if turn.want_hidden and off is None:
                    hidden = self._features(out.hidden_states, keep)  # [len(keep), len(hidden_layers) * H]
                del out
                if off is None and policy is not None:
                    policy.record(len(tree) + 1, len(step.path))
                clock.mark("overhead_s")
                if stop is None and off is None:
                    self.accept([root] + new[:-1], hidden, step.bonus)
                    clock.mark("draft_s")
                root, root_dev = step.bonus, step.bonus_dev
            margins, tops, runner_ups = stats.trace.read()  # the turn's one read of its logit margins
        self.last_cache_length = int(turn.cache.get_seq_length())
        timings = {k: clock.totals.get(k, 0.0) for k in ("draft_s", "verify_s", "overhead_s")}
        counters = {**self.counters, "target_forwards": stats.target_forwards, "tree_tokens": stats.tree_tokens}
        return Generation(token_ids=emitted, accept_lengths=stats.accept_lengths, stop_reason=stop,
                          prefill_time_s=prefill_s, accepted_drafts=stats.accepted_drafts,
                          draft_depths=stats.draft_depths, timings=timings, counters=counters,
                          logit_margins=margins, logit_tops=tops, logit_runner_ups=runner_ups,
                          timings_synchronised=clock.sync, speculation_off=off, method_notes=self.turn_notes())

    def _start_turn(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingParams,
                    generator: torch.Generator | None) -> _Turn:
        runner = self.target_runner
        # room for the prompt, the new tokens and one tree beyond them (a static cache is allocated once)
        cache = runner.new_cache(prompt_ids.shape[1] + max_new_tokens + self.max_tree_slots)
        vocab = self.target.model.config.vocab_size
        return _Turn(runner=runner, cache=cache, layout=attention_layout(cache), device=prompt_ids.device,
                     vocab=vocab, sampling=sampling, generator=generator,
                     fast=sampling.greedy and self.greedy_argmax,
                     want_hidden=list(self.hidden_layers) if self.needs_hidden_states else False,
                     packed_dtype=pack_dtype(vocab), clock=_Clock(prompt_ids.device, self._profiling()),
                     stats=_TurnStats(pack_dtype(vocab)), committed=prompt_ids.shape[1])

    def _prefill(self, turn: _Turn, prompt_ids: torch.Tensor) -> tuple[object, torch.Tensor, int]:
        """The target over the prompt ``[1, P]``: its output, the first token ``x0`` on the device (``[1]``) and on
        the host (one read). Greedy: its logits' top two stay on the device (the turn's :class:`LogitTrace`)."""
        out = turn.runner.forward(prompt_ids, turn.cache, prefill=True, output_hidden_states=turn.want_hidden,
                                  logits_to_keep=1)
        last = out.logits[0, -1]  # [V]
        root_dev = next_token(last, turn.sampling, turn.generator).view(1)  # [1] on the logits' device
        turn.stats.target_forwards = 1
        if turn.sampling.greedy:
            turn.stats.trace.add(last[None], [0])
        return out, root_dev, int(fetch(root_dev)[0])

    def _verify_step(self, turn: _Turn, tree: DraftTree, root_dev: torch.Tensor,
                     forward: DraftTree) -> tuple[_Verified, object]:
        """ONE target forward over ``[root, *forward.tokens]`` (``forward``: ``tree``, or ``tree`` joined with a side
        branch of M slots, :func:`join_side`) and the acceptance of ``tree``: on the device with one readback when
        ``turn.fast`` (greedy argmax), else by :meth:`verify` on the host. Returns the verdict and the forward's
        output (whose hidden states the caller hands to ``accept``)."""
        n, vocab, device = len(tree), turn.vocab, turn.device
        parents, tokens = tree.parents.to(device), tree.tokens.to(device)
        all_parents, all_tokens = forward.parents.to(device), forward.tokens.to(device)
        all_ancestors = ancestor_matrix(all_parents)  # [N+M+1, N+M+1]
        all_depth = slot_depths(all_ancestors)        # [N+M+1]
        ancestors, depth = all_ancestors[: n + 1, : n + 1], all_depth[: n + 1]  # the draft's own: [N+1, N+1], [N+1]
        flags = tree_flags(DraftTree(all_tokens, all_parents), vocab)  # [2]
        if not turn.fast:  # the method's verify reads the tree on the host: check it first
            self._raise_if_bad(fetch(flags), forward, vocab)
        ids = torch.cat([root_dev.to(device), all_tokens.clamp(0, vocab - 1)])[None]  # [1, N+M+1]
        # eager: position ids depth + committed and the tree mask; compiled: the same, padded (runtime.py)
        ids, pos, mask = turn.runner.verify_inputs(ids, all_ancestors, all_depth, turn.committed, turn.layout,
                                                   turn.cache)
        turn.clock.mark("overhead_s")
        out = turn.runner.forward(ids, turn.cache, attention_mask=mask, position_ids=pos,
                                  output_hidden_states=turn.want_hidden)
        logits = out.logits[0, : n + 1]  # [N+1, V] (a compiled forward may have run pad slots after them)
        if turn.fast:
            on_path, bonus_dev, _ = verify_greedy_on_device(DraftTree(tokens, parents), logits, ancestors)
            here = logits.device  # with a device map the logits live on the last shard
            accepted = torch.where(on_path, tokens.to(here), -1)  # [N] a slot's token on the path, else -1
            readback = unpack_step(fetch(pack_step(flags, depth.max(), bonus_dev, accepted, turn.packed_dtype)), n)
            self._raise_if_bad(readback.flags, forward, vocab)
            return _Verified(readback.path, readback.path_tokens, readback.bonus, bonus_dev.to(device),
                             readback.depth, logits), out
        path, bonus = self.verify(tree, logits, turn.sampling, turn.generator)
        host = fetch(torch.cat([depth.max().view(1), tokens]))
        return _Verified(path, [host[1 + i] for i in path], bonus, upload([bonus], device), int(host[0]), None), out

    def _features(self, states: tuple, keep: list[int] | None = None) -> torch.Tensor:
        """The levels ``hidden_layers`` of ``states`` (a forward's ``hidden_states``; batch row 0), the rows ``keep``
        (all when None), concatenated on :attr:`feature_device` (moving them is a no-op unless a device map split
        the target): ``[rows, len(hidden_layers) * H]``. With the default ``(-1,)`` this is the post-norm feature."""
        parts, index = [], {}
        for layer in self.hidden_layers:
            features = states[layer][0]  # [S, H]
            if keep is not None:
                if features.device not in index:  # one upload per device, not per level
                    index[features.device] = upload(keep, features.device)
                features = features.index_select(0, index[features.device])
            parts.append(features.to(self.feature_device, non_blocking=True))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    @staticmethod
    def _raise_if_bad(flags: list, tree: DraftTree, vocab: int) -> None:
        """``flags`` from :func:`harness.engine.tree.tree_flags`: on a bad tree, let :func:`check_tree` name it."""
        if any(flags):
            check_tree(tree, vocab)
            raise ValueError("DraftTree failed the device-side checks (parents order or token range)")


def _stopped(policy: SpeculationStop, step: int, context: int) -> dict | None:
    """``{"step", "reason", "context"}`` when ``policy`` stops speculation before target forward ``step`` (an index of
    ``Generation.accept_lengths``, 0 = the prefill) at ``context`` tokens, else None."""
    reason = policy.reason(context)
    return None if reason is None else {"step": step, "reason": reason, "context": context}


def slot_top_ids(root: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What :meth:`SpeculativeMethod.observe` hears: ``(slot_ids [N+1], top_ids [N+1, k])`` for a forward over
    ``root [1]`` and ``tokens [N]`` with ``logits [S >= N+1, V]`` (a compiled forward's pad slots are dropped), on
    the logits' device. Example: root [3], tokens [1], logits [[0, 2, 1], [5, 0, 9]], k 2 -> ([3, 1], [[1, 2], [2,
    0]])."""
    n = tokens.shape[0]
    slot_ids = torch.cat([root.to(logits.device), tokens.to(logits.device)])  # [N+1]
    return slot_ids, torch.topk(logits[: n + 1], k, dim=-1).indices  # [N+1, k]


@dataclass
class _Turn:
    """What one turn's prefill and verification steps share."""

    runner: object
    cache: object
    layout: object
    device: torch.device
    vocab: int
    sampling: SamplingParams
    generator: torch.Generator | None
    fast: bool                 # greedy acceptance computed on the device (one readback per step)
    want_hidden: list | bool   # the output_hidden_states selection (False: none)
    packed_dtype: torch.dtype  # of the readback (harness.engine.hostio.pack_dtype)
    clock: _Clock
    stats: _TurnStats
    committed: int             # positions in the cache


@dataclass
class _Verified:
    """The verdict of one verification step."""

    path: list[int]            # accepted draft slots (0-based)
    path_tokens: list[int]     # their tokens
    bonus: int                 # the target's token after them (the next root)
    bonus_dev: torch.Tensor    # [1] the same on the device
    depth: int                 # the tree's depth
    logits: torch.Tensor | None  # [N+1, V] the slots' logits on the device (greedy readback path), else None


class _TurnStats:
    """Per-turn raw counters of the loop (see :class:`harness.engine.method.Generation`)."""

    def __init__(self, packed: torch.dtype):
        self.accept_lengths: list[int] = []
        self.accepted_drafts: list[int] = []
        self.draft_depths: list[int] = []
        self.trace = LogitTrace(packed)  # the emitted tokens' logit margins, on the device until the turn's end
        self.target_forwards = 0
        self.tree_tokens = 0

    def step(self, tree_size: int, depth: int, accepted: int, emitted: int) -> None:
        self.target_forwards += 1
        self.tree_tokens += tree_size
        self.draft_depths.append(depth)
        self.accepted_drafts.append(accepted)
        self.accept_lengths.append(emitted)
