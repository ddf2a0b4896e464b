"""Per-turn records, appended durably to ``records.jsonl`` in a run directory, and resumed without duplicates.

One JSON object per line, one line per (method label, suite, question, turn, temperature, seed, repeat).
All turns of one question are written in a single ``write`` + ``fsync``, so a killed run leaves at most one
question partly written: a torn last line is ignored and cut off on resume, and a question with turns missing is
*incomplete*. In a data-parallel run (``accelerate launch``) process ``r`` of ``w`` writes
``records.rank<r>.jsonl``; readers take every ``records*.jsonl`` of the run directory.

Reading (:func:`load_records`, :func:`read_records`):

- a line that is not a JSON object (a corrupt line anywhere but a torn last line), or an object that is not a valid
  record (:func:`record_problem`: a key field missing or of the wrong type, a measured turn whose counters
  contradict each other or whose wall time is not a finite number of at least a nanosecond, an integer beyond
  64 bits, NaN or an infinity (strict JSON has neither), a key given twice; a record of another run's
  ``run_id`` than the manifest's) is skipped with a :class:`CorruptRecordWarning` naming ``file:line`` and the
  field; the lines after it are read as usual. A skipped record leaves its question incomplete, so no mean counts
  it;
- a second record of the same turn of the same attempt (a line written twice) is a duplicate: the later copy is kept
  and the earlier one is named like a bad line;
- a question is *complete* when one attempt at it (records sharing ``attempt``) has one record per turn
  ``0 .. question_turns - 1``. Per question key (:data:`KEY_FIELDS`) the reader keeps the latest complete attempt,
  else the latest attempt; records of the other attempts are *superseded* and left out. A resumed run re-runs every
  question that is not complete, so a partial question is finished with a new attempt, never counted twice.
  An error record counts as a turn: a question that failed has its error records and is complete (not re-run),
  unless one of its records says ``retry`` (the engine that ran it failed, not the method: the worker process
  died or answered garbage, :mod:`harness.backends`); such an attempt is incomplete and a resumed run re-runs it.

Fields (``None`` where not applicable or not measurable on this device; never NaN or infinity, the lines are
strict JSON):

=========================== ==================================================================================
run_id, status, error       run identity; ``"ok"`` or ``"error"`` (then ``error`` holds type and message)
attempt                     id shared by the turns of one attempt at a question (see above)
method, label, lossless     registered method name, the run's label for it (unique per run), lossless flag
method_options              dict of the method's options (ablation knobs); for an entry a server ran, what the server
                            ran instead (:func:`harness.backends.contract.entry_options`; ``{"server_config": "n/a"}``
                            for a server started elsewhere)
suite, suite_version        suite name and its version
question_id, category, turn question identity (``question_id`` as a string), 0-based turn index
question_turns              how many turns the question has (a complete question has this many records)
target, dtype, device       the target model alias/id, torch dtype, device string
temperature, top_p, seed    sampling settings; ``repeat`` counts repeated measurements
prompt_tokens, new_tokens   tokens in the rendered prompt; tokens generated (``len(output_ids)``)
steps                       target forward passes (prefill included) = ``len(accept_lengths)``
accept_lengths              tokens appended per target forward (see ``harness.engine.method.Generation``)
accepted_drafts             draft tokens accepted per verification step (uncut)
draft_depths                depth of the draft tree per verification step
wall_time_s, prefill_time_s synchronised wall time of the turn (prefill included); time to the first token
stop_reason                 "eos" or "max_new_tokens"
output_text, output_ids     the generated text and token ids
rss_bytes, peak_rss_bytes   process RSS after the turn; lifetime peak RSS
cuda_peak_allocated_bytes, cuda_peak_reserved_bytes, nvml_used_bytes   GPU memory, summed over a device map's
                            GPUs (None on CPU)
energy_j, mean_power_w      NVML energy over the turn (on CPU: RAPL package energy where readable) and energy /
                            wall time (None when neither can be read)
energy_source               ``nvml`` or ``rapl``, or ``n/a: <why>`` (harness.measure.trackers); absent in older runs
load_avg_1m                 the machine's 1-minute load average at the turn's end (``os.getloadavg``, every process
                            counted; harness.measure.validity's machine-load check); None where unreadable; absent
                            in older runs
deployable                  ``false`` for a method that is a bound, not a method (the ``oracle``); absent otherwise
nvml_devices                PCI bus ids of the NVML boards read (None without NVML)
runtime                     how the target's forward ran: ``eager`` or ``compiled`` (harness/engine/runtime.py;
                            the manifest's ``runtimes`` says how it was compiled); absent in older runs = eager
precision                   the target's precision (RunConfig.precisions: float32, bfloat16, float16, int8); absent in
                            a run without ``precisions`` (the target in ``dtype`` alone)
compile_s                   seconds this label's runtime spent compiling in this process before the turn (its
                            warm-up and any discarded attempt); never part of ``wall_time_s``
turn_compile_s              seconds of compilation inside this turn's ``wall_time_s`` (0 unless a turn compiled
                            again after the harness's retries; then its speed is not a steady-state number)
timings, counters           method-specific breakdown (e.g. draft_s, verify_s; draft_forwards)
timings_synchronised        whether the timings split was measured with a device sync at each mark (None: no split)
speculation_off             when the method stopped speculating for the rest of the turn: ``{"step", "reason",
                            "context"}`` (``harness.engine.method.Generation``); absent otherwise
method_notes                what the method chose during the turn, in its own terms (``layer_skip`` with ``search``:
                            the layer (or sub-layer) set it started with and each change,
                            ``harness.engine.method.Generation``);
                            absent otherwise
logit_margins, logit_tops,  greedy only (else None): per emitted token, the target's top-1 minus top-2 logit, the
logit_runner_ups            top-1 logit and the top-2 token (``harness.measure.metrics.divergence``)
score, score_name           quality of the answer where the suite has a scorer (on the last turn)
score_error                 why scoring failed (then ``score`` is None and ``status`` stays "ok": the generation
                            is measured, its quality is not); None otherwise
timestamp                   ISO time the turn finished
engine, engine_version      the engine that ran the turn when not the harness's own (``vllm``, ``openai``; absent
                            otherwise) and its version (None where the engine does not say)
engine_url, engine_config   where it ran (a server's URL; None in-process) and how it was configured
engine_options              what the run passed to that engine (``engine_options``: vLLM's speculative_config keys,
                            parallelism, ...); tables read it as ``opt.engine_options.*`` knobs
engine_counters             that engine's acceptance counters for the turn: drafts, draft_tokens, accepted_tokens,
                            accepted_per_pos (None where the engine has no such counter; harness.backends.contract)
engine_acceptance           what those counters count, in one phrase (``harness.backends.contract.acceptance_source``:
                            e.g. vLLM's drafting steps only, SGLang's every verification forward); None when the
                            engine did not speculate; absent in older runs
token_times_s               per new token, seconds from the request to its arrival (a streaming engine; else None)
engine_notes                how the engine turn was measured where it departs from the harness's own (token times
                            split over a chunk, text without token ids, acceptance from counters), one phrase each
retry                       true on an error record whose engine failed (a resumed run re-runs the question)
context_bucket,             a prompt of a context suite only (harness.run.context): its input length bucket, the
context_documents,          source documents it reads, and how many tokens of the last one its cut left out;
context_cut_tokens          ``prompt_tokens`` is its exact length
kv_cache_bytes              a context prompt only: the target's KV cache at prompt + answer, computed from its
                            config and dtype (``harness.measure.metrics.kv_cache_bytes``); None on another engine
                            (vLLM pages and reserves its cache itself), as ``draft_kv_bytes`` there
draft_kv_bytes              a context prompt only: the drafter's own KV cache at prompt + answer
                            (``harness.measure.metrics.draft_kv_bytes``): EAGLE's and Jakiro's heads within their
                            ``draft_window``, sps's draft model (its sliding layers within their window), sam's EAGLE-2
                            fallback; None for a method that keeps none; absent in older runs
max_new_tokens_cut_to       a context prompt only, when the model's window cut its answer's budget: that budget
=========================== ==================================================================================
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from harness.measure.rundir import (
    RECORDS_GLOB,
    ManifestError,
    dumps_json,
    open_run_file,
    read_manifest,
    read_run_file,
    records_file_name,
)
from harness.schema import Bound, NonEmpty, expected, type_error

if TYPE_CHECKING:
    import pandas as pd

# the phrase an engine turn's notes carry when its per-step counts were rebuilt without their order (served.py)
UNORDERED_STEPS = "the order of the steps is unknown"


def steps_ordered(rec: Mapping[str, Any]) -> bool:
    """Whether a turn's ``accepted_drafts`` are in the order the engine verified them: False when its
    ``engine_notes`` say the order is unknown (:data:`UNORDERED_STEPS`). Example: notes ["per-step acceptance from
    the server's counters (the order of the steps is unknown)"] -> False; [] or no notes -> True."""
    notes = rec.get("engine_notes")
    return not (isinstance(notes, list) and any(UNORDERED_STEPS in str(n) for n in notes))


# fields that identify one observation; a resumed run skips questions whose key is complete
KEY_FIELDS = ("label", "suite", "question_id", "temperature", "seed", "repeat")
# bad lines named one by one per file; beyond that, one warning gives the count
WARN_LINES_PER_FILE = 5


class CorruptRecordWarning(UserWarning):
    """A line of a records file that is not a JSON object (skipped; the lines after it are still read)."""


def runtime_label(label: str, runtime: str | None) -> str:
    """The label of an entry measured under ``runtime``: eager (or unknown: records made before runtimes existed)
    keeps ``label``; any other runtime appends ``@<runtime>`` unless the label already ends with it.
    Examples: ("vanilla", "eager") -> "vanilla"; ("vanilla", "compiled") -> "vanilla@compiled";
    ("fast@compiled", "compiled") -> "fast@compiled"."""
    if runtime in (None, "eager") or label.endswith(f"@{runtime}"):
        return label
    return f"{label}@{runtime}"


# the precisions a target (RunConfig.precisions) or a draft head (option head_precision) runs in: float32, bfloat16,
# float16, or int8 (torchao's int8 weight-only quantisation of the linear layers, activations in float32;
# harness.models.with_precision); the short name is a label's suffix
PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8"}
REFERENCE_PRECISION = "float32"  # the precision whose labels carry no suffix: the reference the others are held to


def precision_label(label: str, precision: str | None) -> str:
    """The label of an entry measured with the target in ``precision`` (:data:`PRECISIONS`): the reference
    (float32) or none keeps ``label``; any other appends ``@<short name>`` unless the label already ends with it.
    Examples: ("vanilla", "float32") -> "vanilla"; ("vanilla", "int8") -> "vanilla@int8"; ("eagle2",
    "bfloat16") -> "eagle2@bf16"."""
    if precision in (None, REFERENCE_PRECISION):
        return label
    short = PRECISIONS.get(precision, precision)
    return label if label.endswith(f"@{short}") else f"{label}@{short}"


def label_precisions(turns: pd.DataFrame) -> dict[str, str | None]:
    """label -> the target precision its records name (None for records of a run without ``precisions``)."""
    values = turns["precision"] if "precision" in turns else [None] * len(turns)
    out: dict[str, str | None] = {}
    for label, precision in zip(turns["label"], values):
        if out.get(label) is None:
            out[label] = precision if isinstance(precision, str) and precision else None
    return out


def label_runtimes(turns: pd.DataFrame) -> dict[str, str]:
    """label -> the runtime its records name (``eager`` for records made before runtimes existed)."""
    out: dict[str, str] = {}
    for label, runtime in zip(turns["label"], turns["runtime"]):
        if label not in out or out[label] == "eager":
            out[label] = runtime if isinstance(runtime, str) and runtime else "eager"
    return out


def label_engines(turns: pd.DataFrame) -> dict[str, str]:
    """label -> the engine that ran it (``harness`` when its records name none: the harness's own engine)."""
    engines = turns["engine"] if "engine" in turns else [None] * len(turns)
    out: dict[str, str] = {}
    for label, engine in zip(turns["label"], engines):
        if label not in out or out[label] == "harness":
            out[label] = engine if isinstance(engine, str) and engine else "harness"
    return out


def baseline_labels(turns: pd.DataFrame, baseline_label: str = "vanilla") -> dict[str, str]:
    """label -> the label its speed-up is measured against: for an entry of another engine, that engine's own entry
    of the baseline's method when the run has exactly one (an engine's speculation against the same engine without
    it, as engines are compared: vLLM's ngram against vLLM's vanilla, not against the harness's); else the baseline
    of its own runtime and target precision (:func:`runtime_label`, :func:`precision_label`, e.g.
    ``vanilla@compiled`` for ``eagle2@compiled``, ``vanilla@int8`` for ``eagle2@int8``) when the run measured one,
    else ``baseline_label``. Examples: labels vanilla,
    vanilla@compiled, pld@compiled (runtime compiled) -> {vanilla: vanilla, vanilla@compiled: vanilla@compiled,
    pld@compiled: vanilla@compiled}; labels vanilla, vllm-vanilla (method vanilla) and vllm-ngram on engine vllm ->
    {vanilla: vanilla, vllm-vanilla: vllm-vanilla, vllm-ngram: vllm-vanilla}."""
    runtimes, engines, precisions = label_runtimes(turns), label_engines(turns), label_precisions(turns)
    methods = dict(zip(turns["label"], turns["method"])) if "method" in turns else {}
    base_method = methods.get(baseline_label, baseline_label)
    out = {}
    for label, runtime in runtimes.items():
        own = precision_label(runtime_label(baseline_label, runtime), precisions[label])
        out[label] = own if own in runtimes else baseline_label
        if engines[label] != "harness":
            same = [lb for lb, e in engines.items() if e == engines[label] and methods.get(lb) == base_method]
            if len(same) == 1:
                out[label] = same[0]
    return out


def question_key(rec: Mapping[str, Any]) -> tuple:
    return tuple(str(rec[f]) if f == "question_id" else rec[f] for f in KEY_FIELDS)


COUNT = Annotated[int, Bound(0)]
# what a record must hold, per field, as :func:`harness.schema.type_error` checks it: every record's, then a measured
# ("ok") turn's; a missing field is named, except OPTIONAL_FIELDS, checked only where present and not null
RECORD_FIELDS = {"label": Annotated[str, NonEmpty()], "suite": Annotated[str, NonEmpty()], "attempt": str,
                 "question_id": str | int, "temperature": Annotated[float, Bound(0)], "seed": int, "repeat": int,
                 "turn": COUNT, "status": Literal["ok", "error"]}
MIN_WALL_S = 1e-9  # no turn is measured faster than a nanosecond; 5e-324 s gave tokens/s = inf
MEASURED_FIELDS = {"new_tokens": COUNT, "steps": COUNT, "accept_lengths": list[COUNT],
                   "wall_time_s": Annotated[float, Bound(MIN_WALL_S)], "prefill_time_s": Annotated[float, Bound(0)]}
INT64 = (-(2**63), 2**63 - 1)  # what a table column (parquet, numpy) holds
OPTIONAL_FIELDS = ("attempt", "prefill_time_s")


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return (text[:40] + "...") if len(text) > 43 else text


def _field_problem(rec: Mapping[str, Any], name: str, annotation: Any, required: bool = True) -> str | None:
    """``<name>: missing`` or ``<name>: expected <what>, got <value as JSON>`` (:func:`harness.schema.expected`), or
    None when ``rec[name]`` fits ``annotation`` (finite numbers only); a field not ``required`` may be absent or
    null."""
    if name not in rec or (rec[name] is None and not required):
        return f"{name}: missing" if required else None
    if type_error(rec[name], annotation, finite=True) is None:
        return None
    return f"{name}: expected {expected(annotation)}, got {_describe(rec[name])}"


def record_problem(rec: Mapping[str, Any]) -> str | None:
    """Why ``rec`` is not a record the tables can use, in one phrase naming the field; None when it is.

    Every record needs its key (:data:`KEY_FIELDS`: ``label`` and ``suite`` non-empty strings, ``question_id`` a
    string or integer, ``temperature`` a finite number >= 0, ``seed`` and ``repeat`` integers), an integer
    ``turn`` >= 0 and ``status`` "ok" or "error"; ``attempt``, when not null, is a string (:data:`RECORD_FIELDS`).
    A measured ("ok") turn also needs integer ``new_tokens`` and ``steps``, ``accept_lengths`` a list of ``steps``
    integers summing to ``new_tokens`` (:class:`harness.engine.method.Generation`), ``output_ids`` (when not null)
    ``new_tokens`` long, and ``wall_time_s`` a finite number >= 1e-9 (:data:`MIN_WALL_S`; ``prefill_time_s``, when
    not null, a finite number >= 0; :data:`MEASURED_FIELDS`). Each field's type and range is checked by
    :func:`harness.schema.type_error`; no integer anywhere in the record may exceed 64 bits (:data:`INT64`).
    Examples: {..., "wall_time_s": 0} -> "wall_time_s: expected a number >= 1e-09, got 0";
    {..., "new_tokens": 5, "steps": 0, "accept_lengths": []} -> "accept_lengths: sums to 0 but new_tokens is 5".
    """
    fields = {**RECORD_FIELDS, **(MEASURED_FIELDS if rec.get("status") == "ok" else {})}
    for name, annotation in fields.items():
        problem = _field_problem(rec, name, annotation, required=name not in OPTIONAL_FIELDS)
        if problem:
            return problem
    for name, value in rec.items():
        bad = _unfit_number(value)
        if bad is not None:
            return f"{name}: {bad}"
    if rec["status"] != "ok":
        return None
    lengths = rec["accept_lengths"]
    if len(lengths) != rec["steps"]:
        return f"steps: is {rec['steps']} but accept_lengths has {len(lengths)} entries"
    if sum(lengths) != rec["new_tokens"]:
        return f"accept_lengths: sums to {sum(lengths)} but new_tokens is {rec['new_tokens']}"
    ids = rec.get("output_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) != rec["new_tokens"]):
        got = f"{len(ids)} ids" if isinstance(ids, list) else _describe(ids)
        return f"output_ids: expected a list of new_tokens = {rec['new_tokens']} ids, got {got}"
    return None


def _unfit_number(value: Any) -> str | None:
    """What is wrong with the first number in ``value`` (at any depth) that no table can hold: an integer outside
    :data:`INT64` or NaN / an infinity (which strict JSON has not); None when there is none."""
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return f"{value} does not fit a 64-bit integer"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a JSON number"
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for v in items:
        bad = _unfit_number(v)
        if bad is not None:
            return bad
    return None


@dataclass
class RecordsRead:
    """What :func:`load_records` found in a run directory.

    ``records``: the selected records, in file order (one attempt per question key). ``bad_lines``: "file:line:
    reason" of every skipped line (unreadable, an invalid record, or the earlier copy of a duplicate).
    ``superseded``: how many records of other attempts were left out. ``complete`` / ``incomplete``: question keys
    whose selected attempt has / lacks a record for some turn.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)
    superseded: int = 0
    complete: set[tuple] = field(default_factory=set)
    incomplete: set[tuple] = field(default_factory=set)

    @property
    def complete_records(self) -> list[dict[str, Any]]:
        """The selected records of complete questions only: what every mean is taken over (a partial question never
        enters one)."""
        return [r for r in self.records if question_key(r) in self.complete]


class RecordStore:
    """Append-only JSONL store of turn records in ``run_dir`` (``file_name``: another file of rows, such as a run's
    load levels, :data:`harness.measure.rundir.LOAD_FILE`)."""

    def __init__(self, run_dir: str | Path, rank: int | None = None, file_name: str | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / (file_name or records_file_name(rank))
        self._repair_tail()

    def _repair_tail(self) -> None:
        """Drop a torn last line left by a kill in the middle of a write (a whole record that only lacks its newline
        gets the newline)."""
        if not os.path.lexists(self.path):
            return
        with open_run_file(self.path, "r+b") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            try:
                whole = isinstance(json.loads(data[cut:].decode("utf-8")), dict)
            except ValueError:  # JSONDecodeError and UnicodeDecodeError
                whole = False
            if whole:
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            else:
                f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records (one question's turns) atomically enough: one write, flushed and fsynced. Any text is
        written (:func:`harness.measure.rundir.dumps_json` escapes what UTF-8 cannot hold); a file that cannot be
        written (disk full, a link: :func:`harness.measure.rundir.open_run_file`) is an OSError naming it."""
        lines = "".join(dumps_json(r) + "\n" for r in records).encode("utf-8")
        if not lines:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            with open_run_file(self.path, "ab") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise OSError(f"{self.path}: cannot append records: {e.strerror or e}") from None

    def read(self) -> list[dict[str, Any]]:
        """Records of the whole run (every process's file), one attempt per question."""
        return read_records(self.run_dir)

    def done_keys(self, expected_turns: Mapping[tuple[str, str], int] | None = None) -> set[tuple]:
        """Keys of the complete questions of the whole run (what a resumed run does not run again);
        ``expected_turns``: (suite, question_id) -> number of turns, as in :func:`load_records`."""
        return load_records(self.run_dir, expected_turns).complete


def failed_entries(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """label -> its first error, for every label none of whose turns succeeded (a run that measured nothing for an
    entry has failed, whatever else it did). Example: vanilla ok + ok, eagle2 error + error -> {"eagle2": <the first
    error>}."""
    first: dict[str, str] = {}
    ok: set[str] = set()
    for rec in records:
        label = rec.get("label")
        if rec.get("status") == "ok":
            ok.add(label)
        elif label not in first:
            first[label] = str(rec.get("error") or "unknown error")
    return {label: error for label, error in first.items() if label not in ok}


def record_files(run_dir: str | Path) -> list[Path]:
    return sorted(Path(run_dir).glob(RECORDS_GLOB))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run directory (every ``records*.jsonl``) or of one records file: :func:`load_records`'s
    selection (bad lines skipped with a warning, one attempt per question)."""
    return load_records(path).records


def load_records(path: str | Path, expected_turns: Mapping[tuple[str, str], int] | None = None) -> RecordsRead:
    """Read a run directory (every ``records*.jsonl``) or one records file, as described in the module docstring.

    A question's number of turns comes from ``expected_turns`` ((suite, question_id) -> turns, what the runner
    knows from the loaded suites), else from its records' ``question_turns``, else (records written before that
    field existed) from the highest turn any record of that suite and question has.
    Example: attempt "a" has turn 0 of a two-turn question, attempt "b" turns 0 and 1 -> b's two records are
    kept, a's record is superseded.

    Every record belongs to one run: the manifest's ``run_id`` (without a manifest, or when no record carries it,
    the ``run_id`` most records carry). A record of another run (appended from another run's file) is named and left
    out like a bad line.
    """
    path = Path(path)
    files = record_files(path) if path.is_dir() else [path]
    found = RecordsRead()
    raw: list[tuple[str, dict[str, Any]]] = []
    for file in files:
        raw.extend(_read_file(file, found.bad_lines))
    raw = _own_run(raw, _manifest_run_id(path) if path.is_dir() else None, found.bad_lines)
    _select_attempts(_drop_duplicates(raw, found.bad_lines), found, expected_turns or {})
    return found


def _manifest_run_id(run_dir: Path) -> str | None:
    """The ``run_id`` of the run's manifest; None without one (or with one that cannot be read: its reader says so)."""
    try:
        manifest = read_manifest(run_dir)
    except ManifestError:
        return None
    run_id = (manifest or {}).get("run_id")
    return run_id if isinstance(run_id, str) else None


def _own_run(raw: list[tuple[str, dict[str, Any]]], run_id: str | None,
             bad_lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``raw`` less the records of another run than ``run_id`` (None, or one no record carries: the run_id most
    records carry), each named in ``bad_lines`` and warned about. A record without a run_id is kept (old runs)."""
    ids = [rec["run_id"] for _, rec in raw if isinstance(rec.get("run_id"), str)]
    if run_id not in ids:
        if len(set(ids)) < 2:
            return raw
        run_id = max(set(ids), key=lambda x: (ids.count(x), -ids.index(x)))
    out, foreign = [], 0
    for where, rec in raw:
        other = rec.get("run_id")
        if other is None or other == run_id:
            out.append((where, rec))
            continue
        foreign += 1
        reason = f"run_id: {_describe(other)} is another run's (this run is {_describe(run_id)}); record left out"
        bad_lines.append(f"{where}: {reason}")
        if foreign <= WARN_LINES_PER_FILE:
            warnings.warn(f"{where}: {reason}", CorruptRecordWarning, stacklevel=3)
    if foreign > WARN_LINES_PER_FILE:
        warnings.warn(f"{foreign - WARN_LINES_PER_FILE} more records of other runs left out ({foreign} in all)",
                      CorruptRecordWarning, stacklevel=3)
    return out


def _drop_duplicates(raw: list[tuple[str, dict[str, Any]]], bad_lines: list[str]) -> list[dict[str, Any]]:
    """The records of ``raw`` ((file:line, record) pairs) less the earlier copy of any (question key, attempt, turn)
    written twice, each named in ``bad_lines`` and warned about. Example: lines 3 and 4 both turn 0 of attempt "a"
    of one question -> line 4 is kept, "records.jsonl:3: duplicate of turn 0 of attempt a (a later copy at
    records.jsonl:4 is kept)"."""
    last: dict[tuple, int] = {}
    for i, (_, rec) in enumerate(raw):
        last[(question_key(rec), rec.get("attempt"), rec["turn"])] = i
    out = []
    for i, (where, rec) in enumerate(raw):
        kept = last[(question_key(rec), rec.get("attempt"), rec["turn"])]
        if kept == i:
            out.append(rec)
            continue
        reason = (f"duplicate of turn {rec['turn']} of attempt {rec.get('attempt')} (a later copy at "
                  f"{raw[kept][0]} is kept)")
        bad_lines.append(f"{where}: {reason}")
        warnings.warn(f"{where}: {reason}", CorruptRecordWarning, stacklevel=3)
    return out


def _read_file(path: Path, bad_lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """("file:line", record) for each valid record of one file; a bad line (not a JSON object, or an object that is
    not a valid record: :func:`record_problem`) is named in ``bad_lines`` and warned about, then skipped. A last line
    without its newline that does not parse is a torn write (the run was killed) and is skipped silently."""
    data = read_run_file(path)
    if data is None:
        return []
    lines = data.split(b"\n")
    out = []
    bad = 0
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = lineno == len(lines)  # no newline after it
        parsed = False
        try:
            rec = json.loads(raw.decode("utf-8"), object_pairs_hook=_object)
            if b"\\u" in raw:  # an escaped lone surrogate may be in it
                rec = _encodable(rec)
            parsed = True
            reason = (record_problem(rec) if isinstance(rec, dict)
                      else f"a JSON {type(rec).__name__}, not a record object")
        except UnicodeDecodeError:
            reason = "not UTF-8 text"
        except json.JSONDecodeError as e:
            reason = f"not valid JSON ({e.msg} at column {e.colno})"
        except _NotStrict as e:
            reason = f"not strict JSON ({e})"
        if reason is None:
            out.append((f"{path}:{lineno}", rec))
            continue
        if torn and not parsed:
            continue
        bad += 1
        where = f"{path}:{lineno}"
        bad_lines.append(f"{where}: {reason}")
        if bad <= WARN_LINES_PER_FILE:
            warnings.warn(f"{where}: {reason}; line skipped, the lines after it are read",
                          CorruptRecordWarning, stacklevel=3)
    if bad > WARN_LINES_PER_FILE:
        warnings.warn(f"{path}: {bad - WARN_LINES_PER_FILE} more bad lines skipped ({bad} in all)",
                      CorruptRecordWarning, stacklevel=3)
    return out


def _encodable(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (which JSON escapes can hold but UTF-8, Arrow and every
    report file cannot; :func:`harness.measure.rundir.dumps_json` writes them so) as its escape text: "a\\ud800"
    is read as the seven characters ``a\\ud800``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    return value


class _NotStrict(ValueError):
    """A JSON object Python reads but that is no record: a key given twice (which copy counts?)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; a key given twice raises :class:`_NotStrict` naming it."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _NotStrict(f"key {key!r} given twice")
        obj[key] = value
    return obj


def _select_attempts(raw: list[dict[str, Any]], found: RecordsRead,
                     expected_turns: Mapping[tuple[str, str], int]) -> None:
    """Fill ``found`` with one attempt per question key (module docstring): the latest complete one, else the latest.
    Every record has its key fields (:func:`record_problem`)."""
    highest: dict[tuple[str, str], int] = {}
    for rec in raw:
        if isinstance(rec.get("turn"), int) and "suite" in rec and "question_id" in rec:
            q = (rec["suite"], str(rec["question_id"]))
            highest[q] = max(highest.get(q, 0), rec["turn"] + 1)
    # key -> attempt -> [(position, record)]
    attempts: dict[tuple, dict[Any, list[tuple[int, dict]]]] = {}
    keep: set[int] = set()
    for i, rec in enumerate(raw):
        attempts.setdefault(question_key(rec), {}).setdefault(rec.get("attempt"), []).append((i, rec))
    for key, by_attempt in attempts.items():
        q = (key[1], key[2])
        options = []
        for members in by_attempt.values():
            recs = [r for _, r in members]
            expected = expected_turns.get(q) or _int(recs[0].get("question_turns")) or highest.get(q, 0)
            turns = sorted(r.get("turn") for r in recs if isinstance(r.get("turn"), int))
            retry = any(r.get("retry") for r in recs)  # an engine failed: run the question again
            complete = len(recs) == expected and turns == list(range(expected)) and not retry
            latest = max(str(r.get("timestamp") or "") for r in recs)
            options.append((complete, latest, members[-1][0], members))
        complete, _, _, chosen = max(options, key=lambda o: o[:3])
        (found.complete if complete else found.incomplete).add(key)
        keep.update(i for i, _ in chosen)
    found.records = [rec for i, rec in enumerate(raw) if i in keep]
    found.superseded = len(raw) - len(found.records)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
