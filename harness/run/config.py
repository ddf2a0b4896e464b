"""Run configuration: typed dataclasses, loaded from YAML presets and overridden from the command line.

A preset is a short YAML file; ``include: other.yaml`` (or a list) composes presets, later keys win. Every value is
validated and a bad one raises :class:`ConfigError` naming the field, e.g. ``run.temperatures[1]: must be >= 0``.
A ``sweep:`` key expands method entries into grids (:mod:`harness.run.sweep`). Built-in presets live in
``harness/run/presets/`` and are named without the extension (``--preset demo``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.backends.exchange import masked
from harness.measure.records import PRECISIONS, precision_label, runtime_label
from harness.run.shipped import resolve_shipped, shipped_names
from harness.schema import InputError, check, field_types, unknown_keys
from harness.yamlsafe import safe_load

PRESET_DIR = Path(__file__).resolve().parent / "presets"


MAX_LABEL = 200  # characters of an entry's label
INT64 = (-(2**63), 2**63 - 1)  # what the records' and tables' integer columns hold (parquet, numpy)
COMPILE_WEIGHTS = ("frozen", "inputs")  # RunConfig.compile_weights
INT_FIELDS = ("limit", "max_new_tokens", "top_k", "seeds", "repeats", "warmup", "threads", "context_buckets")


class ConfigError(InputError):
    """A configuration value that is missing, unknown or out of range; the message names the field."""


@dataclass
class MethodSpec:
    """One method in a run. ``label`` tells apart two entries of the same method (an ablation); default = name.
    ``runtime``: how the target's forward runs for this entry (``eager`` or ``compiled``); None = every runtime of
    the run (:meth:`RunConfig.entries`). ``engine``: what runs the entry's turns (``harness``, or a backend of
    :mod:`harness.backends` such as ``vllm``) and ``engine_options`` what it passes to that engine; None = the
    run's. ``referee``: for an entry on another engine, the label of the harness entry its acceptance is held
    against (:mod:`harness.report.referee`; needed only when the automatic pairing is ambiguous). ``precision``:
    the target's precision for this entry (a name of :data:`harness.measure.records.PRECISIONS`); None = every
    precision of the run's ``precisions``."""

    name: str
    label: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    runtime: str | None = None
    engine: str | None = None
    engine_options: dict[str, Any] | None = None
    referee: str | None = None
    precision: str | None = None

    def __post_init__(self):
        if self.label is None:
            self.label = self.name


@dataclass
class RunConfig:
    target: str = "smollm2-135m"          # embedded alias, Hugging Face id or local folder
    dtype: str = "auto"                   # auto = float32 on CPU, bfloat16 on GPU
    device: str = "auto"                  # auto, cpu, cuda, cuda:1
    device_map: str | None = None         # e.g. "auto": spread a large target over GPUs with accelerate
    attn_implementation: str = "auto"     # auto (sdpa_gqa where transformers picks sdpa), sdpa_gqa, eager, sdpa, ...
    profile: str = "auto"                 # synchronise the draft/verify/overhead split: auto (= on for CPU), on, off
    runtime: list[str] = field(default_factory=lambda: ["eager"])  # eager, compiled, or both (every entry runs once
    #                                       per runtime; non-eager labels get "@<runtime>", see RunConfig.entries)
    compile_weights: str = "frozen"       # compiled runtime on CPU: frozen (weights packed into the graphs: fastest
    #                                       forward, traced and lowered again every run) or inputs (graphs loaded
    #                                       whole by the next run; harness/engine/runtime.py, docs/results.md)
    methods: list[MethodSpec] = field(default_factory=lambda: [MethodSpec("vanilla")])
    suites: list[str] = field(default_factory=lambda: ["mt_bench"])
    limit: int | None = None              # first N questions of each suite
    stratify: bool = False                # true: ``limit`` counts per category (after a suite's category_groups:
    #                                       Spec-Bench's six tasks), so a short run covers every task
    questions: list[str] | None = None    # or these question ids
    max_new_tokens: int = 512             # unless a suite sets its own
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    top_p: float = 1.0
    top_k: int = 0
    seeds: list[int] = field(default_factory=lambda: [0])
    repeats: int = 1                      # timed repetitions of every question
    warmup: int = 1                       # untimed warm-up questions per method, through the same code path
    interleave: bool = False              # true: question-major order (each question under every entry in turn), so
    #                                       a shared machine's slow spells fall on all entries alike; false:
    #                                       entry-major (each entry answers every question before the next starts);
    #                                       load runs: level by level, alternating the entries (harness.run.load)
    baseline: str = "vanilla"             # label that speedups are measured against
    chat_template: str | None = None      # harness/run/templates/<name>.jinja or a .jinja file (None: the tokenizer's)
    system_prompt: str | None = None      # replaces every suite's system prompt (None: each suite's own)
    score: bool = True                    # run quality scorers where a suite has one
    threads: int | None = None            # torch CPU threads (None = torch's default)
    data_dir: str | None = None           # default: $DRAFTBENCH_DATA
    output_dir: str = "results"
    sweep_spec: list[dict] | None = None  # the `sweep:` grids `methods` came from (a record; never re-expanded)
    engine: str = "harness"               # what runs the turns: harness (draftbench's own engine), vllm or openai
    #                                       (harness.backends); a method entry may set its own
    engine_options: dict[str, Any] = field(default_factory=dict)  # passed to the engine (harness.backends)
    context_buckets: list[int] | None = None  # input lengths (tokens) every context suite is built at instead of
    #                                       its own (harness.run.context), e.g. [512, 2048, 4096]
    ablate: list[str] | None = None       # method options that get ablation tables and plots besides the swept ones
    #                                       (harness.report.ablation.ablated_options); the report only, not measured
    precisions: list[str] | None = None   # target precisions every entry runs under (float32, bfloat16, float16,
    #                                       int8: harness.models.with_precision), each entry once per precision, the
    #                                       labels of all but float32 ending in "@<bf16|fp16|int8>"; None: the
    #                                       target in `dtype` alone
    load: dict[str, Any] | None = None    # load levels instead of one question at a time (harness.run.load):
    #                                       {concurrency: [1, 4, 16, 64], request_rate, burstiness, num_prompts}

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        def need(cond, where, msg):
            if not cond:
                raise ConfigError(f"run.{where}: {msg}")

        need(bool(self.methods), "methods", "at least one method is required")
        for i, m in enumerate(self.methods):
            need(isinstance(m.label, str) and m.label.strip() != "", f"methods[{i}].label",
                 f"must be a non-empty string (every record names its entry by it), got {m.label!r}")
            need(len(m.label) <= MAX_LABEL, f"methods[{i}].label",
                 f"at most {MAX_LABEL} characters (it names table rows and plot bars), got {len(m.label):,}")
            need(m.label.isprintable(), f"methods[{i}].label",
                 f"must not hold control characters (a table row holds one line), got {m.label!r}")
        options = [(f"methods[{i}].{name}", value) for i, m in enumerate(self.methods)
                   for name, value in (("options", m.options), ("engine_options", m.engine_options))]
        for where, value in [*options, ("engine_options", self.engine_options)]:
            big = _huge_int(value, where)
            if big is not None:
                raise ConfigError(f"run.{big[0]}: must fit a 64-bit integer, got {big[1]}")
        for name in INT_FIELDS:
            values = getattr(self, name)
            for j, v in enumerate(values if isinstance(values, list) else [values]):
                where = f"{name}[{j}]" if isinstance(values, list) else name
                need(v is None or isinstance(v, bool) or not isinstance(v, int) or INT64[0] <= v <= INT64[1], where,
                     f"must fit a 64-bit integer ({INT64[0]} .. {INT64[1]}), got {v}")
        from harness.engine.runtime import RUNTIMES

        need(bool(self.runtime), "runtime", f"at least one runtime is required ({', '.join(RUNTIMES)})")
        for i, r in enumerate(self.runtime):
            need(r in RUNTIMES, f"runtime[{i}]", f"unknown runtime {r!r}; use {' or '.join(RUNTIMES)}")
        need(len(set(self.runtime)) == len(self.runtime), "runtime", f"a runtime is listed twice: {self.runtime}")
        need(self.compile_weights in COMPILE_WEIGHTS, "compile_weights",
             f"unknown choice {self.compile_weights!r}; use {' or '.join(COMPILE_WEIGHTS)}")
        for i, m in enumerate(self.methods):
            need(m.runtime is None or m.runtime in RUNTIMES, f"methods[{i}].runtime",
                 f"unknown runtime {m.runtime!r}; use {' or '.join(RUNTIMES)}")
        from harness.backends.contract import ENGINES

        need(self.engine in ENGINES, "engine", f"unknown engine {self.engine!r}; use {' or '.join(ENGINES)}")
        for i, m in enumerate(self.methods):
            need(m.engine is None or m.engine in ENGINES, f"methods[{i}].engine",
                 f"unknown engine {m.engine!r}; use {' or '.join(ENGINES)}")
            need(m.engine_options is None or isinstance(m.engine_options, dict), f"methods[{i}].engine_options",
                 f"expected a mapping, got {m.engine_options!r}")
        for m in self.entries():
            need(m.engine == "harness" or m.runtime == "eager", "runtime",
                 f"entry {m.label!r} runs on engine {m.engine}; runtime {m.runtime} is the harness engine's "
                 "(give the entry its own engine: harness, or leave runtime at eager)")
        self.check_precisions()
        labels = [m.label for m in self.entries()]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        need(not dup, "methods", f"duplicate labels {dup}; give each entry a distinct `label`")
        harness = [m.label for m in self.entries() if m.engine == "harness"]
        for m in self.entries():
            need(m.referee is None or (m.engine != "harness" and m.referee in harness), "referee",
                 f"entry {m.label!r}: referee {m.referee!r} must be the label of an entry the harness runs "
                 f"({', '.join(harness) or 'none'}), on an entry another engine runs")
        need(bool(self.suites), "suites", "at least one suite is required")
        from harness.run.suites import duplicate_suite_names

        clash = duplicate_suite_names([str(x) for x in self.suites])
        need(clash is None, "suites", str(clash))
        if self.context_buckets is not None:
            from harness.run.context import ContextError, check_bucket_list

            try:
                check_bucket_list(self.context_buckets, "run.context_buckets")
            except ContextError as e:
                raise ConfigError(str(e)) from None
        need(self.limit is None or self.limit > 0, "limit", f"must be a positive integer, got {self.limit}")
        need(not self.stratify or self.limit is not None, "stratify",
             "counts `limit` per category; set a limit too (without one every question runs)")
        need(self.max_new_tokens > 0, "max_new_tokens", f"must be > 0, got {self.max_new_tokens}")
        from harness.engine.sampling import TEMPERATURE_RULE, check_temperature

        for i, t in enumerate(self.temperatures):
            need(check_temperature(t), f"temperatures[{i}]", f"{TEMPERATURE_RULE}, got {t!r}")
        need(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")  # also refuses NaN
        need(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
        need(self.repeats >= 1, "repeats", f"must be >= 1, got {self.repeats}")
        need(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}")
        need(isinstance(self.interleave, bool), "interleave", f"must be true or false, got {self.interleave!r}")
        cores = os.cpu_count() or 1
        need(self.threads is None or 1 <= self.threads <= cores, "threads",
             f"must be between 1 and this machine's {cores} CPU cores, got {self.threads}")
        from harness.models import check_device

        try:
            check_device(self.device)
        except ValueError as e:
            raise ConfigError(f"run.device: {e}") from None
        if self.chat_template is not None:
            from harness.run.chat import ChatTemplateError, resolve_chat_template

            try:
                resolve_chat_template(self.chat_template)
            except ChatTemplateError as e:
                raise ConfigError(str(e)) from None
        need(self.dtype in ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"), "dtype",
             f"unknown dtype {self.dtype!r}")
        if self.load is not None:
            self.load_spec()
        need(self.profile in ("auto", "on", "off"), "profile", f"must be auto, on or off, got {self.profile!r}")
        from harness.models import check_attn_implementation

        try:
            check_attn_implementation(self.attn_implementation)
        except ValueError as e:
            raise ConfigError(f"run.attn_implementation: {e}") from None

    def check_precisions(self) -> None:
        """``precisions`` and every entry's ``precision``: names of :data:`PRECISIONS`, none twice; with them the
        target is loaded in float32 and copied into each precision, so ``dtype`` stays auto (or float32); an entry
        on another engine runs once, on the target as that engine serves it, and takes no precision."""
        where = [("precisions", self.precisions or [])] + [
            (f"methods[{i}].precision", [m.precision]) for i, m in enumerate(self.methods) if m.precision is not None]
        for name, values in where:
            for j, p in enumerate(values):
                if p not in PRECISIONS:
                    at = f"{name}[{j}]" if name == "precisions" else name
                    raise ConfigError(f"run.{at}: unknown precision {p!r}; use {', '.join(PRECISIONS)}")
        if self.precisions is not None:
            if not self.precisions:
                raise ConfigError(f"run.precisions: at least one precision is required ({', '.join(PRECISIONS)}), "
                                  "or leave it out (the target in `dtype` alone)")
            if len(set(self.precisions)) != len(self.precisions):
                raise ConfigError(f"run.precisions: a precision is listed twice: {self.precisions}")
        if self.precisions is not None or any(m.precision is not None for m in self.methods):
            if self.dtype not in ("auto", "float32", "fp32"):
                raise ConfigError(f"run.dtype: with precisions the target loads in float32 and each entry's copy is "
                                  f"in its precision; leave dtype at auto, got {self.dtype!r}")
            other = [m.label for m in self.entries() if m.engine != "harness" and m.precision is not None]
            if other:
                raise ConfigError(f"run.methods: entries {other} run on another engine, which loads its own target "
                                  "(as it serves it); leave their precision out")

    def load_spec(self) -> LoadSpec | None:
        """The ``load:`` block checked (:func:`load_spec`) and against the rest of the run: every entry served
        (``engine: openai``), one temperature, one seed, one repeat (a level is one measurement); None without one."""
        if self.load is None:
            return None
        spec = load_spec(self.load)
        other = [f"{m.label} ({m.engine})" for m in self.entries() if m.engine != "openai"]
        if other:
            raise ConfigError(f"run.load: load levels run on engine openai (a served engine); {', '.join(other)} "
                              "cannot take concurrent requests")
        for name in ("temperatures", "seeds"):
            if len(getattr(self, name)) != 1:
                raise ConfigError(f"run.load: a load run has one of run.{name}, got {getattr(self, name)}")
        if self.repeats != 1:
            raise ConfigError(f"run.load: a load run has repeats 1 (each level is one measurement), got "
                              f"{self.repeats}")
        # a launched llama-server's slots are its --parallel; without it, what /props says once it runs (run_load)
        check_slots(max(spec.concurrency), {m.label: m.engine_options.get("parallel") for m in self.entries()
                                            if m.engine_options.get("launch") == "llama.cpp"})
        return spec

    def entries(self) -> list[MethodSpec]:
        """The method entries as the run measures them, each with its runtime: an entry without its own ``runtime``
        once per run runtime, in the order given (method by method, so that the runtimes of one method run side by
        side), and once per target precision of ``precisions`` (outermost; an entry's own ``precision``
        instead). The label of a non-eager entry ends in ``@<runtime>`` (:func:`harness.measure.records.runtime_label`):
        a table never shows a compiled number under an eager label; then that of a precision other than float32 in
        ``@<short name>`` (:func:`harness.measure.records.precision_label`). Example: methods [vanilla, eagle2],
        runtime [eager, compiled] -> vanilla, vanilla@compiled, eagle2, eagle2@compiled; precisions [float32, int8]
        (eager) -> vanilla, vanilla@int8, eagle2, eagle2@int8."""
        out = []
        for spec in self.methods:
            engine = spec.engine or self.engine
            engine_options = dict(self.engine_options if spec.engine_options is None else spec.engine_options)
            # another engine loads its own target (the GGUF as llama.cpp runs it): once, as it serves it
            precisions = (engine == "harness" and self.precisions) or [None]
            for precision in [spec.precision] if spec.precision else precisions:
                for runtime in [spec.runtime] if spec.runtime else self.runtime:
                    label = precision_label(runtime_label(spec.label, runtime), precision)
                    out.append(MethodSpec(spec.name, label, dict(spec.options), runtime, engine, engine_options,
                                          spec.referee, precision))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain data, a server URL's password masked (``server_url``: what the manifest keeps
        and the digest hashes; a resumed run takes the password from ``$DRAFTBENCH_SERVER_PASSWORD``,
        :func:`harness.backends.exchange.unmasked`). Fields at the defaults that runs made before they existed had
        (``runtime`` eager, an entry's ``runtime`` or ``precision`` None, no ``ablate``, no ``context_buckets``, no
        ``load``, no ``precisions``, ``stratify`` false, ``compile_weights`` frozen) are left out, so that the digest
        of an unchanged
        configuration stays the same and comparisons with older runs do not report a difference that is none."""
        d = dataclasses.asdict(self)
        if d.get("runtime") == ["eager"]:
            d.pop("runtime")
        if d.get("engine") == "harness":
            d.pop("engine")
        if d.get("compile_weights") == "frozen":
            d.pop("compile_weights")
        if not d.get("engine_options"):
            d.pop("engine_options", None)
        if d.get("ablate") is None:
            d.pop("ablate")
        if d.get("context_buckets") is None:
            d.pop("context_buckets")
        if d.get("load") is None:
            d.pop("load")
        if not d.get("stratify"):
            d.pop("stratify")
        if d.get("precisions") is None:
            d.pop("precisions")
        for m in d["methods"]:
            for key in ("runtime", "engine", "engine_options", "referee", "precision"):
                if m.get(key) is None:
                    m.pop(key, None)
        for options in [d.get("engine_options"), *(m.get("engine_options") for m in d["methods"])]:
            if isinstance(options, dict) and isinstance(options.get("server_url"), str):
                options["server_url"] = masked(options["server_url"])  # never a password in a manifest
        return d

    def digest(self) -> str:
        """Short hash of everything that changes the measurement (not where results are written)."""
        d = self.to_dict()
        d.pop("output_dir", None)
        d.pop("data_dir", None)
        d.pop("ablate", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def _huge_int(value: Any, where: str) -> tuple[str, int] | None:
    """(where, value) of the first integer in ``value`` (at any depth) outside :data:`INT64`, else None.
    Example: ({"depth": 2**70}, "methods[0].options") -> ("methods[0].options.depth", 2**70)."""
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, v in items:
        found = _huge_int(v, f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}")
        if found:
            return found
    return None


LOAD_KEYS = ("concurrency", "request_rate", "burstiness", "num_prompts")


@dataclass(frozen=True)
class LoadSpec:
    """A run's ``load:`` block (:mod:`harness.run.load`). ``request_rate``: requests per second (inf: all at
    once); ``num_prompts``: requests per level (None: 2 x the level's concurrency)."""

    concurrency: tuple[int, ...]
    request_rate: float = math.inf
    burstiness: float = 1.0
    num_prompts: int | None = None

    def requests_at(self, concurrency: int) -> int:
        return self.num_prompts or 2 * concurrency


def check_slots(highest: int, slots: dict[str, Any]) -> None:
    """A level is measured at its concurrency only where the server decodes that many requests at once: llama.cpp's
    server decodes as many as it has slots (``--parallel``) and queues the rest. ``slots``: entry label -> its
    server's slots (anything but a positive int: not known, not checked). A :class:`ConfigError` naming the entries
    with fewer slots than ``highest``, the run's highest concurrency.
    Example: (4, {"llamacpp-ngram": 2, "llamacpp-vanilla": None}) -> ConfigError("run.load: the highest concurrency
    is 4, more than the slots of llama.cpp's server of llamacpp-ngram (2): ...")."""
    short = {label: n for label, n in slots.items()
             if isinstance(n, int) and not isinstance(n, bool) and 0 < n < highest}
    if short:
        servers = ", ".join(f"{label} ({n})" for label, n in short.items())
        raise ConfigError(f"run.load: the highest concurrency is {highest}, more than the slots of llama.cpp's server "
                          f"of {servers}: requests past its slots wait in its queue, so the level would not run at "
                          f"its concurrency; give the entry engine_options parallel: {highest} (llama-server "
                          f"--parallel {highest}) or lower the concurrency")


def load_spec(raw: Any) -> LoadSpec:
    """The ``load:`` mapping as a :class:`LoadSpec`; a :class:`ConfigError` naming the field otherwise."""
    if not isinstance(raw, dict):
        raise ConfigError(f"run.load: expected a mapping with {', '.join(LOAD_KEYS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(LOAD_KEYS))
    if unknown:
        raise ConfigError(f"run.load: unknown key(s) {unknown}; load has {', '.join(LOAD_KEYS)}")
    levels = raw.get("concurrency")
    levels = [levels] if isinstance(levels, int) else levels
    if not isinstance(levels, list) or not levels or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in levels):
        raise ConfigError(f"run.load.concurrency: a list of positive integers is required, got {levels!r}")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"run.load.concurrency: a level is listed twice: {levels}")
    rate = raw.get("request_rate", math.inf)
    rate = math.inf if rate in ("inf", None) else rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ConfigError(f"run.load.request_rate: requests per second > 0, or inf, got {rate!r}")
    burst = raw.get("burstiness", 1.0)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not (0 < burst < math.inf):
        raise ConfigError(f"run.load.burstiness: a gamma shape > 0 (1.0: Poisson arrivals), got {burst!r}")
    n = raw.get("num_prompts")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"run.load.num_prompts: requests per level, a positive integer, got {n!r}")
    return LoadSpec(tuple(levels), float(rate), float(burst), n)


def _field_value(value: Any, annotation: Any, where: str) -> Any:
    """A YAML value for a :class:`RunConfig` field, checked against its annotation (:func:`harness.schema.check`)
    and converted as the field keeps it: a single value for a list field is a one-item list, numbers of a float
    field are floats and the items of a string list are strings (question ids may be written as numbers)."""
    element = _list_element(annotation)
    if element is not None and value is not None and not isinstance(value, list):
        value = [value]
    check(value, annotation, where, ConfigError, scalar_str=element is not None)
    if value is None:
        return None
    if element in (float, str):
        return [element(v) for v in value]
    return float(value) if annotation is float else value


def _list_element(annotation: Any) -> Any:
    """X for a ``list[X]`` (or ``list[X] | None``) annotation, else None."""
    for a in typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
            else (annotation,):
        if typing.get_origin(a) is list:
            return typing.get_args(a)[0]
    return None


def _method_spec(raw: Any, where: str) -> MethodSpec:
    if isinstance(raw, str):
        return MethodSpec(raw)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a method name or a mapping with name/label/options, got {raw!r}")
    unknown = set(raw) - {"name", "label", "options", "runtime", "engine", "engine_options", "referee", "precision"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; a method entry has name, label, options, "
                          "runtime, engine, engine_options, referee, precision")
    if "name" not in raw or not isinstance(raw["name"], str):
        raise ConfigError(f"{where}.name: a method name is required")
    opts = raw.get("options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}.options: expected a mapping, got {opts!r}")
    runtime = raw.get("runtime")
    if runtime is not None and not isinstance(runtime, str):
        raise ConfigError(f"{where}.runtime: expected eager or compiled, got {runtime!r}")
    engine = raw.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise ConfigError(f"{where}.engine: expected an engine name, got {engine!r}")
    referee = raw.get("referee")
    if referee is not None and not isinstance(referee, str):
        raise ConfigError(f"{where}.referee: expected the label of a harness entry, got {referee!r}")
    precision = raw.get("precision")
    check(precision, str | None, f"{where}.precision", ConfigError)
    return MethodSpec(raw["name"], raw.get("label"), dict(opts), runtime, engine, raw.get("engine_options"),
                      referee, precision)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    fields = field_types(RunConfig)
    unknown_keys(set(data) - {"sweep"}, fields, "run", "field", ConfigError)
    data = dict(data)
    sweep = data.pop("sweep", None)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name == "methods":
            if not isinstance(value, list):
                value = [value]
            kwargs[name] = [_method_spec(m, f"run.methods[{i}]") for i, m in enumerate(value)]
        else:
            if name == "profile" and isinstance(value, bool):  # YAML reads on/off as booleans
                value = "on" if value else "off"
            kwargs[name] = _field_value(value, fields[name], f"run.{name}")
    if sweep is not None:
        kwargs["methods"], kwargs["sweep_spec"] = _expand_sweep(
            kwargs.get("methods") or [MethodSpec("vanilla")], sweep, kwargs.get("engine") or RunConfig.engine,
            kwargs.get("engine_options") or {})
    return RunConfig(**kwargs)


def _expand_sweep(methods: list[MethodSpec], raw: Any, engine: str,
                  engine_options: dict[str, Any]) -> tuple[list[MethodSpec], list[dict]]:
    """``methods`` with the ``sweep:`` grids expanded (:mod:`harness.run.sweep`), and the normalised grids. Each new
    entry keeps its entry's runtime, engine and engine options (the run's ``engine`` / ``engine_options`` when it
    has none), with a swept ``engine_options.<path>`` set at that path."""
    from harness.registry import get_method
    from harness.run import sweep as S

    try:
        grids = S.normalize(raw)
        entries = S.expand([(m.name, m.label, m.options) for m in methods], grids, lambda n: get_method(n).Options)
    except S.SweepError as e:
        raise ConfigError(str(e)) from e
    bases = {m.label: m for m in methods}
    out = []
    for name, label, opts, base in entries:
        spec = bases.get(base) or MethodSpec(name)
        swept = {k.removeprefix(S.ENGINE_OPTIONS): v for k, v in opts.items() if k.startswith(S.ENGINE_OPTIONS)}
        entry_options = spec.engine_options
        if swept:
            if (spec.engine or engine) == "harness":
                raise ConfigError(f"run.sweep.{base}: sweeps engine_options, but entry {base!r} runs on the harness "
                                  "engine, which takes none; give it an engine (engine: vllm)")
            entry_options = copy.deepcopy(engine_options if spec.engine_options is None else spec.engine_options)
            for path, value in swept.items():
                _set_path(entry_options, path, value, f"run.sweep.{base}.{S.ENGINE_OPTIONS}{path}")
        out.append(MethodSpec(name, label, {k: v for k, v in opts.items() if not k.startswith(S.ENGINE_OPTIONS)},
                              spec.runtime, spec.engine, entry_options, precision=spec.precision))
    return out, grids


def _set_path(data: dict[str, Any], path: str, value: Any, where: str) -> None:
    """``data`` with ``value`` at the dotted ``path`` (mappings created on the way). Example: ({}, "a.b", 3) ->
    {"a": {"b": 3}}; a path through a value that is not a mapping is a :class:`ConfigError` naming ``where``."""
    *parents, leaf = path.split(".")
    for key in parents:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: {key} is {data!r}, not a mapping")
    data[leaf] = value


def resolve_preset(name_or_path: str) -> Path:
    """A built-in preset's name or the path of a preset YAML file; one clear error with close names otherwise."""
    return resolve_shipped(name_or_path, PRESET_DIR, (".yaml", ".yml"), "preset", ConfigError, "Built-in")


def preset_names() -> list[str]:
    return shipped_names(PRESET_DIR, ".yaml")


def load_preset_dict(name_or_path: str, _seen: tuple = ()) -> dict[str, Any]:
    """The merged mapping of a preset and its ``include``s (included first, this file's keys win)."""
    path = resolve_preset(name_or_path).resolve()
    if path in _seen:
        raise ConfigError(f"preset include cycle: {' -> '.join(map(str, (*_seen, path)))}")
    try:
        data = safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping of run fields")
    includes = data.pop("include", [])
    merged: dict[str, Any] = {}
    for inc in [includes] if isinstance(includes, str) else includes:
        inc_path = (path.parent / inc) if not Path(inc).is_absolute() else Path(inc)
        merged.update(load_preset_dict(str(inc_path) if inc_path.exists() else inc, (*_seen, path)))
    merged.update(data)
    return merged


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"key=value"`` with the value parsed as YAML (``limit=3`` -> 3, ``temperatures=[0,1]`` -> [0, 1])."""
    if "=" not in text:
        raise ConfigError(f"expected KEY=VALUE, got {text!r}")
    from harness.run.sweep import yaml_value

    key, raw = text.split("=", 1)
    return key.strip(), yaml_value(raw, text)
