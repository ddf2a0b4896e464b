"""Backends: engines other than the harness's own that a run can measure (vLLM today), behind one contract.

Not to be confused with :mod:`harness.engine`, the verification engine every draftbench method runs on (the
``harness`` engine of a run). A backend takes a method entry (target, method, options, ``engine_options``) and runs
its turns in another engine, returning the same per-turn data (:mod:`harness.backends.contract`).
``engine: vllm`` in a run configuration (per run or per method entry) or ``--engine vllm`` selects one
(:func:`create_backend`); ``engine: harness``, the default, runs the method itself, as before.
"""

from __future__ import annotations

from typing import Any

from harness.backends.contract import ENGINES, Backend, EngineError


def check_engine(engine: str, method: str, options: Any, given: set[str], target: str,
                 engine_options: dict[str, Any] | None) -> None:
    """Refuse, before anything is loaded, a method entry that ``engine`` cannot run (one :class:`EngineError`)."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; use {' or '.join(ENGINES)}")
    if engine == "vllm":
        from harness.backends.vllm import check_python, llm_options, speculative_config

        speculative_config(method, options, given, target, engine_options)
        llm_options(engine_options)
        check_python()


def create_backend(engine: str, method: str, options: Any, given: set[str], target: str, target_path: str,
                   dtype: str, engine_options: dict[str, Any] | None) -> Backend | None:
    """The backend of a method entry (None for ``engine: harness``); it is loaded and ready for turns."""
    check_engine(engine, method, options, given, target, engine_options)
    if engine == "harness":
        return None
    from harness.backends.vllm import VLLMBackend, llm_options, speculative_config

    backend = VLLMBackend(target_path, dtype, speculative_config(method, options, given, target, engine_options),
                          llm_options(engine_options))
    backend.engine_options = dict(engine_options or {})
    return backend
