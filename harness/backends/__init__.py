"""Backends: engines other than the harness's own that a run can measure, behind one contract.

Not to be confused with :mod:`harness.engine`, the verification engine every draftbench method runs on (the
``harness`` engine of a run). A backend takes a method entry (target, method, options, ``engine_options``) and runs
its turns in another engine, returning the same per-turn data (:mod:`harness.backends.contract`).
``engine: vllm`` (vLLM in-process, :mod:`harness.backends.vllm`) or ``engine: openai`` (any OpenAI-compatible
server, :mod:`harness.backends.served`) in a run configuration (per run or per method entry), or ``--engine``,
selects one; ``engine: harness``, the default, runs the method itself. An entry's engine is checked once, before
anything loads, by :func:`check_engine`, which derives what the engine needs of the entry once (an
:class:`~harness.backends.contract.EnginePlan`: vLLM's ``speculative_config``, a server's own options);
:func:`create_backend` starts the engine from that plan (:mod:`harness.run.entries` does both for a run).

Modules: ``contract`` (the per-turn data every backend returns, the engine plan, the engines and their acceptance
conventions), ``vllm`` (vLLM in process, through ``worker``, a JSON-lines worker process, running ``vllm_worker`` in
vLLM's own venv), ``served`` (any OpenAI-compatible server; ``exchange``, its bounded HTTP exchanges, and
``replies``, what a server answers, checked), ``prometheus`` (a server's ``/metrics`` counters) and ``launch`` (a
server started for a run and stopped at its end).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.backends.contract import ENGINES, Backend, EngineError, EnginePlan


def check_engine(engine: str, method: str, options: Any, given: set[str], target: str,
                 engine_options: dict[str, Any] | None) -> EnginePlan:
    """The :class:`EnginePlan` of a method entry on ``engine``: checked once, before anything is loaded, with what
    the engine needs of the entry derived once; a method entry that ``engine`` cannot run is one
    :class:`EngineError`. Example: ("vllm", "pld", PldOptions(), set(), "smollm2-135m", None) -> a plan whose
    ``speculative`` is {"method": "ngram", "num_speculative_tokens": 10, ...}."""
    plan = EnginePlan(engine, method, options, frozenset(given), target, dict(engine_options or {}))
    if engine == "harness":
        return plan
    if engine == "vllm":
        from harness.backends.vllm import check_python, llm_options, speculative_config

        if "server_url" in plan.engine_options:
            raise EngineError("engine vllm runs vLLM in-process; a server_url is measured with engine openai")
        spec = speculative_config(method, options, given, target, plan.engine_options)
        llm_options(plan.engine_options)
        check_python()
        return dataclasses.replace(plan, speculative=spec, speculates=spec is not None)
    if engine == "openai":
        return _served_plan(plan)
    raise EngineError(f"unknown engine {engine!r}; use {' or '.join(ENGINES)}")


def _served_plan(plan: EnginePlan) -> EnginePlan:
    """An ``engine: openai`` entry's plan: its own options (``served``), the speculative configuration of the vLLM
    it launches (None when it launches none or vLLM does not speculate) and whether the entry speculates."""
    from harness.backends.served import OPTIONS, check_options

    opts = check_options(plan.method, set(plan.given), plan.engine_options)
    if opts.get("launch") == "llama.cpp":  # configured by llama-server's own flags
        from harness.backends.launch import llama_server

        llama_server()
    elif opts.get("launch") == "sglang":  # configured by SGLang's own flags
        from harness.backends.launch import sglang_python

        sglang_python()
    if opts.get("launch") != "vllm":
        return dataclasses.replace(plan, served=opts, speculates=plan.method != "vanilla")
    from harness.backends.vllm import check_python, speculative_config

    vllm_options = {k: v for k, v in plan.engine_options.items() if k not in OPTIONS}
    spec = speculative_config(plan.method, plan.options, set(plan.given), plan.target, vllm_options)
    check_python()
    return dataclasses.replace(plan, served=opts, speculative=spec, speculates=spec is not None)


def target_vocab(target: Any) -> int | None:
    """The token ids a served engine may send for a :class:`harness.models.Target`: below its tokenizer's
    vocabulary (added tokens included), or its model's ``vocab_size`` where it has no tokenizer; None where
    neither is known. Example: the tests' tiny target (a character tokenizer of 101 tokens, a model of 128) -> 101."""
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is not None:
        return len(tokenizer)
    size = getattr(getattr(target, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def create_backend(plan: EnginePlan, target_path: str, dtype: str, positions: int | None = None,
                   window: int | None = None, vocab: int | None = None) -> Backend:
    """The backend of a method entry on another engine than the harness (``plan``, from :func:`check_engine`); it
    is loaded (or connected) and ready. ``positions``: the context a run of long prompts needs, for a vLLM it
    starts (``vllm.llm_options``, which adds its drafter's room within the target's ``window``). ``vocab``: the
    target's vocabulary (:func:`target_vocab`), which a served engine's token ids must lie in."""
    if plan.engine == "openai":
        return _served_backend(plan, target_path, dtype, positions, window, vocab)
    if plan.engine != "vllm":
        raise EngineError(f"engine {plan.engine} runs no backend (the harness runs its method itself)")
    from harness.backends.vllm import VLLMBackend, llm_options

    backend = VLLMBackend(target_path, dtype, plan.speculative,
                          llm_options(plan.engine_options, positions, plan.speculative, window))
    backend.engine_options = dict(plan.engine_options)
    return backend


def _served_backend(plan: EnginePlan, target_path: str, dtype: str, positions: int | None,
                    window: int | None = None, vocab: int | None = None) -> Backend:
    from harness.backends.exchange import masked
    from harness.backends.served import OPTIONS, ServedBackend, option_flags

    opts, spec, target = plan.served, plan.speculative, plan.target
    if opts.get("launch") is None:
        backend = ServedBackend(opts["server_url"], opts, target, target_path, plan.speculates, vocab=vocab)
        # a server started elsewhere runs its own configuration, which it does not report: n/a, not the defaults
        backend.ran_options = {"server_config": "n/a"}
    elif opts["launch"] in ("llama.cpp", "sglang"):
        from harness.backends import launch

        flags = {**{k: v for k, v in plan.engine_options.items() if k not in OPTIONS},
                 **option_flags(opts["launch"], plan.options, set(plan.given))}  # SGLang's draft model: the head
        timeout = float(opts.get("startup_timeout_s", launch.STARTUP_TIMEOUT_S))
        if opts["launch"] == "llama.cpp":
            server = launch.launch_llama_cpp(target, target_path, opts.get("gguf"), flags, timeout)
        else:
            server = launch.launch_sglang(target, target_path, dtype, flags, timeout)
        backend = ServedBackend(server.url, opts, target, target_path, plan.speculates, server,
                                {"launch": opts["launch"], "argv": server.argv, "load_s": server.load_s}, vocab)
        backend.ran_options = dict(flags)  # the server's own flags (spec_type, speculative_algorithm...), no more
    else:
        from harness.backends import launch
        from harness.backends.vllm import llm_options

        serve_options = llm_options({k: v for k, v in plan.engine_options.items() if k not in OPTIONS}, positions,
                                    spec, window)
        server = launch.launch_vllm(target, target_path, dtype, spec, serve_options,
                                    float(opts.get("startup_timeout_s", launch.STARTUP_TIMEOUT_S)))
        backend = ServedBackend(server.url, opts, target, target_path, plan.speculates, server,
                                {"launch": "vllm", "argv": server.argv, "speculative_config": spec,
                                 "load_s": server.load_s}, vocab)
        backend.ran_options = launched_options(plan.method, plan.options, spec)
    # what every record shows: a server_url's password masked (the run's configuration keeps it, for --resume)
    backend.engine_options = {k: masked(v) if k == "server_url" and isinstance(v, str) else v
                              for k, v in plan.engine_options.items()}
    return backend


def launched_options(method: str, options: Any, spec: dict[str, Any] | None) -> dict[str, Any]:
    """What a launched ``vllm serve`` ran of a method entry: the method options vLLM maps (as set) and the
    ``speculative_config`` they became; the options it has no equivalent for are left out (they did not run).
    Example: ("pld", PldOptions(), {"method": "ngram", "num_speculative_tokens": 10, ...}) -> {"num_draft_tokens":
    10, "min_ngram": 1, "max_ngram": 3, "speculative_config": {"method": "ngram", ...}}."""
    from harness.backends.vllm import METHODS

    values = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    return {**{o: values[o] for o in METHODS[method][2] if values.get(o) is not None}, "speculative_config": spec}
