"""One door for a turn: a run's method entries, planned once, each asked for a turn the same way whatever runs it.

Spec-Bench (arXiv:2401.07851) calls one ``forward_func`` for every method, the baseline included, and vLLM asks
every drafter through one ``propose()``; here the runner asks every entry of a run for a turn through
:meth:`Entry.turn` and ends it with :meth:`Entry.close`, whether draftbench's own engine runs it
(:class:`HarnessEntry`: the method on its runtime, timed by the run's tracker) or another engine does
(:class:`BackendEntry`: vLLM in process or a served engine, :mod:`harness.backends`), so
:func:`harness.run.runner.run_question` and the load levels (:mod:`harness.run.load`) have no branch on the engine.

:func:`plan_entries` reads the configuration once, before anything loads: each entry's method class, its options
built and checked, and its engine checked once, with what that engine needs of the entry derived once
(:func:`harness.backends.check_engine`: vLLM's ``speculative_config``, a server's own options).
:func:`open_entries` builds one entry per plan once the target is loaded. An entry on another engine never builds
the harness method (an EAGLE-3 head vLLM loads is found from the options and the heads shipped for the target,
:func:`harness.backends.vllm.speculative_config`); what its records say of the method (name, lossless, options)
comes from the method's class and options. :func:`token_budget` owns a turn's token budget and its cut to the
target's window, for measured turns, the warm-up, load levels and the context an engine reserves
(:func:`engine_positions`).
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.backends import check_engine, create_backend, target_vocab
from harness.backends.contract import Backend, EnginePlan, TurnRequest, entry_options, turn_fields
from harness.engine.method import Method, build_options, recorded_options
from harness.engine.runtime import target_runner
from harness.engine.sampling import SamplingParams
from harness.measure.metrics import kv_cache_bytes
from harness.measure.trackers import Tracker, load_average
from harness.models import Target, kv_shape
from harness.registry import get_method
from harness.run.config import ConfigError, MethodSpec, RunConfig

PROFILE = {"auto": None, "on": True, "off": False}  # RunConfig.profile -> SpeculativeMethod.profile
WARM_UP_TOKENS = 64  # a warm-up question's budget at most: it fills caches, it is not measured


def token_budget(run_max: int, suite_max: int | None, prompt_tokens: int = 0, window: int | None = None,
                 warm_up: bool = False) -> int:
    """The new tokens a turn may generate: the suite's ``max_new_tokens`` (``suite_max``) where it sets one, else
    the run's (``run_max``), at most :data:`WARM_UP_TOKENS` in the warm-up, cut so that a prompt of
    ``prompt_tokens`` and its answer fit the target's ``window`` (its ``max_position_embeddings``; None: no limit).
    A prompt that leaves no room in the window raises ValueError (that turn's error).
    Examples: (512, None) -> 512; (512, 128) -> 128; (512, None, warm_up=True) -> 64; (512, None, 1800, 2048)
    -> 248; (512, None, 2048, 2048) raises."""
    budget = suite_max or run_max
    if warm_up:
        budget = min(WARM_UP_TOKENS, budget)
    if window and prompt_tokens + budget > window:
        budget = window - prompt_tokens
        if budget <= 0:
            raise ValueError(f"prompt of {prompt_tokens} tokens leaves no room in the model's {window}-token context")
    return budget


def engine_positions(suites: list, run_max: int, window: int | None) -> int | None:
    """The positions an engine that reserves its context up front (vLLM's ``max_model_len``) must hold for the
    run's longest context prompt and its answer: over the context suites (:mod:`harness.run.context`), the longest
    bucket plus its :func:`token_budget`, which is cut to the target's window; None without a context suite.
    Examples: buckets (512, 2048), 64 new tokens, window 8192 -> 2112; buckets (7168,), 2048 new tokens, the same
    window -> 8192; buckets (64, 128), 3 new tokens, no window -> 131."""
    return max((max(s.context.buckets) + token_budget(run_max, s.max_new_tokens, max(s.context.buckets), window)
                for s in suites if s.context is not None), default=None)


@dataclass
class Turn:
    """One turn as the runner asks it of an entry: the conversation so far (``messages``, the suite's system prompt
    first where it has one, ending with the user's turn), its rendering by the run's chat template
    (``prompt_ids`` [1, P]), the turn's budget (:func:`token_budget`), sampling, the question's ``seed`` and its
    ``generator`` (whose state runs on across the question's turns), and ``context``: a context prompt, whose
    record gives the KV cache it needed."""

    messages: list[dict[str, str]]
    prompt_ids: torch.Tensor
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    generator: torch.Generator
    context: bool = False


class Entry(abc.ABC):
    """A method entry of a run, built once (:func:`open_entries`) and asked for each turn (:meth:`turn`, the fields
    of the turn's record that its engine measured, ``output_text`` among them); :meth:`close` stops whatever it
    started. ``name``, ``lossless``, ``deployable``: the method's; ``runtime``: how the harness calls the target
    for it and ``runner`` that target runner (what the warm-up and the manifest report); ``backend``: the engine
    running its turns, None for the harness's own; ``method_options``: the options its records show."""

    backend: Backend | None = None

    def __init__(self, label: str, name: str, lossless: bool, deployable: bool, runtime: str, target: Target):
        self.label, self.name, self.lossless, self.deployable = label, name, lossless, deployable
        self.runtime = runtime
        self.runner = target_runner(target, runtime)
        self.target = target

    @property
    def method_options(self) -> dict[str, Any]:
        return self.describe()["options"]

    @abc.abstractmethod
    def turn(self, turn: Turn) -> dict[str, Any]: ...

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The entry in the manifest (``methods``): the method, lossless, its options as the records show them
        (:func:`harness.backends.contract.entry_options`) and the runtime."""

    @abc.abstractmethod
    def forget(self) -> None:
        """Drop what a stateful method learned (the warm-up's answers)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop whatever the entry started (an engine)."""


class HarnessEntry(Entry):
    """An entry draftbench's engine runs: its method on the entry's runtime, each turn timed by ``tracker``. A
    method with ``prepare_turn(prompt_ids, budget)`` has it called before each timed turn, outside the tracker:
    untimed work the turn needs first (the ``oracle``'s greedy pass, methods/oracle.py)."""

    def __init__(self, label: str, method: Method, target: Target, tracker: Tracker):
        super().__init__(label, method.name, method.lossless, getattr(method, "deployable", True), method.runtime,
                         target)
        self.method, self.tracker = method, tracker
        self.described = method.describe()

    def describe(self) -> dict[str, Any]:
        return copy.deepcopy(self.described)

    def turn(self, turn: Turn) -> dict[str, Any]:
        method = self.method
        prepare = getattr(method, "prepare_turn", None)  # untimed work a method needs first (the oracle's)
        if prepare is not None:
            prepare(turn.prompt_ids, turn.max_new_tokens)
        with self.tracker.track() as m:
            gen = method.generate(turn.prompt_ids, turn.max_new_tokens, turn.sampling, turn.generator)
        fields = dict(
            new_tokens=len(gen.token_ids), steps=gen.steps,
            accept_lengths=gen.accept_lengths, accepted_drafts=gen.accepted_drafts,
            draft_depths=gen.draft_depths, wall_time_s=m.wall_time_s, prefill_time_s=gen.prefill_time_s,
            stop_reason=gen.stop_reason, output_text=self.target.decode(gen.token_ids), output_ids=gen.token_ids,
            rss_bytes=m.rss_bytes, peak_rss_bytes=m.peak_rss_bytes,
            cuda_peak_allocated_bytes=m.cuda_peak_allocated_bytes,
            cuda_peak_reserved_bytes=m.cuda_peak_reserved_bytes, nvml_used_bytes=m.nvml_used_bytes,
            energy_j=m.energy_j, mean_power_w=m.mean_power_w, energy_source=m.energy_source,
            load_avg_1m=m.load_avg_1m,
            timings=gen.timings, counters=gen.counters,
            timings_synchronised=gen.timings_synchronised, nvml_devices=m.nvml_devices,
            logit_margins=gen.logit_margins or None, logit_tops=gen.logit_tops or None,
            logit_runner_ups=gen.logit_runner_ups or None,
        )
        if turn.context:
            positions = int(turn.prompt_ids.shape[1]) + len(gen.token_ids)
            fields["kv_cache_bytes"] = target_kv_bytes(self.target, positions)
            fields["draft_kv_bytes"] = method.draft_kv_bytes(positions)
        if gen.speculation_off is not None:  # the turn stopped speculating (absent otherwise)
            fields["speculation_off"] = gen.speculation_off
        if gen.method_notes is not None:  # what the method chose in the turn (absent otherwise)
            fields["method_notes"] = gen.method_notes
        return fields

    def forget(self) -> None:
        self.method.forget()

    def close(self) -> None:
        pass  # the harness's method holds nothing to stop (the target is the run's)


class BackendEntry(Entry):
    """An entry another engine runs (``backend``, :mod:`harness.backends`); the harness method is never built: what
    the records say of it comes from its class and ``options``."""

    def __init__(self, label: str, method: type[Method], options: Any, runtime: str, target: Target,
                 backend: Backend):
        super().__init__(label, method.name, method.lossless_with(options), getattr(method, "deployable", True),
                         runtime, target)
        self.options, self.backend = options, backend

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, "lossless": self.lossless,
                "options": entry_options(recorded_options(self.options), self.backend), "runtime": self.runtime,
                **({} if self.deployable else {"deployable": False})}

    def turn(self, turn: Turn) -> dict[str, Any]:
        s = turn.sampling
        done = self.backend.generate(TurnRequest(turn.messages, turn.prompt_ids[0].tolist(), turn.max_new_tokens,
                                                 s.temperature, s.top_p, s.top_k, turn.seed))
        # a server that sent text without token ids: its text (output_ids stay null)
        answer = done.text if done.token_ids is None else self.target.decode(done.token_ids)
        fields = {"output_text": answer, "load_avg_1m": load_average(), **turn_fields(done, self.backend)}
        if turn.context:  # the engine's own caches are not visible from here: n/a, never 0
            fields.update(kv_cache_bytes=None, draft_kv_bytes=None)
        return fields

    def forget(self) -> None:
        pass  # the engine holds no state of draftbench's method

    def close(self) -> None:
        self.backend.close()


def target_kv_bytes(target: Target, positions: int) -> int | None:
    """Bytes of the target's KV cache holding ``positions`` tokens in its dtype
    (:func:`harness.measure.metrics.kv_cache_bytes`); None when its config does not give the shape."""
    layers, kv_heads, head_dim, _ = kv_shape(target.config.to_dict())
    if None in (layers, kv_heads, head_dim):
        return None
    return kv_cache_bytes(layers, kv_heads, head_dim, positions, target.dtype.itemsize)


@dataclass
class EntryPlan:
    """A method entry checked before anything loads: its configuration (``spec``), method class, options built
    from the configuration and its engine's plan (:class:`harness.backends.contract.EnginePlan`)."""

    spec: MethodSpec
    method: type[Method]
    options: Any
    engine: EnginePlan


def plan_entries(config: RunConfig, processes: int = 1) -> list[EntryPlan]:
    """The run's entries (:meth:`RunConfig.entries`) checked once, before anything is loaded: an unknown method name,
    bad options or an engine that cannot run its entry fail here, as does an entry on another engine in a
    data-parallel run of ``processes`` (every process would start its own engine on the same GPUs)."""
    specs = config.entries()
    classes = [get_method(spec.name) for spec in specs]
    plans = []
    for spec, cls in zip(specs, classes, strict=True):
        options = build_options(cls.Options, spec.options, f"method {spec.name!r}")
        engine = check_engine(spec.engine, spec.name, options, set(spec.options), config.target, spec.engine_options)
        if processes > 1 and spec.engine != "harness":
            raise ConfigError(f"entry {spec.label!r} runs on engine {spec.engine}, which parallelises itself: run it "
                              "in one process (not accelerate launch / torchrun) with engine_options such as "
                              "{tensor_parallel_size: 2, pipeline_parallel_size: 2}")
        plans.append(EntryPlan(spec, cls, options, engine))
    return plans


def open_entries(plans: list[EntryPlan], target: Target, profile: str, positions: int | None, tracker: Tracker,
                 on_compile: Callable | None = None, copies: Mapping[str, Target] | None = None) -> dict[str, Entry]:
    """One entry per plan, by label, ready for its turns: the harness's methods built on ``target`` (``profile``:
    the run's, :data:`PROFILE`), the other engines started (``positions``: what a run of long prompts needs,
    :func:`engine_positions`). ``on_compile``: told when a compiled runtime compiles a graph (the progress lines).
    ``copies``: the target in each precision of a run with ``precisions`` (:func:`harness.models.with_precision`),
    by precision; a harness entry with a ``precision`` runs on its copy.
    When one entry fails to open, those already open are closed before the error goes on."""
    window = getattr(target.config, "max_position_embeddings", None)
    entries: dict[str, Entry] = {}
    try:
        for plan in plans:
            spec = plan.spec
            if plan.engine.engine == "harness":
                on = (copies or {}).get(spec.precision, target)
                method = plan.method.create(on, spec.options)
                method.profile = PROFILE[profile]
                method.runtime = spec.runtime
                entries[spec.label] = HarnessEntry(spec.label, method, on, tracker)
            else:
                backend = create_backend(plan.engine, target.path, str(target.dtype).replace("torch.", ""),
                                         positions, window, target_vocab(target))
                entries[spec.label] = BackendEntry(spec.label, plan.method, plan.options, spec.runtime, target,
                                                   backend)
            if hasattr(entries[spec.label].runner, "on_compile"):
                entries[spec.label].runner.on_compile = on_compile
    except BaseException:
        for entry in entries.values():
            entry.close()
        raise
    return entries
