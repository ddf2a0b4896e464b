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

Heads vLLM would load but run as another network are refused or adapted (:func:`check_head`,
:func:`medusa_for_vllm`): vLLM's EAGLE-1 Llama draft has no ``fc`` bias (it drops ``fc.bias`` without a word) and
reads a config's ``bias`` as attention biases, while EAGLE's ``bias`` (default true) is the ``fc`` bias; vLLM's
Medusa reads its ResBlock biases only under ``medusa_fc_bias: true`` and holds its own lm_head, never the target's.

On CPU vLLM reserves its KV cache up front (``VLLM_CPU_KVCACHE_SPACE`` GiB); the worker gets 1 GiB unless the
environment says otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harness.backends.contract import Backend, BackendError, EngineError, EngineTurn, TurnRequest
from harness.backends.vllm_worker import CPU_DEFAULTS
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
# (method, option) -> the one value vLLM's method has built in: given with that value the option maps to no key, given
# with another it is refused. vLLM's ngram copies after the n-gram's earliest occurrence (pld's default is the most
# recent one; docs/engines.md, "The referee").
BUILT_IN: dict[tuple[str, str], Any] = {("pld", "occurrence"): "earliest"}


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
    "num_speculative_tokens": 10, "prompt_lookup_min": 1, "prompt_lookup_max": 3} (also with occurrence="earliest",
    vLLM's built-in rule; "recent" is refused); ("eagle3", Eagle3Options(depth=3),
    {"depth"}, "smollm2-135m") -> {"method": "eagle3", "model": ".../heads/smollm2-135m/eagle3",
    "num_speculative_tokens": 3}. A method vLLM cannot run, or a given option it has no equivalent for, is an
    :class:`EngineError` naming what vLLM supports.
    """
    if method not in METHODS:
        raise EngineError(f"engine vllm cannot run method {method!r}; it runs {', '.join(METHODS)} (or any vLLM "
                          "method through engine_options: {speculative_config: {method: ...}})")
    kind, head_kind, mapped = METHODS[method]
    values = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    built_in = {option for (name, option) in BUILT_IN if name == method and option in given}
    for option in sorted(built_in):
        if values.get(option) != BUILT_IN[method, option]:
            raise EngineError(f"engine vllm, method {method!r}: {option}={values.get(option)} has no vLLM equivalent; "
                              f"vLLM's {kind} has {option}={BUILT_IN[method, option]} built in")
    unmapped = sorted(given - set(mapped) - built_in)
    if unmapped:
        raise EngineError(f"engine vllm, method {method!r}: option(s) {', '.join(unmapped)} have no vLLM equivalent "
                          f"(vLLM drafts a chain); it maps {', '.join(mapped) or 'no options'}; pass vLLM's own "
                          "settings through engine_options")
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
    if "model" in config and config.get("method") in ("eagle", "medusa"):
        head = check_head(config["method"], config["model"])
        if head.get("medusa_num_heads") and "num_speculative_tokens" not in config:
            config["num_speculative_tokens"] = head["medusa_num_heads"]  # one token per Medusa head
    if "num_speculative_tokens" not in config and config.get("method") in ("eagle", "medusa"):
        raise EngineError(f"engine vllm, method {method!r}: vLLM needs the chain length; set engine_options: "
                          "{speculative_config: {num_speculative_tokens: K}}")
    return config


def check_head(kind: str, model: str) -> dict[str, Any]:
    """The ``config.json`` of a local head folder for vLLM's ``kind`` (``eagle``, ``medusa``; {} for a Hub id or a
    folder without one), or an :class:`EngineError` when vLLM would load the head but run another network.

    An EAGLE-1/2 head with an ``fc`` bias (EAGLE's config ``bias``, true when absent: EAGLE-1, arXiv 2401.15077
    Sec. 3.1; the released loader reads it so) is refused: vLLM's EAGLE Llama draft has an ``fc`` without bias and
    drops ``fc.bias`` silently, and it reads ``bias`` as q/k/v/o biases the head does not have, which stay
    uninitialised; it drafts garbage and accepts nothing. Heads with ``bias: false`` run as trained.
    """
    path = Path(model) / "config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EngineError(f"engine vllm: {path} is not valid JSON ({e})") from None
    if kind == "eagle" and raw.get("bias", True) is not False:
        raise EngineError(f"engine vllm cannot run the EAGLE head {model}: it has an fc bias (config.json bias: "
                          f"{str(raw.get('bias', True)).lower()}), and vLLM's EAGLE-1 draft has no fc bias and reads "
                          "`bias` as attention biases (it would draft from uninitialised weights); use a head "
                          "trained with bias: false (draftbench train eagle --option bias=false)")
    return raw


def target_lm_head(target_path: str) -> Any:
    """The target's output embedding from its safetensors files: ``lm_head.weight``, or the input embedding
    (``model.embed_tokens.weight``) for a target that ties them. [V, H]."""
    from safetensors import safe_open

    tied = json.loads((Path(target_path) / "config.json").read_text()).get("tie_word_embeddings", False)
    names = ("lm_head.weight", "model.embed_tokens.weight") if tied else ("lm_head.weight",)
    for name in names:
        for file in sorted(Path(target_path).glob("*.safetensors")):
            with safe_open(str(file), "pt") as f:
                if name in f.keys():  # noqa: SIM118 (safe_open has keys(), no __contains__)
                    return f.get_tensor(name)
    raise BackendError(f"the target {target_path} has no {' or '.join(names)} in its safetensors files")


def medusa_for_vllm(head: str, target_path: str, out: Path) -> str:
    """``head`` (a Medusa folder, FasterDecoding's format: arXiv 2401.10774 Sec. 2.1.1) as vLLM's Medusa model
    loads it: the folder itself when its config says ``medusa_fc_bias: true`` and it has its own lm_heads, else a
    copy written to ``out`` with ``medusa_fc_bias: true`` (every ResBlock of the format has a bias) and, for heads
    that end in the target's lm_head (``medusa_share_lm_head``), that lm_head as the shared ``original_lm_head``
    (vLLM's Medusa never reads the target's). The head's weights are copied unchanged."""
    from safetensors.torch import save_file

    from harness.engine.checkpoints import read_weights

    raw = check_head("medusa", head)
    share = bool(raw.get("medusa_share_lm_head", False))
    if not raw or (raw.get("medusa_fc_bias") is True and not share):
        return head
    weights, _ = read_weights(Path(head), ("medusa_lm_head.safetensors", "medusa_lm_head.pt"), "Medusa heads")
    weights = {k: v.contiguous() for k, v in weights.items()}
    config = {**raw, "medusa_fc_bias": True}
    if share:
        weights[f"0.{raw.get('medusa_num_layers', 1)}.weight"] = target_lm_head(target_path).contiguous()
        config["original_lm_head"] = True
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(out / "medusa_lm_head.safetensors"))
    return str(out)


# vLLM's parallelism options (its ParallelConfig), checked before anything loads; vLLM checks the rest itself
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "nnodes")
EXECUTORS = ("mp", "ray", "uni", "external_launcher")  # distributed_executor_backend


def drafter_room(speculative: dict[str, Any] | None) -> int:
    """The positions past a turn's last token that vLLM needs for its drafter to run until the turn ends:
    2k - 2 for k speculative tokens (0 without speculation). vLLM 0.32 runs the drafter only while the longest
    sequence + k fits its ``max_model_len`` (``GPUModelRunner._input_fits_in_drafter``,
    ``vllm/v1/worker/gpu_model_runner.py``); otherwise it verifies draft slots filled with token id 0 (and counts
    them as drafted), so without this room a turn that ends near ``max_model_len`` loses its last drafting steps.
    A ``max_model_len`` of P + N + 2k - 2 lets it draft to the end of an N-token answer to a P-token prompt
    (measured: a 4,096-token prompt, 64 new tokens, k = 3: with 4,160 vLLM's drafter stopped three steps before the
    turn's end, with 4,164 it drafted the harness's tokens at every step).
    Examples: {"method": "eagle3", "num_speculative_tokens": 3} -> 4; None -> 0; k = 1 -> 0."""
    k = int((speculative or {}).get("num_speculative_tokens") or 0)
    return max(2 * k - 2, 0)


def llm_options(engine_options: dict[str, Any] | None, positions: int | None = None,
                speculative: dict[str, Any] | None = None, window: int | None = None) -> dict[str, Any]:
    """The ``LLM(...)`` arguments of ``engine_options`` (every key but ``speculative_config``), among them vLLM's
    parallelism: ``tensor_parallel_size``, ``pipeline_parallel_size`` (GPUs, or nodes with the Ray executor),
    ``distributed_executor_backend`` (``mp`` on one machine, ``ray`` across a Ray cluster), ``nnodes`` /
    ``node_rank`` / ``master_addr``. A malformed parallelism option is an :class:`EngineError`.

    ``positions``: what a run of long prompts needs (:func:`harness.run.entries.engine_positions`); beyond the
    worker's default ``max_model_len`` (2048, :data:`~harness.backends.vllm_worker.CPU_DEFAULTS`), under which vLLM
    refuses a 2048-token prompt and stops a shorter one's answer at 2048 positions, it becomes ``max_model_len``
    unless the engine options set one, with room for the drafter of ``speculative`` (:func:`drafter_room`), within
    the target's ``window`` (its ``max_position_embeddings``: vLLM refuses a longer ``max_model_len``).

    Examples: {"speculative_config": {...}, "tensor_parallel_size": 2} -> {"tensor_parallel_size": 2};
    ({}, positions=2112) -> {"max_model_len": 2112}; ({}, positions=576) -> {};
    ({}, positions=4160, speculative with k = 3, window=8192) -> {"max_model_len": 4164}; the same with
    window=4162 -> {"max_model_len": 4162} (the window caps it).
    """
    out = {k: v for k, v in (engine_options or {}).items() if k != "speculative_config"}
    if positions is not None and "max_model_len" not in out:
        needed = positions + drafter_room(speculative)
        needed = min(needed, window) if window else needed
        if needed > CPU_DEFAULTS["max_model_len"]:
            out["max_model_len"] = needed
    for key in PARALLEL_SIZES:
        value = out.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise EngineError(f"engine vllm: engine_options.{key} must be an integer >= 1, got {value!r}")
    executor = out.get("distributed_executor_backend", "mp")
    if executor not in EXECUTORS:
        raise EngineError(f"engine vllm: engine_options.distributed_executor_backend must be one of "
                          f"{', '.join(EXECUTORS)}, got {executor!r}")
    return out


class VLLMBackend(Backend):
    """One method entry on vLLM: a worker process with the target (``target_path``, a Hugging Face folder) loaded
    once in ``dtype``; ``speculative``: the vLLM ``speculative_config`` (None: no speculation)."""

    name = "vllm"

    def __init__(self, target_path: str, dtype: str, speculative: dict[str, Any] | None,
                 llm: dict[str, Any] | None = None):
        self.speculative = speculative is not None
        self.worker: Worker | None = None
        self.prepared: Path | None = None  # a head folder written for vLLM (medusa_for_vllm), removed at close
        self.head_source: str | None = None
        try:
            if speculative and speculative.get("method") == "medusa" and "model" in speculative:
                self.prepared = Path(tempfile.mkdtemp(prefix="draftbench-vllm-medusa-"))
                model = medusa_for_vllm(speculative["model"], target_path, self.prepared)
                if model != speculative["model"]:
                    self.head_source = speculative["model"]
                speculative = {**speculative, "model": model}
            env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
            # -I: neither PYTHONPATH (the harness) nor the worker's folder (this vllm.py) on the worker's import path
            self.worker = Worker([check_python(), "-I", str(WORKER)], env, what="the vLLM worker")
            info = self.worker.request({"op": "load", "model": target_path, "dtype": dtype,
                                        "speculative_config": speculative, "llm": llm or {}}, LOAD_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.version = info.get("version")
        self.config = info.get("config") or {}
        self.parallel = info.get("parallel")
        self.load_s = info.get("load_s")

    def describe(self) -> dict[str, Any]:
        """Name, version, the ``LLM(...)`` arguments the worker used (``config``: the engine options, parallelism
        among them, and ``speculative_config``), the parallel layout vLLM resolved from them (``parallel``), load
        time, and where a head written for vLLM came from (``head_source``)."""
        out = {"engine": self.name, "version": self.version, "config": self.config, "parallel": self.parallel,
               "load_s": self.load_s}
        if self.head_source is not None:
            out["head_source"] = self.head_source
        return out

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
                          drafted_steps=steps.get("drafted"), forwards=r.get("forwards"))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.prepared is not None:
            shutil.rmtree(self.prepared, ignore_errors=True)
