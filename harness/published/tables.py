"""Published speculative-decoding tables as data: one YAML file per table, validated on load like a preset.

A table says what a paper or leaderboard reported, under which settings and in which tau convention, so that
``draftbench reproduce TABLE`` can run exactly that protocol and ``draftbench report RUN --against TABLE`` can put
the measured numbers next to the reported ones. The shipped tables are in ``results/published/`` (:data:`TABLE_DIR`);
any YAML file in the same format can be given by path.

Fields (every one is checked; an error names the file and the field, e.g.
``eagle2_paper.yaml: rows[1].options.depth: must be >= 1, got 0``)::

    id: eagle2_paper                 # = the file name without .yaml
    title: ...
    source:                          # where the numbers come from
      kind: paper | leaderboard | recomputed
      citation: "EAGLE-2: ..."       # paper title or leaderboard name
      arxiv: "2406.16858"            # or null
      table: "Table 1"               # or null
      url: https://...               # or null
      date: "2025-04-22"             # version / retrieval date, or null
      note: ...                      # or null
    hardware: "NVIDIA A100 80GB"     # as the source states it; "not stated" when it names no GPU (required)
    dtype: float16                   # the source's precision; the run's default dtype
    framework: "PyTorch 2.5.1, CUDA 12.1, Spec-Bench"
    protocol:
      suites: [mt_bench, gsm8k]      # registered suites, all referenced by columns
      max_new_tokens: 512
      temperature: 0.0
      warmup: 3
      repeats: 1
      tau_convention: eagle_script   # a name in harness.measure.acceptance.TAU_CONVENTIONS: what the `tau` cells mean
      notes: ...                     # known protocol differences, or null
      columns:                       # column id -> which questions it aggregates
        mt_bench: {label: MT-bench, suite: mt_bench}
        mt_conv: {label: MT-conv, suite: spec_bench, category: mt_bench}   # recorded category (after category_groups)
        mean: {label: Mean, mean_of: [mt_bench, gsm8k]}                  # equal-weight mean of other columns
        bs8: {label: "bs 8", suite: mt_bench, batch_size: 8}   # concurrent sequences (default 1; > 1 needs `engine`)
    engine:                          # optional: the serving engine the source measured in (absent: draftbench's loop)
      name: sglang                   # sglang | vllm | ... (as the source names it; reproduce launches vllm, sglang)
      version: "v0.4.4"              # as the source states it, or "not stated" (required)
      note: ...                      # or null
    targets:                         # key -> the target model
      vicuna_7b:
        id: lmsys/vicuna-7b-v1.3     # Hugging Face id (or a name for --model-dir)
        chat_template: vicuna_v1.1   # harness/run/templates/<name>.jinja, or null (the tokenizer's own)
        system_prompt: null          # or the text
        parameters_b: 6.74           # known size, for --dry-run when there is no local copy (or null)
        layers: 32                   # these three size the KV cache in --dry-run (or null)
        kv_heads: 32
        head_dim: 128
        max_position_embeddings: 2048
    heads:                           # id -> a draft head checkpoint
      yuhuili/EAGLE-Vicuna-7B-v1.3: {kind: eagle, hub: true, url: null, parameters_b: 0.24,
                                     weights: null}   # which published copy produced the reported numbers, or null
    rows:
      - id: eagle2                   # unique; the run label of the row
        label: EAGLE-2               # display name
        target: vicuna_7b
        method: eagle2               # a registered method, or null for a reported-only row
        head: yuhuili/EAGLE-Vicuna-7B-v1.3   # a key of heads, or null
        options: {total_tokens: 60, depth: 5, top_k: 10}   # checked against the method's options
        max_new_tokens: null         # overrides the protocol's for this row (or null)
        gpus: 1                      # GPUs the source ran this row on (default 1; e.g. 2 for a model split in two)
        runnable: true               # false: kept as reported-only, `reason` says why (engine tables: see below)
        reason: null
        note: null
        engine_options: {speculative_num_steps: 3}   # engine tables only: the engine settings the row stands for
                                     # (SGLang's flags; vLLM's speculative_config as a JSON string)
        cells:                       # column id -> reported numbers
          mt_bench: {speedup: 3.62, tau: 4.98}

A cell holds any of ``speedup`` (× vs the source's own vanilla decoding), ``tau`` (in ``protocol.tau_convention``),
``tau_<convention>`` (the same records in another named convention, e.g. ``tau_eagle_step``), ``tokens_per_s`` and
``baseline_tokens_per_s`` (the vanilla run of the same source), ``throughput_ratio`` (an engine table: throughput
with speculation over the same engine's without, at the column's batch size).

Engine tables (EAGLE-3, arXiv:2503.01840v3, Tables 3-5: SGLang and vLLM at batch sizes 1..64) name the engine and
give every column its ``batch_size``; a column with ``batch_size`` > 1 without ``engine`` is refused (draftbench's
own loop decodes one sequence at a time), and so is an engine table whose column leaves its batch size out. Their
rows run in that engine, not in draftbench's loop: ``reproduce`` launches it (:data:`LAUNCHED_ENGINES`, through the
served engine ``engine: openai``) and measures a load sweep at the columns' batch sizes
(:mod:`harness.published.reproduce`). So in an engine table ``runnable: true`` means "reproduce can launch this row":
the engine is one of :data:`LAUNCHED_ENGINES` and the row has what the engine needs (a row whose head the source
does not name stays ``runnable: false`` with its ``reason``), and, since a load level mixes the prompts of every
suite, each column is the whole of the table's one suite (no ``category``). A vLLM row's ``speculative_config`` is
vLLM's ``--speculative-config`` JSON object written as a string; it must parse as one.

Rounding: a cell holds the number as the source prints it. A ``recomputed`` table rounds each value to two decimals
half up on its decimal value (4.1255 -> 4.13), so a recomputed cell is within 0.005 of the exact value. The shipped
Jakiro cells (``jakiro_a40_t0``/``t1``) predate this rule: 19 of their 378 values differ by one unit in the last
digit at an x.xx5 boundary (e.g. t0 ``vicuna_13b_jakiro`` cnn_dm tau recomputes to 4.1255, shipped 4.12), so they
are good to 0.01. Their source output files are not in this repository, so no test recomputes them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.engine.method import OptionsError, build_options
from harness.measure.acceptance import TAU_CONVENTIONS
from harness.registry import METHODS, UnknownNameError
from harness.run.chat import ChatTemplateError, resolve_chat_template
from harness.run.shipped import resolve_shipped, shipped_names
from harness.run.suites import DataError, suite_info
from harness.schema import InputError, check, unknown_keys
from harness.yamlsafe import safe_load

TABLE_DIR = Path(__file__).resolve().parents[2] / "results" / "published"
SOURCE_KINDS = ("paper", "leaderboard", "recomputed")
CELL_METRICS = ("speedup", "tau", "tokens_per_s", "baseline_tokens_per_s", "throughput_ratio",
                *(f"tau_{c}" for c in TAU_CONVENTIONS))
TOP_FIELDS = ("id", "title", "source", "hardware", "dtype", "framework", "protocol", "targets", "heads", "rows")
SOURCE_FIELDS = ("kind", "citation", "arxiv", "table", "url", "date", "note")
PROTOCOL_FIELDS = ("suites", "max_new_tokens", "temperature", "warmup", "repeats", "tau_convention", "notes",
                   "columns")
COLUMN_FIELDS = ("label", "suite", "category", "mean_of", "batch_size")
ENGINE_FIELDS = ("name", "version", "note")
TARGET_FIELDS = ("id", "chat_template", "system_prompt", "parameters_b", "layers", "kv_heads", "head_dim",
                 "max_position_embeddings")
HEAD_FIELDS = ("kind", "hub", "url", "parameters_b", "weights")
ROW_FIELDS = ("id", "label", "target", "method", "head", "options", "max_new_tokens", "gpus", "runnable", "reason",
              "note", "engine_options", "cells")
DTYPES = ("float16", "bfloat16", "float32")
# the engines whose tables ``reproduce`` runs: it launches them (harness.backends.launch) as `engine: openai` entries
LAUNCHED_ENGINES = ("vllm", "sglang")


class TableError(InputError):
    """A published table that does not parse or validate; the message names the file and the field."""


@dataclass
class Column:
    """One reported column: the questions of ``suite`` (only ``category`` ones when set), or the equal-weight mean
    of other columns (``mean_of``)."""

    id: str
    label: str
    suite: str | None = None
    category: str | None = None
    mean_of: list[str] | None = None
    batch_size: int = 1  # concurrent sequences the source decoded (> 1 only in an engine table)


@dataclass
class TargetSpec:
    key: str
    id: str
    chat_template: str | None = None
    system_prompt: str | None = None
    parameters_b: float | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None


@dataclass
class HeadSpec:
    id: str
    kind: str
    hub: bool = True
    url: str | None = None
    parameters_b: float | None = None
    weights: str | None = None  # which published copy of the checkpoint produced the reported numbers


@dataclass
class Row:
    id: str
    label: str
    target: str
    method: str | None
    head: str | None
    options: dict[str, Any]
    cells: dict[str, dict[str, float]]
    max_new_tokens: int | None = None
    gpus: int = 1  # GPUs the source ran the row on
    runnable: bool = True
    reason: str | None = None
    note: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)  # engine tables: the engine settings of the row


@dataclass
class Table:
    """A validated published table (see the module docstring for the fields)."""

    id: str
    title: str
    source: dict[str, Any]
    hardware: str
    dtype: str
    framework: str
    suites: list[str]
    max_new_tokens: int
    temperature: float
    warmup: int
    repeats: int
    tau_convention: str
    notes: str | None
    columns: dict[str, Column]
    targets: dict[str, TargetSpec]
    heads: dict[str, HeadSpec]
    rows: list[Row]
    engine: dict[str, Any] | None = None  # {name, version, note} of an engine table; None: draftbench's own loop
    path: str = ""
    sha256: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise TableError(f"table {self.id!r} has no row {row_id!r}; rows: {', '.join(r.id for r in self.rows)}")

    def runnable_rows(self) -> list[Row]:
        return [r for r in self.rows if r.runnable]

    def batch_sizes(self) -> list[int]:
        """The batch sizes of the columns, ascending (``[1]`` for a table of draftbench's own loop)."""
        return sorted({c.batch_size for c in self.columns.values()})

    def n_cells(self) -> int:
        """Reported numbers in the table (every metric of every cell of every row)."""
        return sum(len(c) for r in self.rows for c in r.cells.values())

    def cite(self) -> str:
        """One line naming the source. Example: "EAGLE-2: ... (arXiv:2406.16858, Table 1)"."""
        s = self.source
        bits = [f"arXiv:{s['arxiv']}" if s.get("arxiv") else None, s.get("table"), s.get("url"), s.get("date")]
        extra = ", ".join(b for b in bits if b)
        return f"{s['citation']} ({extra})" if extra else s["citation"]


def table_names() -> list[str]:
    """The shipped tables' ids (``results/published/*.yaml``)."""
    return shipped_names(TABLE_DIR, ".yaml")


def resolve_table(name_or_path: str | Path) -> Path:
    """A shipped table id or the path of a table YAML file; a clear error with close matches otherwise."""
    return resolve_shipped(name_or_path, TABLE_DIR, (".yaml", ".yml"), "published table", TableError)


def load_table(name_or_path: str | Path) -> Table:
    """Read and validate a published table (shipped id or YAML path)."""
    path = resolve_table(name_or_path)
    text = path.read_text(encoding="utf-8")
    try:
        data = safe_load(text)
    except yaml.YAMLError as e:
        raise TableError(f"{path.name}: invalid YAML: {e}") from e
    table = table_from_dict(data, path.name, stem=path.stem)
    table.path, table.sha256 = str(path), hashlib.sha256(text.encode()).hexdigest()
    return table


class _Checker:
    """Small helpers that raise :class:`TableError` prefixed with the file name and the field path (the types are
    checked by :func:`harness.schema.check`, the ranges here)."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field_path: str, msg: str):
        raise TableError(f"{self.where}: {field_path}: {msg}")

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
        unknown_keys(value, allowed, f"{self.where}: {path}", "field", TableError, list_valid=True)
        missing = [k for k in required if k not in value]
        if missing:
            self.fail(path, f"missing field(s) {', '.join(missing)}")
        return value

    def string(self, value: Any, path: str, optional: bool = False) -> str | None:
        check(value, str | None if optional else str, f"{self.where}: {path}", TableError)
        if value is not None and not value.strip():
            self.fail(path, f"expected a non-empty string, got {value!r}")
        return value

    def number(self, value: Any, path: str, optional: bool = False, minimum: float | None = None) -> float | None:
        check(value, float | None if optional else float, f"{self.where}: {path}", TableError)
        if value is None:
            return None
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum:g}, got {value!r}")
        return float(value)

    def integer(self, value: Any, path: str, optional: bool = False, minimum: int | None = None) -> int | None:
        check(value, int | None if optional else int, f"{self.where}: {path}", TableError)
        if minimum is not None and value is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value!r}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        return check(value, bool, f"{self.where}: {path}", TableError)


def table_from_dict(data: Any, where: str = "table", stem: str | None = None) -> Table:
    """Validate the mapping of a table file (``where`` names it in errors) and build a :class:`Table`."""
    c = _Checker(where)
    c.mapping(data, "table", (*TOP_FIELDS, "engine"), TOP_FIELDS)
    table_id = c.string(data["id"], "id")
    if stem is not None and table_id != stem:
        c.fail("id", f"{table_id!r} must equal the file name {stem!r}")
    source = c.mapping(data["source"], "source", SOURCE_FIELDS, ("kind", "citation"))
    if source["kind"] not in SOURCE_KINDS:
        c.fail("source.kind", f"must be one of {', '.join(SOURCE_KINDS)}, got {source['kind']!r}")
    c.string(source["citation"], "source.citation")
    for k in ("arxiv", "table", "url", "date", "note"):
        if source.get(k) is not None and not isinstance(source[k], str):
            c.fail(f"source.{k}", f"expected a string or null (quote it: \"{source[k]}\"), got {source[k]!r}")
    if source["kind"] == "paper" and not source.get("arxiv"):
        c.fail("source.arxiv", "a paper source needs its arXiv id")
    if source["kind"] in ("leaderboard", "recomputed") and not source.get("url"):
        c.fail("source.url", f"a {source['kind']} source needs the address of what it was taken from")
    if data["dtype"] not in DTYPES:
        c.fail("dtype", f"must be one of {', '.join(DTYPES)}, got {data['dtype']!r}")

    proto = c.mapping(data["protocol"], "protocol", PROTOCOL_FIELDS,
                      ("suites", "max_new_tokens", "temperature", "warmup", "repeats", "tau_convention", "columns"))
    suites = proto["suites"]
    if not isinstance(suites, list) or not suites or not all(isinstance(s, str) for s in suites):
        c.fail("protocol.suites", f"expected a non-empty list of suite names, got {suites!r}")
    for i, s in enumerate(suites):
        try:
            suite_info(s)
        except DataError as e:
            c.fail(f"protocol.suites[{i}]", str(e))
    conv = proto["tau_convention"]
    if conv not in TAU_CONVENTIONS:
        c.fail("protocol.tau_convention", f"unknown convention {conv!r}; known: {', '.join(TAU_CONVENTIONS)}")
    engine = _engine(c, data.get("engine"))
    columns = _columns(c, proto["columns"], suites, engine is not None)

    targets: dict[str, TargetSpec] = {}
    c.mapping(data["targets"], "targets", tuple(data["targets"]) if isinstance(data["targets"], dict) else ())
    if not data["targets"]:
        c.fail("targets", "at least one target is required")
    for key, t in data["targets"].items():
        p = f"targets.{key}"
        c.mapping(t, p, TARGET_FIELDS, ("id",))
        c.string(t["id"], f"{p}.id")
        if t.get("chat_template") is not None:
            try:
                resolve_chat_template(t["chat_template"], f"{where}: {p}.chat_template")
            except ChatTemplateError as e:
                raise TableError(str(e)) from None
        c.string(t.get("system_prompt"), f"{p}.system_prompt", optional=True)
        c.number(t.get("parameters_b"), f"{p}.parameters_b", optional=True, minimum=0)
        for k in ("layers", "kv_heads", "head_dim", "max_position_embeddings"):
            c.integer(t.get(k), f"{p}.{k}", optional=True, minimum=1)
        targets[key] = TargetSpec(key=key, **{k: t.get(k) for k in TARGET_FIELDS})

    heads: dict[str, HeadSpec] = {}
    raw_heads = data["heads"] or {}
    c.mapping(raw_heads, "heads", tuple(raw_heads) if isinstance(raw_heads, dict) else ())
    for hid, h in raw_heads.items():
        p = f"heads.{hid}"
        c.mapping(h, p, HEAD_FIELDS, ("kind",))
        c.string(h["kind"], f"{p}.kind")
        c.boolean(h.get("hub", True), f"{p}.hub")
        if h.get("hub") is False and not h.get("url"):
            c.fail(f"{p}.url", "a head that is not on the Hugging Face hub needs the address it is published at")
        c.number(h.get("parameters_b"), f"{p}.parameters_b", optional=True, minimum=0)
        c.string(h.get("weights"), f"{p}.weights", optional=True)
        heads[hid] = HeadSpec(id=hid, kind=h["kind"], hub=h.get("hub", True), url=h.get("url"),
                              parameters_b=h.get("parameters_b"), weights=h.get("weights"))

    rows_raw = data["rows"]
    if not isinstance(rows_raw, list) or not rows_raw:
        c.fail("rows", "expected a non-empty list of rows")
    rows, seen = [], set()
    for i, r in enumerate(rows_raw):
        rows.append(_row(c, r, f"rows[{i}]", targets, heads, columns, engine, list(suites)))
        if rows[-1].id in seen:
            c.fail(f"rows[{i}].id", f"duplicate row id {rows[-1].id!r}")
        seen.add(rows[-1].id)

    return Table(
        id=table_id, title=c.string(data["title"], "title"), source=dict(source),
        hardware=c.string(data["hardware"], "hardware"), dtype=data["dtype"],
        framework=c.string(data["framework"], "framework"), suites=list(suites),
        max_new_tokens=c.integer(proto["max_new_tokens"], "protocol.max_new_tokens", minimum=1),
        temperature=c.number(proto["temperature"], "protocol.temperature", minimum=0),
        warmup=c.integer(proto["warmup"], "protocol.warmup", minimum=0),
        repeats=c.integer(proto["repeats"], "protocol.repeats", minimum=1),
        tau_convention=conv, notes=c.string(proto.get("notes"), "protocol.notes", optional=True),
        columns=columns, targets=targets, heads=heads, rows=rows, engine=engine, raw=data,
    )


def _engine(c: _Checker, raw: Any) -> dict[str, Any] | None:
    """The ``engine`` block: None (draftbench's own loop) or {name, version, note}, name and version required."""
    if raw is None:
        return None
    c.mapping(raw, "engine", ENGINE_FIELDS, ("name", "version"))
    c.string(raw["name"], "engine.name")
    if not isinstance(raw["version"], str):
        c.fail("engine.version", f"expected a string (quote it, or \"not stated\"), got {raw['version']!r}")
    c.string(raw["version"], "engine.version")
    c.string(raw.get("note"), "engine.note", optional=True)
    return {k: raw.get(k) for k in ENGINE_FIELDS}


def _columns(c: _Checker, raw: Any, suites: list[str], engine: bool) -> dict[str, Column]:
    c.mapping(raw, "protocol.columns", tuple(raw) if isinstance(raw, dict) else ())
    if not raw:
        c.fail("protocol.columns", "at least one column is required")
    columns: dict[str, Column] = {}
    for cid, col in raw.items():
        p = f"protocol.columns.{cid}"
        c.mapping(col, p, COLUMN_FIELDS, ("label",))
        c.string(col["label"], f"{p}.label")
        if (col.get("suite") is None) == (col.get("mean_of") is None):
            c.fail(p, "give exactly one of suite (the questions of a suite) or mean_of (a mean of other columns)")
        if col.get("suite") is not None and col["suite"] not in suites:
            c.fail(f"{p}.suite", f"{col['suite']!r} is not in protocol.suites {suites}")
        if col.get("category") is not None and col.get("suite") is None:
            c.fail(f"{p}.category", "a category selects questions of a suite: give suite too")
        mean_of = col.get("mean_of")
        if mean_of is not None:
            if not isinstance(mean_of, list) or not mean_of:
                c.fail(f"{p}.mean_of", f"expected a non-empty list of column ids, got {mean_of!r}")
            for j, other in enumerate(mean_of):
                if other not in raw or raw[other].get("suite") is None:
                    c.fail(f"{p}.mean_of[{j}]", f"{other!r} is not a suite column of this table")
        if engine and "batch_size" not in col:
            c.fail(f"{p}.batch_size", "an engine table states each column's batch size")
        batch = c.integer(col.get("batch_size", 1), f"{p}.batch_size", minimum=1)
        if batch > 1 and not engine:
            c.fail(f"{p}.batch_size", f"batch size {batch} needs the table's `engine` (draftbench's own loop decodes "
                                      "one sequence at a time)")
        columns[cid] = Column(id=cid, label=col["label"], suite=col.get("suite"), category=col.get("category"),
                              mean_of=list(mean_of) if mean_of else None, batch_size=batch)
    unused = [s for s in suites if not any(col.suite == s for col in columns.values())]
    if unused:
        c.fail("protocol.suites", f"suite(s) {unused} are run but no column reports them")
    return columns


def _launchable(c: _Checker, p: str, engine: dict[str, Any], suites: list[str], columns: dict[str, Column]) -> None:
    """Refuse a runnable row of an engine table that ``reproduce`` could not measure: an engine it does not launch,
    or columns that a load level cannot stand for (a level mixes the prompts of every suite)."""
    if engine["name"] not in LAUNCHED_ENGINES:
        c.fail(p, f"reproduce launches an engine table's rows in {' or '.join(LAUNCHED_ENGINES)}, not "
                  f"{engine['name']!r}: set runnable: false and say in `reason` what it needs")
    if len(suites) > 1:
        c.fail(p, f"a runnable row of an engine table is measured by load levels, which mix the prompts of every "
                  f"suite: the table has {len(suites)} suites ({', '.join(suites)}); give it one, or set runnable: "
                  "false")
    split = [cid for cid, col in columns.items() if col.category is not None]
    if split:
        c.fail(p, f"a runnable row of an engine table is measured by load levels, which mix the prompts of every "
                  f"category: column(s) {', '.join(split)} select a category; set runnable: false")


def _row(c: _Checker, r: Any, p: str, targets: dict[str, TargetSpec], heads: dict[str, HeadSpec],
         columns: dict[str, Column], engine: dict[str, Any] | None, suites: list[str]) -> Row:
    c.mapping(r, p, ROW_FIELDS, ("id", "target", "cells"))
    row_id = c.string(r["id"], f"{p}.id")
    if not row_id.replace("_", "").replace("-", "").isalnum():
        c.fail(f"{p}.id", f"{row_id!r} must be letters, digits, '_' and '-' (it becomes the run label)")
    if r["target"] not in targets:
        c.fail(f"{p}.target", f"{r['target']!r} is not a key of targets ({', '.join(targets)})")
    runnable = c.boolean(r.get("runnable", True), f"{p}.runnable")
    if engine is not None and runnable:
        _launchable(c, f"{p}.runnable", engine, suites, columns)
    engine_options = check(r.get("engine_options") or {}, dict, f"{c.where}: {p}.engine_options", TableError)
    if engine_options and engine is None:
        c.fail(f"{p}.engine_options", "only a table with `engine` has engine options")
    for k, v in engine_options.items():
        check(v, str | int | float | bool, f"{c.where}: {p}.engine_options.{k}", TableError)
    if engine is not None and engine["name"] == "vllm" and "speculative_config" in engine_options:
        try:
            spec = json.loads(engine_options["speculative_config"])
        except (TypeError, ValueError):
            spec = None
        if not isinstance(spec, dict):
            c.fail(f"{p}.engine_options.speculative_config", "expected vLLM's --speculative-config JSON object as a "
                                                             f"string, got {engine_options['speculative_config']!r}")
    method = r.get("method")
    options = check(r.get("options") or {}, dict, f"{c.where}: {p}.options", TableError)
    if "head" in options:
        c.fail(f"{p}.options.head", "name the head in the row's `head` field (an id of `heads`), not as an option")
    if runnable:
        if method is None:
            c.fail(f"{p}.method", "a runnable row needs a registered method (or set runnable: false with a reason)")
        try:
            cls = METHODS.get(method)
        except UnknownNameError as e:
            c.fail(f"{p}.method", str(e))
        try:
            build_options(cls.Options, options, f"{p}.options")
        except OptionsError as e:
            msg = str(e)
            c.fail(f"{p}.options", msg.split(": ", 1)[1] if msg.startswith(f"{p}.options: ") else msg)
    elif not r.get("reason"):
        c.fail(f"{p}.reason", "a row with runnable: false must say why it cannot be run")
    head = r.get("head")
    if head is not None and head not in heads:
        c.fail(f"{p}.head", f"{head!r} is not an id of heads ({', '.join(heads) or 'none'})")
    c.integer(r.get("max_new_tokens"), f"{p}.max_new_tokens", optional=True, minimum=1)
    gpus = c.integer(r.get("gpus", 1), f"{p}.gpus", minimum=1)
    cells = r["cells"]
    c.mapping(cells, f"{p}.cells", tuple(columns))
    for cid, cell in cells.items():
        c.mapping(cell, f"{p}.cells.{cid}", CELL_METRICS)
        for metric, value in cell.items():
            c.number(value, f"{p}.cells.{cid}.{metric}", minimum=0)
    return Row(id=row_id, label=r.get("label") or row_id, target=r["target"], method=method, head=head,
               options=dict(options), cells={k: {m: float(v) for m, v in cell.items()} for k, cell in cells.items()},
               max_new_tokens=r.get("max_new_tokens") or None, gpus=gpus, runnable=runnable, reason=r.get("reason"),
               note=r.get("note"), engine_options=dict(engine_options))
