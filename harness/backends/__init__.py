"""Backends: engines other than the harness's own that a run can measure, behind one contract.

Not to be confused with :mod:`harness.engine`, the verification engine every draftbench method runs on (the
``harness`` engine of a run). A backend takes a method entry (target, method, options, ``engine_options``) and runs
its turns in another engine, returning the same per-turn data (:mod:`harness.backends.contract`).
``engine: vllm`` (vLLM in-process, :mod:`harness.backends.vllm`) or ``engine: openai`` (any OpenAI-compatible
server, :mod:`harness.backends.served`) in a run configuration (per run or per method entry), or ``--engine``,
selects one (:func:`create_backend`); ``engine: harness``, the default, runs the method itself, as before.

Modules: ``contract`` (the per-turn data every backend returns, the engines and their acceptance conventions),
``vllm`` (vLLM in process, through ``worker``, a JSON-lines worker process, running ``vllm_worker`` in vLLM's own
venv), ``served`` (any OpenAI-compatible server; ``exchange``, its bounded HTTP exchanges, and ``replies``, what a
server answers, checked), ``prometheus`` (a server's ``/metrics`` counters) and ``launch`` (a server started for a
run and stopped at its end).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.backends.contract import ENGINES, Backend, EngineError


def check_engine(engine: str, method: str, options: Any, given: set[str], target: str,
                 engine_options: dict[str, Any] | None) -> None:
    """Refuse, before anything is loaded, a method entry that ``engine`` cannot run (one :class:`EngineError`)."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; use {' or '.join(ENGINES)}")
    if engine == "vllm":
        from harness.backends.vllm import check_python, llm_options, speculative_config

        if "server_url" in (engine_options or {}):
            raise EngineError("engine vllm runs vLLM in-process; a server_url is measured with engine openai")
        speculative_config(method, options, given, target, engine_options)
        llm_options(engine_options)
        check_python()
    elif engine == "openai":
        _served_options(method, options, given, target, engine_options)


def _served_options(method: str, options: Any, given: set[str], target: str,
                    engine_options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None, bool]:
    """An ``engine: openai`` entry's own options, the speculative configuration of the vLLM it launches (None when
    it launches none or vLLM does not speculate) and whether the entry speculates."""
    from harness.backends.served import OPTIONS, check_options

    opts = check_options(method, given, engine_options)
    if opts.get("launch") == "llama.cpp":  # configured by llama-server's own flags
        from harness.backends.launch import llama_server

        llama_server()
    elif opts.get("launch") == "sglang":  # configured by SGLang's own flags
        from harness.backends.launch import sglang_python

        sglang_python()
    if opts.get("launch") != "vllm":
        return opts, None, method != "vanilla"
    from harness.backends.vllm import check_python, speculative_config

    vllm_options = {k: v for k, v in (engine_options or {}).items() if k not in OPTIONS}
    spec = speculative_config(method, options, given, target, vllm_options)
    check_python()
    return opts, spec, spec is not None


def target_vocab(target: Any) -> int | None:
    """The token ids a served engine may send for a :class:`harness.models.Target`: below its tokenizer's
    vocabulary (added tokens included), or its model's ``vocab_size`` where it has no tokenizer; None where
    neither is known. Example: the tests' tiny target (a character tokenizer of 101 tokens, a model of 128) -> 101."""
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is not None:
        return len(tokenizer)
    size = getattr(getattr(target, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def create_backend(engine: str, method: str, options: Any, given: set[str], target: str, target_path: str,
                   dtype: str, engine_options: dict[str, Any] | None, positions: int | None = None,
                   window: int | None = None, vocab: int | None = None) -> Backend | None:
    """The backend of a method entry (None for ``engine: harness``); it is loaded (or connected) and ready.
    ``positions``: the context a run of long prompts needs, for a vLLM it starts (``vllm.llm_options``, which adds
    its drafter's room within the target's ``window``). ``vocab``: the target's vocabulary (:func:`target_vocab`),
    which a served engine's token ids must lie in."""
    check_engine(engine, method, options, given, target, engine_options)
    if engine == "harness":
        return None
    if engine == "openai":
        return _served_backend(method, options, given, target, target_path, dtype, engine_options, positions,
                               window, vocab)
    from harness.backends.vllm import VLLMBackend, llm_options, speculative_config

    speculative = speculative_config(method, options, given, target, engine_options)
    backend = VLLMBackend(target_path, dtype, speculative, llm_options(engine_options, positions, speculative, window))
    backend.engine_options = dict(engine_options or {})
    return backend


def _served_backend(method: str, options: Any, given: set[str], target: str, target_path: str, dtype: str,
                    engine_options: dict[str, Any] | None, positions: int | None,
                    window: int | None = None, vocab: int | None = None) -> Backend:
    from harness.backends.exchange import masked
    from harness.backends.served import OPTIONS, ServedBackend, option_flags

    opts, spec, speculative = _served_options(method, options, given, target, engine_options)
    if opts.get("launch") is None:
        backend = ServedBackend(opts["server_url"], opts, target, target_path, speculative, vocab=vocab)
        # a server started elsewhere runs its own configuration, which it does not report: n/a, not the defaults
        backend.ran_options = {"server_config": "n/a"}
    elif opts["launch"] in ("llama.cpp", "sglang"):
        from harness.backends import launch

        flags = {**{k: v for k, v in (engine_options or {}).items() if k not in OPTIONS},
                 **option_flags(opts["launch"], options, given)}  # SGLang's draft model: the entry's head
        timeout = float(opts.get("startup_timeout_s", launch.STARTUP_TIMEOUT_S))
        if opts["launch"] == "llama.cpp":
            server = launch.launch_llama_cpp(target, target_path, opts.get("gguf"), flags, timeout)
        else:
            server = launch.launch_sglang(target, target_path, dtype, flags, timeout)
        backend = ServedBackend(server.url, opts, target, target_path, speculative, server,
                                {"launch": opts["launch"], "argv": server.argv, "load_s": server.load_s}, vocab)
        backend.ran_options = dict(flags)  # the server's own flags (spec_type, speculative_algorithm...), no more
    else:
        from harness.backends import launch
        from harness.backends.vllm import llm_options

        serve_options = llm_options({k: v for k, v in (engine_options or {}).items() if k not in OPTIONS}, positions,
                                    spec, window)
        server = launch.launch_vllm(target, target_path, dtype, spec, serve_options,
                                    float(opts.get("startup_timeout_s", launch.STARTUP_TIMEOUT_S)))
        backend = ServedBackend(server.url, opts, target, target_path, speculative, server,
                                {"launch": "vllm", "argv": server.argv, "speculative_config": spec,
                                 "load_s": server.load_s}, vocab)
        backend.ran_options = launched_options(method, options, spec)
    # what every record shows: a server_url's password masked (the run's configuration keeps it, for --resume)
    backend.engine_options = {k: masked(v) if k == "server_url" and isinstance(v, str) else v
                              for k, v in (engine_options or {}).items()}
    return backend


def launched_options(method: str, options: Any, spec: dict[str, Any] | None) -> dict[str, Any]:
    """What a launched ``vllm serve`` ran of a method entry: the method options vLLM maps (as set) and the
    ``speculative_config`` they became; the options it has no equivalent for are left out (they did not run).
    Example: ("pld", PldOptions(), {"method": "ngram", "num_speculative_tokens": 10, ...}) -> {"num_draft_tokens":
    10, "min_ngram": 1, "max_ngram": 3, "speculative_config": {"method": "ngram", ...}}."""
    from harness.backends.vllm import METHODS

    values = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    return {**{o: values[o] for o in METHODS[method][2] if values.get(o) is not None}, "speculative_config": spec}
