"""vLLM in-process, through its offline ``LLM`` API, in its own virtualenv (``make vllm-setup``).

vLLM pins its own torch and transformers, so it runs in a worker process started with the python of that venv
(``$DRAFTBENCH_VLLM_PYTHON``, default ``.venv-vllm/bin/python`` of the repository):
:mod:`harness.backends.vllm_worker` loads the target once and then generates one prompt per turn, timed inside the
worker around ``LLM.generate``; the acceptance counters are vLLM's own (see the worker's docstring).

draftbench's methods map to vLLM's ``speculative_config`` (:func:`speculative_config`): vanilla runs without one;
pld is vLLM's ``ngram`` (prompt lookup, Saxena 2023); eagle1/eagle2 are ``eagle`` (arXiv 2401.15077, 2406.16858),
eagle3 is ``eagle3`` (arXiv 2503.01840), medusa is ``medusa`` (arXiv 2401.10774) and sps is ``draft_model``
(arXiv 2302.01318), with the method's head folder (the head shipped for the target unless option ``head`` names
one) or draft model. vLLM drafts a chain of ``num_speculative_tokens`` tokens: the harness's tree-shape options have
no equivalent there and are refused when given; ``engine_options`` passes anything else to vLLM:
``speculative_config`` (merged over the mapped one, e.g. ``{method: suffix}`` or ``{num_speculative_tokens: 3}``)
and every other key to ``LLM(...)`` (``tensor_parallel_size``, ``max_model_len``, ``enforce_eager``, ...).

On CPU vLLM reserves its KV cache up front (``VLLM_CPU_KVCACHE_SPACE`` GiB); the worker gets 1 GiB unless the
environment says otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

from harness.backends.contract import Backend, BackendError, EngineError, EngineTurn, TurnRequest
from harness.backends.worker import Worker
from harness.models import resolve_target_path
from harness.registry import BUILTIN_PLUGINS

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
PYTHON_ENV = "DRAFTBENCH_VLLM_PYTHON"
LOAD_TIMEOUT_S = 900.0  # loading takes about a minute on 2 CPU cores; a first CPU compile can take longer
TURN_TIMEOUT_S = 900.0

# method -> (vLLM's speculative method, head kind in methods/heads/<target>/, option -> speculative_config key)
METHODS: dict[str, tuple[str | None, str | None, dict[str, str]]] = {
    "vanilla": (None, None, {}),
    "pld": ("ngram", None, {"num_draft_tokens": "num_speculative_tokens", "min_ngram": "prompt_lookup_min",
                            "max_ngram": "prompt_lookup_max"}),
    "eagle1": ("eagle", "eagle", {"head": "model"}),
    "eagle2": ("eagle", "eagle", {"head": "model", "depth": "num_speculative_tokens"}),
    "eagle3": ("eagle3", "eagle3", {"head": "model", "depth": "num_speculative_tokens"}),
    "medusa": ("medusa", "medusa", {"head": "model"}),
    "sps": ("draft_model", None, {"draft": "model", "k": "num_speculative_tokens"}),
}


def python() -> str:
    """The python of vLLM's venv: ``$DRAFTBENCH_VLLM_PYTHON`` or ``.venv-vllm/bin/python`` of the repository."""
    return os.environ.get(PYTHON_ENV) or str(REPO / ".venv-vllm" / "bin" / "python")


def check_python() -> str:
    """:func:`python`, or an :class:`EngineError` saying how to make vLLM's venv when it is not there."""
    exe = python()
    if not Path(exe).is_file():
        raise EngineError(f"engine vllm: no python at {exe}; create vLLM's venv with `make vllm-setup` or point "
                          f"{PYTHON_ENV} at one")
    return exe


def shipped_head(target: str, kind: str) -> Path:
    """The head shipped for ``target`` in the built-in methods package (``<methods>/heads/<target>/<kind>``), found
    without importing the plugin."""
    spec = importlib.util.find_spec(BUILTIN_PLUGINS[0])
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) / "heads" / target / kind
    if not folder.is_dir():
        raise EngineError(f"no {kind} head is shipped for target {target!r} (looked in {folder}); pass the method "
                          "option head=<folder>")
    return folder


def speculative_config(method: str, options: Any, given: set[str], target: str,
                       engine_options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` with ``options`` (its options dataclass, defaults filled in;
    ``given``: the option names the configuration set), or None for no speculation.

    Examples: ("vanilla", ...) -> None; ("pld", PldOptions(), ...) -> {"method": "ngram",
    "num_speculative_tokens": 10, "prompt_lookup_min": 1, "prompt_lookup_max": 3}; ("eagle3", Eagle3Options(depth=3),
    {"depth"}, "smollm2-135m") -> {"method": "eagle3", "model": ".../heads/smollm2-135m/eagle3",
    "num_speculative_tokens": 3}. A method vLLM cannot run, or a given option it has no equivalent for, is an
    :class:`EngineError` naming what vLLM supports.
    """
    if method not in METHODS:
        raise EngineError(f"engine vllm cannot run method {method!r}; it runs {', '.join(METHODS)} (or any vLLM "
                          "method through engine_options: {speculative_config: {method: ...}})")
    kind, head_kind, mapped = METHODS[method]
    unmapped = sorted(given - set(mapped))
    if unmapped:
        raise EngineError(f"engine vllm, method {method!r}: option(s) {', '.join(unmapped)} have no vLLM equivalent "
                          f"(vLLM drafts a chain); it maps {', '.join(mapped) or 'no options'}; pass vLLM's own "
                          "settings through engine_options")
    values = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    extra = dict((engine_options or {}).get("speculative_config") or {})
    if kind is None and not extra:
        return None
    config: dict[str, Any] = {} if kind is None else {"method": kind}
    for option, key in mapped.items():
        if values.get(option) is not None:
            config[key] = values[option]
    if head_kind is not None and "model" not in config:
        config["model"] = str(shipped_head(target, head_kind))
    if method == "sps":
        config["model"] = resolve_target_path(config["model"]) if "model" in config else None
        if config["model"] is None:
            raise EngineError("engine vllm, method 'sps': option draft (the draft model) is required")
    elif "model" in config:
        config["model"] = str(Path(config["model"]).expanduser())
    config.update(extra)
    if "num_speculative_tokens" not in config and config.get("method") in ("eagle", "medusa"):
        raise EngineError(f"engine vllm, method {method!r}: vLLM needs the chain length; set engine_options: "
                          "{speculative_config: {num_speculative_tokens: K}}")
    return config


def llm_options(engine_options: dict[str, Any] | None) -> dict[str, Any]:
    """The ``LLM(...)`` arguments of ``engine_options`` (every key but ``speculative_config``)."""
    return {k: v for k, v in (engine_options or {}).items() if k != "speculative_config"}


class VLLMBackend(Backend):
    """One method entry on vLLM: a worker process with the target (``target_path``, a Hugging Face folder) loaded
    once in ``dtype``; ``speculative``: the vLLM ``speculative_config`` (None: no speculation)."""

    name = "vllm"

    def __init__(self, target_path: str, dtype: str, speculative: dict[str, Any] | None,
                 llm: dict[str, Any] | None = None):
        self.speculative = speculative is not None
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        # -I: neither PYTHONPATH (the harness) nor the worker's folder (this vllm.py) on the worker's import path
        self.worker = Worker([check_python(), "-I", str(WORKER)], env, what="the vLLM worker")
        try:
            info = self.worker.request({"op": "load", "model": target_path, "dtype": dtype,
                                        "speculative_config": speculative, "llm": llm or {}}, LOAD_TIMEOUT_S)
        except BaseException:
            self.worker.close()
            raise
        self.version = info.get("version")
        self.config = info.get("config") or {}
        self.load_s = info.get("load_s")

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "version": self.version, "config": self.config, "load_s": self.load_s}

    def generate(self, request: TurnRequest) -> EngineTurn:
        r = self.worker.request({"op": "generate", "prompt_ids": request.prompt_ids,
                                 "max_tokens": request.max_new_tokens, "temperature": request.temperature,
                                 "top_p": request.top_p, "top_k": request.top_k, "seed": request.seed},
                                TURN_TIMEOUT_S)
        if not isinstance(r.get("token_ids"), list) or not isinstance(r.get("wall_time_s"), (int, float)):
            raise BackendError(f"the vLLM worker's reply to generate has no token_ids or wall_time_s: {r!r:.120}")
        counters = r.get("counters") or {}
        steps = r.get("steps") or {}
        return EngineTurn(token_ids=list(r["token_ids"]), wall_time_s=float(r["wall_time_s"]), ttft_s=r.get("ttft_s"),
                          stop_reason=r.get("finish_reason"), drafts=counters.get("drafts"),
                          draft_tokens=counters.get("draft_tokens"), accepted_tokens=counters.get("accepted_tokens"),
                          accepted_per_pos=counters.get("accepted_per_pos"), accepted_steps=steps.get("accepted"),
                          drafted_steps=steps.get("drafted"))

    def close(self) -> None:
        self.worker.close()
