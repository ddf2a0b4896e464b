"""A run's per-request acceptance records in the field names engines and their benchmarks use, and back.

``draftbench export RUN_DIR --format aiperf|vllm`` writes one JSON line per measured turn (a turn is one request):

=========== ==========================================================================================================
aiperf      ``{"request": {...}, "spec_decode_acceptance": {...}}``: NVIDIA AIPerf's engine-neutral per-request
            record ``SpecDecodeAcceptanceRecord`` (AIPerf docs, "Per-Request Speculative-Decoding Acceptance"):
            ``engine``, ``mean_acceptance_length``, ``draft_acceptance_rate``, ``acceptance_histogram`` (sparse
            ``{accepted drafts j: steps}``, JSON keys are strings), ``num_accepted_draft_tokens``,
            ``num_draft_tokens``, ``num_spec_steps``, ``num_spec_tokens``, ``completion_tokens``,
            ``per_step_accepted``, ``per_step_drafted``
vllm        ``{"request": {...}, "usage": {"completion_tokens"}, "metrics": {"speculative_decoding": {...}}}``: the
            object vLLM returns per request with ``--per-request-spec-decode-metrics detailed`` (vLLM docs,
            "Per-Request Acceptance Metrics"): the same field names, ``acceptance_histogram`` dense (index j = steps
            that accepted exactly j drafts), ``engine`` and ``completion_tokens`` left out
=========== ==========================================================================================================

The numbers follow those engines' conventions (:mod:`harness.measure.metrics`): a step is a *drafting* step (a
verification step that drafted nothing is not counted, so the per-step arrays hold drafting steps only), accepted
counts exclude the bonus token and take a terminal step's verdict before a cut at EOS or the budget
(:func:`harness.measure.acceptance.drafts_before_cut`), drafted tokens are a step's draft depth
(:func:`harness.measure.acceptance.draft_counts`; an engine record's own counters where it has them). A turn with no
drafting step gets the engines' zero-step values (mean acceptance length 1.0, rate 0.0); a turn of a method that
never drafts (vanilla) gets ``null``, as a server without speculation sends no such object.

``request`` is draftbench's part, under draftbench's record names (:mod:`harness.measure.records`): the turn's
identity (label, method, lossless, suite, question_id, turn, question_turns, temperature, seed, repeat, runtime,
engine), what the compare gate reads (new_tokens, steps, accept_lengths, wall_time_s, prefill_time_s, stop_reason,
score, ``output_sha256``: sha256 of the output ids, :func:`ids_sha256`), the per-step lists of every verification
step (``accepted_drafts``, ``draft_depths``, non-drafting steps included), the terminal step's
``terminal_drafts_before_cut`` and ``provenance`` (run id, target, dtype, device slug). :func:`read_export` reads
either format back into records, so ``draftbench compare`` takes an export as BASE or NEW
(:meth:`harness.gate.baseline.Side.from_export`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.measure import acceptance as ACC
from harness.measure.rundir import dumps_json, write_text_atomic
from harness.schema import json_lines

FORMATS = ("aiperf", "vllm")
# the record fields an export's ``request`` carries, as the records name them
REQUEST_FIELDS = ("label", "method", "lossless", "suite", "question_id", "turn", "question_turns", "temperature",
                  "seed", "repeat", "runtime", "engine", "new_tokens", "steps", "accept_lengths", "accepted_drafts",
                  "draft_depths", "wall_time_s", "prefill_time_s", "stop_reason", "score")
REQUIRED = ("label", "suite", "question_id", "new_tokens", "steps", "accept_lengths", "wall_time_s")


def ids_sha256(ids: Sequence[int]) -> str:
    """sha256 (hex) of a token-id sequence, written as decimal ids joined by commas (``[1, 22]`` -> ``"1,22"``).

    Two outputs have the same hash exactly when they have the same ids (up to sha256 collisions), so a baseline
    can gate outputs without storing them. Example: ids_sha256([]) is the sha256 of the empty string.
    """
    return hashlib.sha256(",".join(str(int(t)) for t in ids).encode()).hexdigest()


def acceptance(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """One turn's acceptance in AIPerf's ``SpecDecodeAcceptanceRecord`` fields (the module docstring's
    conventions); None for a method that never drafts. Example: accepted_drafts [2, 0, 3], draft_depths [3, 0, 3],
    new_tokens 9 -> num_spec_steps 2, num_accepted_draft_tokens 5, num_draft_tokens 6, mean_acceptance_length 3.5,
    draft_acceptance_rate 0.833, acceptance_histogram {2: 1, 3: 1}, per_step_accepted [2, 3]."""
    acc, depth = list(rec.get("accepted_drafts") or []), list(rec.get("draft_depths") or [])
    accepted, drafted, steps = ACC.draft_counts(acc, depth, rec.get("engine_counters"))
    if accepted is None or drafted is None or steps is None:
        return None
    per_acc = [a for a, d in zip(acc, depth) if d > 0]
    per_drafted = [d for d in depth if d > 0]
    histogram: dict[int, int] = {}
    for a in per_acc:
        histogram[a] = histogram.get(a, 0) + 1
    return {
        "engine": rec.get("engine") or "draftbench",
        "mean_acceptance_length": ACC.mean_acceptance_length([accepted], [steps]) if steps else 1.0,
        "draft_acceptance_rate": ACC.draft_acceptance_rate([accepted], [drafted]) if drafted else 0.0,
        "acceptance_histogram": dict(sorted(histogram.items())),
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": steps,
        "num_spec_tokens": None,  # draftbench records no fixed per-step bound
        "completion_tokens": rec.get("new_tokens"),
        "per_step_accepted": per_acc if depth else None,
        "per_step_drafted": per_drafted if depth else None,
    }


def export_line(rec: Mapping[str, Any], fmt: str, provenance: Mapping[str, Any]) -> dict[str, Any]:
    """One measured record as one export object of format ``fmt`` (:data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    ids = rec.get("output_ids")
    lengths, acc = list(rec.get("accept_lengths") or []), list(rec.get("accepted_drafts") or [])
    request = {k: rec.get(k) for k in REQUEST_FIELDS}
    request["question_id"] = str(rec["question_id"])
    request["output_sha256"] = ids_sha256(ids) if ids is not None else rec.get("output_sha256")
    request["terminal_drafts_before_cut"] = ACC.drafts_before_cut(lengths, acc)[-1] if acc else None
    request["provenance"] = dict(provenance)
    record = acceptance(rec)
    if fmt == "aiperf":
        return {"request": request, "spec_decode_acceptance": record}
    vllm = None
    if record is not None:
        vllm = {k: v for k, v in record.items() if k not in ("engine", "completion_tokens")}
        hist = record["acceptance_histogram"]
        vllm["acceptance_histogram"] = [hist.get(j, 0) for j in range(max(hist, default=-1) + 1)]
    return {"request": request, "usage": {"completion_tokens": rec.get("new_tokens")},
            "metrics": {"speculative_decoding": vllm}}


def write_export(records: Iterable[Mapping[str, Any]], provenance: Mapping[str, Any], fmt: str,
                 path: str | Path) -> Path:
    """Write the measured (``status`` "ok") records as JSON lines of format ``fmt``; returns ``path``."""
    lines = [dumps_json(export_line(r, fmt, provenance)) for r in records if r.get("status") == "ok"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, "".join(line + "\n" for line in lines))


def _engine_part(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The acceptance object of an export line of either format (None when the turn did not speculate)."""
    if "spec_decode_acceptance" in obj:
        return obj["spec_decode_acceptance"]
    return ((obj.get("metrics") or {}).get("speculative_decoding")) if "metrics" in obj else None


def record_from_export(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A draftbench record (the fields the tables and the compare gate read) from one export line: ``request``'s
    fields, the per-step lists from ``request`` or else from the engine part's ``per_step_*`` arrays, and the
    engine part's counts as ``engine_counters``. A missing required field is a ValueError naming ``where``."""
    request = obj.get("request") if isinstance(obj, Mapping) else None
    if not isinstance(request, Mapping):
        raise ValueError(f"{where}: not a draftbench export line (no \"request\" object)")
    lacking = [k for k in REQUIRED if request.get(k) is None]
    if lacking:
        raise ValueError(f"{where}: request lacks field(s) {lacking}")
    engine = _engine_part(obj)
    rec = {k: request.get(k) for k in REQUEST_FIELDS}
    rec.update(status="ok", question_id=str(request["question_id"]), output_ids=None,
               output_sha256=request.get("output_sha256"))
    for key, default in (("turn", 0), ("temperature", 0.0), ("seed", 0), ("repeat", 0), ("method", rec["label"])):
        if rec.get(key) is None:
            rec[key] = default
    if engine is not None:
        if rec.get("accepted_drafts") is None:
            rec["accepted_drafts"] = list(engine.get("per_step_accepted") or [])
            rec["draft_depths"] = list(engine.get("per_step_drafted") or [])
        rec["engine_counters"] = {"drafts": engine.get("num_spec_steps"),
                                  "draft_tokens": engine.get("num_draft_tokens"),
                                  "accepted_tokens": engine.get("num_accepted_draft_tokens"),
                                  "accepted_per_pos": None}
    return rec


def read_export(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of an export file of either format and the provenance its first line carries."""
    path = Path(path)
    records, provenance = [], {}
    for where, obj in json_lines(path.read_text(encoding="utf-8"), path):
        rec = record_from_export(obj, where)
        provenance = provenance or dict(obj["request"].get("provenance") or {})
        records.append(rec)
    if not records:
        raise ValueError(f"{path}: no export line")
    return records, provenance
