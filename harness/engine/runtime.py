"""The target's forward, eager or compiled: the one seam through which vanilla and the engine run the target.

``runtime: eager | compiled`` (a run field and a per-method-entry option) picks a :class:`TargetRunner`:

- ``eager`` (:class:`TargetRunner`): the Hugging Face model called as it is, with a ``DynamicCache``: exactly the
  calls vanilla and the engine made before runners existed.
- ``compiled`` (:class:`CompiledRunner`): the same unmodified model through ``torch.compile`` (inductor), so that
  speed-ups can also be reported against an optimized baseline. Two flavours:

  * *dynamic* (default on CPU): ``DynamicCache`` and dynamic shapes, so one graph serves every prompt length,
    cache length and tree size (a verification over one slot is padded to two: dynamo specialises a size-1
    dimension, and a second graph would only add compile time); inductor freezes the weights into constants and
    packs every linear layer's weight for oneDNN's small-row kernel (see below).
  * *static* (default on CUDA, where CUDA graphs need fixed shapes and addresses): one transformers
    ``StaticCache`` per runner, reused across turns (``max_cache_len`` a power of two >= what a turn needs), the
    prefill eager (as transformers' own static-cache generation does), and every decoding or verification forward
    compiled with static shapes: a tree of n slots is padded to the next bucket of :data:`TREE_BUCKETS` with
    slots no real slot sees (:func:`pad_tree_slots`), so only a few graphs exist, each captured as a CUDA graph
    (inductor's ``triton.cudagraphs``). Full-attention targets only (a sliding layer's static cache is a ring).

Losslessness does not depend on the runtime (it is the same verification over the same model); the output equals
eager's token for token unless a near tie flips under the other kernels' rounding (fp32 on the default model:
tested, ``tests/test_runtime.py``). Compilation happens lazily at the first call of each new graph; a runner counts
the graphs it compiled and the seconds spent (``graphs``, ``compile_s``) so that the harness can keep compilation
out of measured turns (it is warm-up) and report it separately.

Why the compiled CPU forward is faster (SmolLM2-135M, fp32, one thread; the verify-cost table of both runtimes is in
docs/results.md, "The engine's parts"): the weights are read once per forward (540 MB) whatever the number of rows k, so
up to ~8 rows a forward could cost what one row costs. MKL's sgemm for 2-8 rows is 1.5-3x slower than for one row,
and a packed MKL sgemm is no better; oneDNN's packed fp32 linear (``torch.ops.mkldnn._linear_pointwise`` with a
weight reordered for a batch of 64) reads the weights at ~30 GB/s for 1 to 8 rows alike. Inductor already packs
weights when it freezes a graph, but for fp32 with a static batch it packs for MKL; :func:`onednn_packed_linears`
makes it take its oneDNN branch (the one it takes for bf16 and for dynamic batch sizes) while a graph of this runner
compiles. The rest of the gain is the per-op framework overhead that a compiled graph does not pay.

Compiling once: every method of one runtime calls the target through one runner (:func:`target_runner`, one per
target and runtime), so entries that run the same forward at the same shapes share its graphs (vanilla's prefill
serves every method's prefill; a second entry of a method compiles nothing). Across runs, inductor's artefacts live
in the runner's ``cache_dir`` (:mod:`harness.engine.compilecache`: ``$DRAFTBENCH_CACHE/compile/<key>``, checked
against this torch, CPU, model architecture, dtype and flavour before use; ``draftbench cache clear`` removes them).
What a second run reuses depends on whether the weights are frozen (``freeze``, :data:`FREEZE_CPU`): a frozen graph
holds packed oneDNN weights, which inductor's FX-graph and AOTAutograd caches refuse (packed oneDNN weights cannot be
pickled; AOTAutograd does not cache frozen graphs), so it reuses the compiled C++ kernels only and traces and lowers
every graph again; a graph that takes the weights as inputs (the static flavour, or ``freeze=False``) is loaded whole
from both caches by the next run (a runner counts those in ``loaded``; each "end" :class:`CompileEvent` says so).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from harness.engine.compilecache import (
    LOADED,
    cache_counts,
    cache_root,
    check_folder,
    compile_cache_key,
    identity,
    inductor_cache_dir,
    outcome,
)
from harness.engine.kv import attention_layout, static_cache_length, verification_masks
from harness.models import Target

RUNTIMES = ("eager", "compiled")
# tree-size buckets of the static flavour (slots, root included); beyond the last one, powers of two
TREE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# the batch size oneDNN lays packed weights out for: a hint of 1 was markedly slower for 2-64 rows, 8-64 were equal
# (measured on the default model, one CPU thread, when this runner was written)
PACK_BATCH_HINT = 64
# fewest slots of a verification forward in the dynamic flavour (a size-1 dimension would get its own graph)
DYNAMIC_MIN_SLOTS = 2
# whether the dynamic CPU flavour freezes and packs the weights by default (CompiledRunner's ``freeze``)
FREEZE_CPU = True
# the smallest static cache (positions); longer turns get the next power of two
STATIC_MIN_CACHE = 1024


def check_runtime(name: Any) -> str:
    """``name`` if it is a runtime (:data:`RUNTIMES`), else ``ValueError`` with one line naming the choices."""
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; use one of {', '.join(RUNTIMES)}")
    return name


def bucket_slots(slots: int, buckets: tuple[int, ...] = TREE_BUCKETS) -> int:
    """The padded size of a forward over ``slots`` slots: the smallest bucket >= slots, beyond the last bucket the
    next power of two. Examples: 1 -> 1, 3 -> 4, 26 -> 32 (EAGLE-1's 25-node tree), 60 -> 64, 65 -> 128."""
    if slots < 1:
        raise ValueError(f"a forward needs at least one slot, got {slots}")
    for b in buckets:
        if b >= slots:
            return b
    return 1 << (slots - 1).bit_length()


def pad_tree_slots(ids: torch.Tensor, ancestors: torch.Tensor, depth: torch.Tensor,
                   slots: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A verification forward's ``ids [1, n]``, ``ancestors [n, n]`` (bool) and ``depth [n]`` padded to ``slots``.

    A pad slot holds token 0 at depth 0 (the root's position) and sees only the committed prefix and itself; no real
    slot sees it, so the real slots' logits and K/V are those of the unpadded forward, and compaction drops the pad
    slots with every other rejected one (they come last). Example: n 2 (root and one child), slots 4 ->
    ancestors rows [[1,0,0,0], [1,1,0,0], [0,0,1,0], [0,0,0,1]], depth [0, 1, 0, 0].
    """
    n = ids.shape[1]
    if slots < n:
        raise ValueError(f"cannot pad {n} slots to {slots}")
    if slots == n:
        return ids, ancestors, depth
    extra = slots - n
    device = ids.device
    ids = torch.cat([ids, torch.zeros(1, extra, dtype=ids.dtype, device=device)], dim=1)
    padded = torch.eye(slots, dtype=torch.bool, device=device)
    padded[:n, :n] = ancestors
    depth = torch.cat([depth, torch.zeros(extra, dtype=depth.dtype, device=device)])
    return ids, padded, depth


def pad_mask_columns(mask: torch.Tensor, length: int) -> torch.Tensor:
    """An additive mask ``[1, 1, q, k]`` widened to ``length`` key columns, the new ones blocked (dtype min): the
    positions of a static cache beyond the committed prefix and the tree hold stale K/V."""
    extra = length - mask.shape[-1]
    if extra < 0:
        raise ValueError(f"mask has {mask.shape[-1]} key columns, more than the cache's {length}")
    if extra == 0:
        return mask
    blocked = torch.full((*mask.shape[:-1], extra), torch.finfo(mask.dtype).min, dtype=mask.dtype,
                         device=mask.device)
    return torch.cat([mask, blocked], dim=-1)


@dataclass(frozen=True)
class CompileEvent:
    """A compiled runner's report that a call started compiling (``phase`` "start": dynamo began tracing a shape it
    had no graph for) or finished (``phase`` "end"), or that its cache folder was unusable (``phase`` "reset",
    ``note`` the one line saying why; it was removed and everything compiles again). ``graph``: the runner's graph
    count when the event fires, ``seconds``: since the call began (at "end": tracing + compilation or loading + one
    run, what ``compile_s`` adds), ``cache``: at "end", what inductor's FX-graph cache did for the call's graphs
    ("hit", "miss" or "bypass", joined by "+" when they differ; "" at "start"), ``loaded``: at "end", True when
    every graph of the call was loaded whole from the cache (nothing lowered or built)."""

    phase: str
    graph: int
    seconds: float
    cache: str = ""
    loaded: bool = False
    note: str = ""


class TargetRunner:
    """The eager runtime: the target's model called directly with a transformers ``DynamicCache``.

    ``forward(ids, cache, prefill=..., **kwargs)`` is ``model(ids, cache=cache, use_cache=True, **kwargs)``;
    ``verify_inputs`` builds the position ids and the 4D mask(s) of a verification forward (see
    :mod:`harness.engine.speculative`). Outputs are valid until the next forward (a CUDA graph reuses its buffers).
    """

    runtime = "eager"

    def __init__(self, target: Target):
        self.target = target
        self.model = target.model
        self.graphs = 0        # graphs compiled or loaded from the compile cache so far (always 0 here)
        self.loaded = 0        # how many of them were loaded whole from the compile cache
        self.compile_s = 0.0   # seconds spent compiling or loading them

    def new_cache(self, tokens: int):
        """An empty cache for a turn that will hold at most ``tokens`` positions (tree slots included)."""
        return DynamicCache(config=self.model.config)

    def forward(self, ids: torch.Tensor, cache, prefill: bool = False, **kwargs):
        """One target forward over ``ids [1, n]`` that appends to ``cache``; ``prefill``: the turn's first forward."""
        return self.model(ids, cache=cache, use_cache=True, **kwargs)

    def verify_inputs(self, ids: torch.Tensor, ancestors: torch.Tensor, depth: torch.Tensor, committed: int,
                      layout, cache) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """``(ids, position_ids, attention_mask)`` of a verification forward over ``ids [1, N+1]`` (root first)."""
        pos = (depth + committed)[None]  # [1, N+1]
        return ids, pos, verification_masks(layout, cache, ancestors, depth, committed, self.target.dtype)

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this runtime."""
        return {"runtime": self.runtime, "backend": "eager", "cache": "dynamic"}


class CompiledRunner(TargetRunner):
    """The compiled runtime (see the module docstring). ``static``: None = by device (static on CUDA, dynamic
    elsewhere); True/False forces a flavour (tests run the static flavour on CPU, without CUDA graphs). ``freeze``
    (dynamic flavour on CPU only): None = :data:`FREEZE_CPU`; True freezes and packs the weights (fastest forward,
    compiled again every run), False keeps them graph inputs (whole graphs reused by the next run)."""

    runtime = "compiled"

    def __init__(self, target: Target, static: bool | None = None, freeze: bool | None = None):
        super().__init__(target)
        self.on_compile: Callable[[CompileEvent], None] | None = None  # told when a call starts and ends compiling
        device = target.device
        if getattr(self.model, "hf_device_map", None) and len(set(self.model.hf_device_map.values())) > 1:
            raise ValueError("runtime 'compiled' needs the target on one device; this one is spread over "
                             f"{sorted({str(d) for d in self.model.hf_device_map.values()})} by a device map")
        self.static = device.type == "cuda" if static is None else bool(static)
        self.cudagraphs = self.static and device.type == "cuda"
        # freezing makes the weights graph constants (and lets inductor pack them); it would freeze a static cache's
        # buffers too (dynamo lifts static-address tensors like parameters), so the static flavour does without
        can_freeze = device.type == "cpu" and not self.static
        if freeze and not can_freeze:
            raise ValueError("freeze=True needs the dynamic flavour on CPU (a static cache's buffers would freeze)")
        self.freezing = can_freeze and (FREEZE_CPU if freeze is None else bool(freeze))
        self.onednn = self.freezing and onednn_packing_available()
        linear = f"onednn{PACK_BATCH_HINT}" if self.onednn else "default"
        # what identity.json records and the folder's key includes: "static", "dynamic" or "dynamic+frozen"
        self.flavour = ("static" if self.static else "dynamic") + ("+frozen" if self.freezing else "")
        self.cache_dir = cache_root() / "compile" / compile_cache_key(target.name, target.path, target.dtype,
                                                                      device.type, f"{self.flavour}/{linear}")
        if self.static:
            layout = attention_layout(DynamicCache(config=self.model.config))
            if layout.types != ("full_attention",):
                raise ValueError(f"runtime 'compiled' with a static cache supports full-attention targets only, this "
                                 f"one has {', '.join(layout.types)} layers; use the dynamic flavour")
        _raise_recompile_limits()
        # dynamic flavour: the dims that vary are marked per call (_mark_dynamic); the others stay static, so that
        # no size is mistaken for a config constant (dynamic=True would make every dim, head counts too, symbolic)
        self._compiled = torch.compile(self.model, backend=self._backend, dynamic=False if self.static else None,
                                       fullgraph=True)
        self._static_cache: StaticCache | None = None
        self._hooks_ready = False
        self._folder_checked = False
        self.cache_note: str | None = None  # why the cache folder was removed before compiling (None: it was not)

    # ---- compilation --------------------------------------------------------------------------------------------
    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        """inductor (with the options :meth:`_call` sets while dynamo traces); counts the graph."""
        from torch._inductor.compile_fx import compile_fx

        with onednn_packed_linears(self.onednn):
            compiled = compile_fx(gm, example_inputs)
        self.graphs += 1
        return compiled

    def _options(self):
        """inductor's options for this runner's graphs. They are set around every call, not only in the backend:
        dynamo reads ``freezing`` while it traces (to keep the weights as constants of the graph)."""
        import torch._inductor.config as inductor_config

        patches: dict[str, Any] = {"compile_threads": max(1, torch.get_num_threads()), "freezing": self.freezing,
                                   "triton.cudagraphs": self.cudagraphs}
        return inductor_config.patch(patches)

    def _call(self, fn, ids: torch.Tensor, cache, kwargs: dict):
        graphs = self.graphs
        t0 = time.perf_counter()
        if not ids.is_inference():  # a tensor made outside inference mode (a prompt) would be another graph input
            with torch.inference_mode():
                ids = ids.clone()
        kwargs.setdefault("output_hidden_states", False)  # vanilla's calls and the engine's then share graphs
        if kwargs["output_hidden_states"] and not self._hooks_ready:
            # transformers installs its hidden-state hooks at the first forward that asks for hidden states, under
            # a lock dynamo cannot trace: let one eager, cache-less one-token forward install them
            with torch.inference_mode():
                self.model(ids[:, :1], use_cache=False, output_hidden_states=kwargs["output_hidden_states"])
            self._hooks_ready = True
        if not self.static:
            _mark_dynamic(ids, cache, kwargs)
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if not self._folder_checked:
            self._check_folder()
        before = cache_counts()  # torch's cache outcomes so far
        with (torch.inference_mode(), _no_duck_shapes(), self._options(), inductor_cache_dir(self.cache_dir),
              self._telling_start(t0)):
            out = fn(ids, cache=cache, use_cache=True, **kwargs)
        if self.graphs != graphs:  # this call compiled or loaded: its time (+ one run) is compile time
            if ids.device.type == "cuda":
                torch.cuda.synchronize(ids.device)
            seconds = time.perf_counter() - t0
            self.compile_s += seconds
            kind, detail = outcome(before, cache_counts())
            if kind == LOADED:
                self.loaded += self.graphs - graphs
            if self.on_compile is not None:
                self.on_compile(CompileEvent("end", self.graphs, seconds, detail, loaded=kind == LOADED))
        return out

    def _check_folder(self) -> None:
        """Before the first compilation: make sure :attr:`cache_dir` holds only artefacts made for this torch, CPU,
        model, dtype and flavour (:func:`harness.engine.compilecache.check_folder`); a folder that does not is
        removed, and :attr:`on_compile` is told why in one line (a "reset" event; :attr:`cache_note` keeps it)."""
        self.cache_note = check_folder(self.cache_dir, identity(self.model, self.target.dtype,
                                                                self.target.device.type, self.flavour))
        self._folder_checked = True
        if self.cache_note and self.on_compile is not None:
            self.on_compile(CompileEvent("reset", self.graphs, 0.0, note=self.cache_note))

    @contextlib.contextmanager
    def _telling_start(self, t0: float) -> Iterator[None]:
        """While a call runs: tell :attr:`on_compile` once when dynamo starts compiling (a shape without a graph)."""
        if self.on_compile is None:
            yield
            return
        from torch._dynamo.callback import callback_handler

        told = []

        def started(_args=None) -> None:
            if not told:
                told.append(True)
                self.on_compile(CompileEvent("start", self.graphs, time.perf_counter() - t0))

        callback_handler.register_start_callback(started)
        try:
            yield
        finally:
            callback_handler.remove_start_callback(started)

    # ---- the seam -----------------------------------------------------------------------------------------------
    def new_cache(self, tokens: int):
        if not self.static:
            return DynamicCache(config=self.model.config)
        length = static_cache_length(tokens, STATIC_MIN_CACHE)
        cache = self._static_cache
        # The cache's tensors are inference tensors (made and updated in inference mode: on CUDA transformers' lazy
        # initialisation moves ``cumulative_length`` to the device, a new tensor, inside the prefill), so they are
        # made and reset in inference mode too, whatever the caller's mode: an in-place reset outside it raises.
        with torch.inference_mode():
            if cache is None or cache.layers[0].max_cache_len < length:  # a longer cache: new shapes, new graphs
                cache = StaticCache(config=self.model.config, max_cache_len=length)
                self._static_cache = cache
            for layer in cache.layers:  # reuse the buffers (CUDA graphs read them by address); stale K/V are masked
                if getattr(layer, "is_initialized", False):
                    layer.cumulative_length.zero_()
        return cache

    def forward(self, ids: torch.Tensor, cache, prefill: bool = False, **kwargs):
        if prefill and self.static:  # transformers' static generation keeps the prefill eager (one shape per prompt)
            with torch.inference_mode():  # it writes the cache's inference tensors in place (see new_cache)
                return self.model(ids, cache=cache, use_cache=True, **kwargs)
        return self._call(self._compiled, ids, cache, kwargs)

    def verify_inputs(self, ids: torch.Tensor, ancestors: torch.Tensor, depth: torch.Tensor, committed: int,
                      layout, cache) -> tuple[torch.Tensor, torch.Tensor, Any]:
        n = ids.shape[1]
        slots = bucket_slots(n) if self.static else max(n, DYNAMIC_MIN_SLOTS)
        ids, ancestors, depth = pad_tree_slots(ids, ancestors, depth, slots)
        pos = (depth + committed)[None]  # [1, slots]
        masks = verification_masks(layout, cache, ancestors, depth, committed, self.target.dtype)
        if self.static:
            masks = pad_mask_columns(masks, cache.layers[0].max_cache_len)  # [1, 1, slots, max_cache_len]
        return ids, pos, masks

    def describe(self) -> dict[str, Any]:
        out = {"runtime": self.runtime, "backend": "inductor", "torch": torch.__version__,
               "cache": "static" if self.static else "dynamic",
               "shapes": f"static, tree buckets {list(TREE_BUCKETS)}" if self.static else
               f"dynamic (verification >= {DYNAMIC_MIN_SLOTS} slots)",
               "prefill": "eager" if self.static else "compiled", "cudagraphs": self.cudagraphs,
               "freezing": self.freezing}
        if self.freezing:
            out["linear"] = (f"oneDNN packed fp32 (batch hint {PACK_BATCH_HINT})" if self.onednn
                             else "inductor default")
        return out


def target_runner(target: Target, runtime: str = "eager") -> TargetRunner:
    """The runner of ``target`` for ``runtime``, made once per target and runtime (methods of one runtime share
    its compiled graphs)."""
    check_runtime(runtime)
    runners = target.runners
    if runtime not in runners:
        runners[runtime] = TargetRunner(target) if runtime == "eager" else CompiledRunner(target)
    return runners[runtime]


# ------------------------------------------------------------------------------------------------ inductor knobs


def _mark_dynamic(ids: torch.Tensor, cache, kwargs: dict) -> None:
    """Mark the dims a dynamic-flavour forward varies in: the query length (ids, position ids, masks; unless 1, which
    dynamo always specialises), the key length (masks) and every cache layer's sequence length. A cache layer left
    non-contiguous by compaction (a slice of a longer tensor) is copied contiguous first: dynamo guards on
    contiguity, and a second graph for the same shapes would only add compile time (the copy costs what the
    ``torch.cat`` of the next forward costs)."""
    mark = torch._dynamo.mark_dynamic
    if ids.shape[1] > 1:
        mark(ids, 1)
    pos = kwargs.get("position_ids")
    if pos is not None and pos.shape[1] > 1:
        mark(pos, 1)
    masks = kwargs.get("attention_mask")
    for mask in (masks.values() if isinstance(masks, dict) else [masks]):
        if mask is not None:
            mark(mask, [2, 3] if mask.shape[2] > 1 else 3)
    for layer in getattr(cache, "layers", []):
        if not getattr(layer, "is_initialized", False) or layer.keys is None:
            continue
        if not layer.keys.is_contiguous():
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
        if layer.keys.shape[-2] > 1:
            mark(layer.keys, 2)
            mark(layer.values, 2)


@contextlib.contextmanager
def _no_duck_shapes() -> Iterator[None]:
    """Trace without duck shaping (equal sizes sharing a symbol): a query length that happens to equal the cache
    length would otherwise be assumed equal to it, and the next step would compile again."""
    from torch.fx.experimental import _config as shape_config

    if not hasattr(shape_config, "use_duck_shape"):
        yield
        return
    saved = shape_config.use_duck_shape
    shape_config.use_duck_shape = False
    try:
        yield
    finally:
        shape_config.use_duck_shape = saved


def _raise_recompile_limits() -> None:
    """One compiled model serves several graphs (prefill, decoding, verification, per hidden-state selection): raise
    dynamo's per-function recompile limit (8) and make hitting it an error rather than a silent eager fallback."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64 if name == "recompile_limit" else 1024))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def _device_op_class():
    try:
        from torch._inductor.fx_passes import mkldnn_fusion
    except ImportError:
        return None
    cls = getattr(mkldnn_fusion, "CpuMkldnnDeviceOp", None)
    if cls is None or not hasattr(cls, "pack_linear_weight") or not hasattr(cls, "pack_linear"):
        return None
    return cls


def onednn_packing_available() -> bool:
    """Whether this torch has the inductor weight-packing hook :func:`onednn_packed_linears` needs (and oneDNN)."""
    return bool(torch.backends.mkldnn.is_available()) and _device_op_class() is not None


@contextlib.contextmanager
def onednn_packed_linears(enabled: bool = True) -> Iterator[None]:
    """While a graph compiles with freezing: pack fp32 linear weights for oneDNN (``mkldnn._linear_pointwise``)
    rather than MKL, laid out for a batch of :data:`PACK_BATCH_HINT` rows.

    Inductor's ``CpuMkldnnDeviceOp.pack_linear_weight(graph, is_lp_weight, weight, batch_size)`` and
    ``pack_linear(graph, is_lp_weight, batch_size, ...)`` choose oneDNN when ``is_lp_weight`` (bf16/fp16 weights),
    else MKL; the flag selects nothing else, so passing True keeps fp32 arithmetic and only changes the kernel.
    A torch without these hooks compiles with its defaults (the manifest then says ``linear: inductor default``).
    """
    cls = _device_op_class() if enabled else None
    if cls is None:
        yield
        return
    pack_weight, pack = cls.pack_linear_weight, cls.pack_linear

    def pack_linear_weight(self, graph, is_lp_weight, transpose_weight_node, batch_size):
        return pack_weight(self, graph, True, transpose_weight_node, PACK_BATCH_HINT)

    def pack_linear(self, graph, is_lp_weight, batch_size, *args):
        return pack(self, graph, True, batch_size, *args)

    cls.pack_linear_weight, cls.pack_linear = pack_linear_weight, pack_linear
    try:
        yield
    finally:
        cls.pack_linear_weight, cls.pack_linear = pack_weight, pack
