"""From a run directory's records to tidy tables, a Markdown paper table and plots.

``write_report(run_dir)`` reads ``manifest.json`` and ``records.jsonl`` and writes::

    tables/turns.parquet, turns.csv          one row per turn (turns_table)
    tables/questions.parquet, questions.csv  one row per (label, method, suite, temperature, question)
    tables/summary.parquet, summary.csv      one row per (label, method, suite, temperature) (summary_table)
    tables/summary.md                        provenance header + paper_table (+ divergence note)
    tables/divergence.csv                    greedy turns that differ from the baseline (divergence_table)
    plots/*.png                              speed-up, tau, tokens/s per suite; accepted lengths; acceptance/position
    tables/ablation.csv, plots/ablation_*    when options differ between entries of a method (harness.measure.ablation)
    report.html                              all of it on one self-contained page (harness.measure.html)

Options that differ between entries of one method (ablation knobs) get their own ``opt.<name>`` column in the
questions and summary tables, taken from the records' ``method_options``.

Every number is computed by a :mod:`harness.measure.metrics` function; this module only selects and groups rows.

Which turns are measured: a question with any error turn is left out of every measurement (its other turns
would give a partial question), and is counted in ``n_errors``; so is an incomplete question (a turn's record is
missing, :mod:`harness.measure.records`), counted in ``n_incomplete``. A question's tokens/s pools all its turns over
seeds and repeats. Speed-ups compare a label with the baseline label on the same suite, temperature and questions;
a label measured under another runtime than eager (``runtime`` of its records, e.g. ``eagle2@compiled``) is
compared with the baseline of its own runtime (``vanilla@compiled``) when the run has one (:func:`baseline_labels`),
and ``speedup_vs_eager`` gives every label's ratio to the eager baseline as well.
Quality is the mean score of the measured questions, and NaN when any answer of the group failed to score
(``n_score_errors``): a mean over the answers that happened to score would look like a result.
Unreadable record lines, superseded attempts and incomplete questions are listed in ``summary.md``'s header.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import metrics as M
from harness.measure.ablation import ablation_markdown, with_knobs, write_ablation
from harness.measure.html import write_html_report
from harness.measure.records import (
    RecordsRead,
    baseline_labels,
    label_runtimes,
    load_records,
    record_files,
)
from harness.measure.rundir import MANIFEST_FILE, RECORDS_FILE, SUMMARY_MD, read_manifest

GROUP = ["label", "method", "suite", "temperature"]
QUESTION = [*GROUP, "question_id"]

# record fields every turns table has, even when no record carries them (error records may lack measurements)
BASE_COLUMNS = (
    "run_id", "status", "error", "method", "label", "lossless", "suite", "suite_version", "question_id",
    "category", "turn", "target", "dtype", "device", "temperature", "top_p", "seed", "repeat", "prompt_tokens",
    "new_tokens", "steps", "accept_lengths", "accepted_drafts", "draft_depths", "wall_time_s", "prefill_time_s",
    "stop_reason", "output_text", "output_ids", "rss_bytes", "peak_rss_bytes", "cuda_peak_allocated_bytes",
    "cuda_peak_reserved_bytes", "nvml_used_bytes", "energy_j", "mean_power_w", "score", "score_name", "timestamp",
    "score_error", "question_turns", "attempt", "runtime", "compile_s", "turn_compile_s",
)
LIST_COLUMNS = ("accept_lengths", "accepted_drafts", "draft_depths", "output_ids")
# nested dict fields of a record -> prefix of their dotted columns
FLATTENED = {"method_options": "opt", "timings": "timing", "counters": "counter"}

# provenance column -> dotted manifest paths to try, first match wins (a path also matches under any parent key,
# e.g. "versions.torch" matches "env.versions.torch")
PROVENANCE: dict[str, tuple[str, ...]] = {
    "run_id": ("run_id",),
    "created": ("created", "date", "started", "timestamp"),
    "git_hash": ("git_hash", "git.hash"),
    "git_dirty": ("git_dirty", "git.dirty"),
    "draftbench_version": ("versions.draftbench",),
    "python_version": ("versions.python", "python_version"),
    "torch_version": ("versions.torch", "torch_version"),
    "transformers_version": ("versions.transformers", "transformers_version"),
    "device_name": ("device.device_name", "device_name"),
    "device_type": ("device.device_type", "device_type"),
    "gpu_driver": ("device.driver", "driver"),
    "cuda_version": ("device.cuda_version", "cuda_version"),
}


def flatten(d: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Nested dict -> one level with dotted keys. Example: flatten({"a": 1, "b": {"c": 2}}, "opt") ->
    {"opt.a": 1, "opt.b.c": 2}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def provenance(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance columns (:data:`PROVENANCE`) found in a manifest; absent ones are None. The run config
    (``config.*``) is never searched, so an option named like a provenance field cannot shadow it."""
    flat = {k: v for k, v in flatten(manifest, "").items() if not k.startswith("config.")}
    out: dict[str, Any] = {}
    for column, paths in PROVENANCE.items():
        out[column] = next((v for p in paths for k, v in flat.items() if k == p or k.endswith("." + p)), None)
    return out


def _turn_row(rec: Mapping[str, Any], prov: Mapping[str, Any]) -> dict[str, Any]:
    """One record -> one flat row: provenance, record fields, nested dicts as dotted columns, derived columns."""
    row: dict[str, Any] = {k: v for k, v in prov.items() if v is not None}
    for key, value in rec.items():
        if key in FLATTENED and isinstance(value, Mapping):
            row.update(flatten(value, FLATTENED[key]))
        else:
            row[key] = value
    if row.get("question_id") is not None:
        row["question_id"] = str(row["question_id"])
    ok = row.get("status") == "ok"
    row["tokens_per_s"] = (M.tokens_per_second(row.get("new_tokens"), row.get("wall_time_s"))
                           if ok else math.nan)
    lengths = row.get("accept_lengths")
    row["tau_turn"] = M.tau([lengths]) if ok and lengths is not None else math.nan
    return row


def turns_table(records: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One tidy row per turn record: the record's fields, ``method_options`` / ``timings`` / ``counters``
    flattened to ``opt.*`` / ``timing.*`` / ``counter.*``, run provenance from the manifest (``run_id``,
    ``git_hash``, ``device_name``, ``torch_version``, ...), and derived ``tokens_per_s`` and ``tau_turn``
    (NaN on error rows). Provenance and derived columns come first, then the record fields."""
    prov = provenance(manifest or {})
    rows = [_turn_row(r, prov) for r in records]
    df = pd.DataFrame(rows)
    for col in (*PROVENANCE, *BASE_COLUMNS, "tokens_per_s", "tau_turn"):
        if col not in df.columns:
            df[col] = None
    for col in ("tokens_per_s", "tau_turn"):
        df[col] = df[col].astype(float)
    first = [*PROVENANCE, *BASE_COLUMNS[1:], "tokens_per_s", "tau_turn"]
    return df[[*first, *[c for c in df.columns if c not in first]]]


def _complete(turns: pd.DataFrame) -> pd.Series:
    """Boolean mask [rows]: rows of questions (per label/suite/temperature/question) whose every (seed, repeat) has
    one row per turn 0 .. question_turns - 1. Records without ``question_turns`` (older runs) expect as many turns
    as the highest turn any row of the same suite and question has."""
    turn = pd.to_numeric(turns["turn"], errors="coerce")
    highest = turn.groupby([turns["suite"], turns["question_id"]], dropna=False).transform("max") + 1
    expected = pd.to_numeric(turns["question_turns"], errors="coerce").fillna(highest)
    attempt = [turns[c] for c in (*QUESTION, "seed", "repeat")]
    n_rows = turn.groupby(attempt, dropna=False).transform("size")
    n_distinct = turn.groupby(attempt, dropna=False).transform("nunique")
    top = turn.groupby(attempt, dropna=False).transform("max")
    whole = (n_rows == expected) & (n_distinct == expected) & (top == expected - 1)
    return whole.groupby([turns[c] for c in QUESTION], dropna=False).transform("all").astype(bool)


def _measured(turns: pd.DataFrame) -> pd.Series:
    """Boolean mask [rows]: ok turns of complete questions (per label/suite/temperature) that have no error turn."""
    errored = (turns["status"] != "ok").groupby([turns[c] for c in QUESTION], dropna=False).transform("any")
    return (turns["status"] == "ok") & ~errored.astype(bool) & _complete(turns)


def _score_failed(turns: pd.DataFrame) -> pd.Series:
    """Boolean mask [rows]: turns whose answer could not be scored (``score_error`` set)."""
    return turns["score_error"].map(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)))


def questions_table(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, method, suite, temperature, question_id): turns, errors, Σ new tokens, Σ wall time,
    the question's tokens/s and tau (NaN when the question has an error turn or is incomplete), its quality score
    (NaN when an answer failed to score), whether it is complete and how many of its answers failed to score."""
    measured, complete, score_failed = _measured(turns), _complete(turns), _score_failed(turns)
    rows = []
    for key, q in turns.groupby(QUESTION, dropna=False, sort=False):
        ok = q[measured.loc[q.index]]
        n_score_errors = int(score_failed.loc[q.index].sum())
        rows.append({
            **dict(zip(QUESTION, key)),
            "n_turns": len(ok),
            "n_errors": int((q["status"] != "ok").sum()),
            "new_tokens": int(ok["new_tokens"].sum()) if len(ok) else 0,
            "wall_time_s": float(ok["wall_time_s"].sum()) if len(ok) else 0.0,
            "tokens_per_s": M.tokens_per_second(ok["new_tokens"], ok["wall_time_s"]) if len(ok) else math.nan,
            "tau": M.tau(ok["accept_lengths"]) if len(ok) else math.nan,
            "score": M.quality(ok["score"]) if not n_score_errors else math.nan,
            "complete": bool(complete.loc[q.index].all()),
            "n_score_errors": n_score_errors,
        })
    return pd.DataFrame(rows, columns=[*QUESTION, "n_turns", "n_errors", "new_tokens", "wall_time_s",
                                       "tokens_per_s", "tau", "score", "complete", "n_score_errors"])


def _per_question_tps(questions: pd.DataFrame) -> pd.Series:
    """question_id -> tokens/s [Q] of one group's questions."""
    return pd.Series(questions["tokens_per_s"].to_numpy(dtype=float), index=questions["question_id"].to_numpy())


def _turns_per_question(turns: pd.DataFrame) -> dict[Any, list[list[int]]]:
    """question id -> the accept_lengths of its turns (the input of the per-question τ conventions)."""
    out: dict[Any, list[list[int]]] = {}
    for qid, lengths in zip(turns["question_id"], turns["accept_lengths"]):
        out.setdefault(qid, []).append(list(lengths))
    return out


def _lists(col: pd.Series) -> list[list[int]]:
    """A list column as plain lists, None (not recorded) as []."""
    return [list(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else [] for v in col]


def _max_depth(turns: pd.DataFrame) -> int:
    """Deepest draft of any turn in the table (0 when no method drafts): how many acc@i columns the summary has."""
    return max((max(d) for d in _lists(turns["draft_depths"]) if d), default=0)


def _lossless_flag(values: pd.Series) -> bool | None:
    """A label's declared lossless flag from its records (False if any record says so; None if none says)."""
    present = [bool(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return all(present) if present else None


def summary_table(turns: pd.DataFrame, baseline_label: str = "vanilla", n_boot: int = 2000,
                  seed: int = 0) -> pd.DataFrame:
    """One row per (label, method, suite, temperature) with every headline number, all from
    :mod:`harness.measure.metrics`.

    Columns: n_questions (measured), n_turns (measured), n_errors (error records), n_incomplete (questions with a
    missing turn record, left out), n_score_errors (answers whose scorer failed); tokens_per_s (mean over
    questions), tau, tau_script (the EAGLE/Jakiro scripts' convention,
    :func:`harness.measure.metrics.tau_eagle_script`); speedup (ratio of means) and speedup_gmean with its bootstrap CI
    (speedup_ci_lo/hi) vs ``baseline_label`` on the same suite, temperature and questions (NaN without a
    baseline); quality (NaN when n_score_errors > 0); lossless_share (temperature 0 only, vs the baseline's
    output ids); energy_per_token_j;
    divergent_turns and divergent_ties (temperature 0: turns that differ from the baseline, and how many of them
    are near ties within the dtype's noise); peak_memory_bytes (CUDA peak allocated, else RSS) and
    peak_reserved_bytes; acc@i and acc_cond@i for i = 1..deepest draft in the table (NaN for methods that never
    draft); lossless (the method's declared flag); runtime, baseline (the label the speed-up, lossless share and
    divergence are measured against: the baseline of the row's runtime, :func:`baseline_labels`),
    speedup_vs_eager (ratio of means vs the eager ``baseline_label``: for a compiled row, its speed-up over eager
    decoding) and eager_match_share (temperature 0: share of turns whose output equals the eager baseline's),
    compile_s (the most compile seconds any of the label's records reports: warm-up, never inside a turn's wall
    time) and turn_compile_s (compilation left inside measured turns, normally 0).
    """
    questions = questions_table(turns)
    measured = _measured(turns)
    score_failed = _score_failed(turns)
    depth = _max_depth(turns)
    runtimes, bases = label_runtimes(turns), baseline_labels(turns, baseline_label)
    rows = []

    def at(frame: pd.DataFrame, label: str, suite, temp) -> pd.DataFrame:
        return frame[(frame["label"] == label) & (frame["suite"] == suite) & (frame["temperature"] == temp)]

    for key, g in turns.groupby(GROUP, dropna=False, sort=False):
        label, _, suite, temp = key
        ok = g[measured.loc[g.index]]
        base = bases.get(label, baseline_label)
        q = at(questions, label, suite, temp)
        base_q = at(questions, base, suite, temp)
        base_ok = at(turns[measured], base, suite, temp)
        eager_q = at(questions, baseline_label, suite, temp)
        eager_ok = at(turns[measured], baseline_label, suite, temp)
        tps, base_tps = _per_question_tps(q), _per_question_tps(base_q)
        gmean, lo, hi = M.speedup_geomean(tps, base_tps, n_boot=n_boot, seed=seed)
        accepted, depths = _lists(ok["accepted_drafts"]), _lists(ok["draft_depths"])
        rss = ok["peak_rss_bytes"] if ok["peak_rss_bytes"].notna().any() else ok["rss_bytes"]
        row = {
            **dict(zip(GROUP, key)),
            "n_questions": int(q["tokens_per_s"].notna().sum()),
            "n_turns": len(ok),
            "n_errors": int((g["status"] != "ok").sum()),
            "n_incomplete": int((~q["complete"]).sum()),
            "n_score_errors": int(score_failed.loc[g.index].sum()),
            "tokens_per_s": M.mean_tokens_per_second(tps),
            "tau": M.tau(_lists(ok["accept_lengths"])),
            "tau_script": M.tau_eagle_script(_turns_per_question(ok)),
            "speedup": M.speedup_ratio_of_means(tps, base_tps),
            "speedup_gmean": gmean,
            "speedup_ci_lo": lo,
            "speedup_ci_hi": hi,
            "quality": M.quality(ok["score"]) if not score_failed.loc[g.index].any() else math.nan,
            "lossless_share": (M.lossless_share(ok.to_dict("records"), base_ok.to_dict("records"))
                               if float(temp) == 0.0 else math.nan),
            **_divergence_counts(ok, base_ok, temp),
            "energy_per_token_j": M.energy_per_token(list(ok["energy_j"]), list(ok["new_tokens"])),
            "peak_memory_bytes": M.peak_memory(list(rss), list(ok["cuda_peak_allocated_bytes"])),
            "peak_reserved_bytes": M.peak_reserved(list(ok["cuda_peak_reserved_bytes"])),
            "lossless": _lossless_flag(g["lossless"]),
            "runtime": runtimes.get(label, "eager"),
            "baseline": base,
            "speedup_vs_eager": M.speedup_ratio_of_means(tps, _per_question_tps(eager_q)),
            "eager_match_share": (M.lossless_share(ok.to_dict("records"), eager_ok.to_dict("records"))
                                  if float(temp) == 0.0 else math.nan),
            "compile_s": _max_float(g["compile_s"]),
            "turn_compile_s": _sum_float(ok["turn_compile_s"]),
        }
        acc = M.acceptance_per_position(accepted, depths, max_pos=depth)
        cond = M.conditional_acceptance_per_position(accepted, depths, max_pos=depth)
        row.update({f"acc@{i + 1}": v for i, v in enumerate(acc)})
        row.update({f"acc_cond@{i + 1}": v for i, v in enumerate(cond)})
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("quality", "energy_per_token_j", "peak_memory_bytes", "peak_reserved_bytes"):
        if col in df.columns:
            df[col] = df[col].astype(float)
    return df


def _max_float(col: pd.Series) -> float:
    values = pd.to_numeric(col, errors="coerce").dropna()
    return float(values.max()) if len(values) else math.nan


def _sum_float(col: pd.Series) -> float:
    values = pd.to_numeric(col, errors="coerce").dropna()
    return float(values.sum()) if len(values) else math.nan


def category_table(turns: pd.DataFrame, baseline_label: str = "vanilla") -> pd.DataFrame:
    """The leaderboard layout's numbers: one row per (label, method, suite, temperature, category) for suites whose
    questions carry two or more categories (e.g. spec_bench's six tasks): n_questions, speedup (ratio of mean
    tokens/s vs ``baseline_label`` on the same questions of that category) and tau, from
    :mod:`harness.measure.metrics`."""
    cols = [*GROUP, "category", "n_questions", "speedup", "tau"]
    if turns.empty or turns["category"].isna().all():
        return pd.DataFrame(columns=cols)
    questions = questions_table(turns)
    cat_of = turns.groupby(["suite", "question_id"], sort=False)["category"].first()
    questions["category"] = [cat_of.get((s, q)) for s, q in zip(questions["suite"], questions["question_id"])]
    measured = _measured(turns)
    bases = baseline_labels(turns, baseline_label)
    rows = []
    for suite, sq in questions.groupby("suite", sort=False):
        cats = [c for c in dict.fromkeys(sq["category"]) if c is not None]
        if len(cats) < 2:
            continue
        for (label, method, temp), g in sq.groupby(["label", "method", "temperature"], sort=False, dropna=False):
            base = sq[(sq["label"] == bases.get(label, baseline_label)) & (sq["temperature"] == temp)]
            for cat in cats:
                q, b = g[g["category"] == cat], base[base["category"] == cat]
                ids = set(q["question_id"])
                ok = turns[measured & (turns["label"] == label) & (turns["suite"] == suite)
                           & (turns["temperature"] == temp) & turns["question_id"].isin(ids)]
                rows.append({"label": label, "method": method, "suite": suite, "temperature": temp,
                             "category": cat, "n_questions": int(q["tokens_per_s"].notna().sum()),
                             "speedup": M.speedup_ratio_of_means(_per_question_tps(q), _per_question_tps(b)),
                             "tau": M.tau(_lists(ok["accept_lengths"]))})
    return pd.DataFrame(rows, columns=cols)


def category_markdown(categories: pd.DataFrame, summary: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """Markdown pivot per (suite, temperature): labels × categories plus the suite's overall, cells "speed-up× / τ"
    (Spec-Bench's leaderboard layout for the spec_bench suite). Empty text when no suite has categories."""
    if categories.empty:
        return ""
    parts = []
    for (suite, temp), at in categories.groupby(["suite", "temperature"], sort=False):
        cats = list(dict.fromkeys(at["category"]))
        lines = [f"**{suite}, temperature {temp:g}, per category** — speed-up vs `{baseline_label}` × / τ", "",
                 "| method | " + " | ".join(map(str, cats)) + " | overall |", "|---|" + "---:|" * (len(cats) + 1)]
        for label in _row_order(at, baseline_label):
            rows = at[at["label"] == label].set_index("category")
            overall = summary[(summary["label"] == label) & (summary["suite"] == suite)
                              & (summary["temperature"] == temp)]
            cells = [_cell(rows.at[c, "speedup"], rows.at[c, "tau"]) if c in rows.index else "" for c in cats]
            cells.append(_cell(overall["speedup"].iloc[0], overall["tau"].iloc[0]) if len(overall) else "")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _divergence_counts(ok: pd.DataFrame, base_ok: pd.DataFrame, temp: float) -> dict[str, float]:
    """``divergent_turns`` (turns whose output differs from the baseline's) and how many of them are near ties
    (``divergent_ties``, :func:`harness.measure.metrics.divergence`); NaN at temperature > 0."""
    if float(temp) != 0.0:
        return {"divergent_turns": math.nan, "divergent_ties": math.nan}
    found = M.divergences(ok.to_dict("records"), base_ok.to_dict("records"))
    return {"divergent_turns": float(len(found)), "divergent_ties": float(sum(d["kind"] == "tie" for d in found))}


def divergence_table(turns: pd.DataFrame, baseline_label: str = "vanilla") -> pd.DataFrame:
    """One row per measured temperature-0 turn whose output differs from its baseline's (the baseline label of its
    runtime, :func:`baseline_labels`): label, method,
    suite, question_id, turn, seed, the first differing position, both tokens, both runs' logit margins there,
    the dtype's tie tolerance and the kind ("tie" within rounding noise / "disagreement" / "unknown"), from
    :func:`harness.measure.metrics.divergences`."""
    columns = ["label", "method", "suite", "question_id", "turn", "seed", "position", "token", "baseline_token",
               "method_margin", "baseline_margin", "tolerance", "kind"]
    ok = turns[_measured(turns) & (turns["temperature"].astype(float) == 0.0)]
    bases = baseline_labels(turns, baseline_label)
    rows = []
    for (label, method), g in ok.groupby(["label", "method"], sort=False):
        base = bases.get(label, baseline_label)
        if label == base:
            continue
        for d in M.divergences(g.to_dict("records"), ok[ok["label"] == base].to_dict("records")):
            rows.append({"label": label, "method": method, **d})
    return pd.DataFrame(rows, columns=columns)


def divergence_note(divergence: pd.DataFrame) -> str:
    """Markdown lines under the paper table when some greedy turn differs from the baseline (empty otherwise)."""
    if divergence.empty:
        return ""
    lines = ["", "**Greedy divergence from the baseline** (first differing token; logit margin = top-1 minus top-2 "
                 "of the target in each run; a tie is within the dtype's rounding noise, see "
                 "`harness/measure/metrics.py` `tie_tolerance`):", ""]
    for label, g in divergence.groupby("label", sort=False):
        counts = g["kind"].value_counts()
        lines.append(f"- {label}: {len(g)} turn(s) differ: {int(counts.get('tie', 0))} tie(s) within noise, "
                     f"{int(counts.get('disagreement', 0))} disagreement(s), {int(counts.get('unknown', 0))} "
                     "without margins")
    return "\n".join(lines) + "\n"


def histogram_table(turns: pd.DataFrame) -> pd.DataFrame:
    """Tidy accepted-length histogram: (label, method, suite, temperature, accept_length, steps), verification
    steps of measured turns only (:func:`harness.measure.metrics.accept_length_histogram`)."""
    measured = _measured(turns)
    rows = []
    for key, g in turns[measured].groupby(GROUP, dropna=False, sort=False):
        for length, count in M.accept_length_histogram(_lists(g["accept_lengths"])).items():
            rows.append({**dict(zip(GROUP, key)), "accept_length": length, "steps": count})
    return pd.DataFrame(rows, columns=[*GROUP, "accept_length", "steps"])


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec) + unit


def _cell(speedup: float | None, tau: float | None) -> str:
    """A paper-table cell. Example: _cell(2.413, 3.517) -> "2.41× / 3.52"; _cell(nan, 3.5) -> "n/a / 3.50"."""
    return f"{_fmt(speedup, '.2f', '×')} / {_fmt(tau, '.2f')}"


def _row_order(summary: pd.DataFrame, baseline_label: str) -> list[str]:
    labels = list(dict.fromkeys(summary["label"]))
    bases = set(summary["baseline"]) if "baseline" in summary else set()
    return sorted(labels, key=lambda lab: lab not in bases | {baseline_label})


def _runtimes(summary: pd.DataFrame) -> list[str]:
    """The runtimes of a summary's rows, eager first (["eager"] for summaries made before runtimes existed)."""
    if "runtime" not in summary:
        return ["eager"]
    found = list(dict.fromkeys(r if isinstance(r, str) else "eager" for r in summary["runtime"]))
    return sorted(found, key=lambda r: r != "eager")


def paper_table(summary: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """Markdown pivot: labels (rows) × suites (columns), cells "speed-up× / tau", plus an equal-weight mean
    column (:func:`harness.measure.metrics.suite_mean`); one table per temperature, and per runtime when the run
    measured another runtime than eager: such a table compares its labels with the baseline of its own runtime and
    adds the mean speed-up over the eager baseline (so runtimes are never mixed in one column). Labels whose method
    is not lossless carry "†" and a footnote. Example cell: "2.41× / 3.52"; "n/a / 3.52" when there is no
    baseline."""
    if summary.empty:
        return "_No measured turns._\n"
    suites = list(dict.fromkeys(summary["suite"]))
    runtimes = _runtimes(summary)
    lossy = False
    parts = []
    for temp in sorted(summary["temperature"].dropna().unique()):
        for runtime in runtimes:
            at = summary[summary["temperature"] == temp]
            if "runtime" in at:
                at = at[at["runtime"].fillna("eager") == runtime]
            if at.empty:
                continue
            base = at["baseline"].iloc[0] if "baseline" in at else baseline_label
            head = f"**Temperature {temp:g}**" if runtimes == ["eager"] else \
                f"**Temperature {temp:g}, runtime {runtime}**"
            versus = runtime != "eager"
            lines = [f"{head} — cells: speed-up vs `{base}` (ratio of mean tokens/s on the same questions) × / τ "
                     "(mean accepted length per target forward, bonus token included)"
                     + (f"; last column: mean speed-up vs eager `{baseline_label}`" if versus else ""), "",
                     "| method | " + " | ".join(suites) + " | mean |" + (" vs eager |" if versus else ""),
                     "|---|" + "---:|" * (len(suites) + 1 + versus)]
            for label in _row_order(at, baseline_label):
                rows = at[at["label"] == label]
                mark = ""
                if rows["lossless"].eq(False).any():
                    mark, lossy = " †", True
                cells = []
                for suite in suites:
                    r = rows[rows["suite"] == suite]
                    cells.append(_cell(r["speedup"].iloc[0], r["tau"].iloc[0]) if len(r) else "")
                mean = _cell(M.suite_mean(rows["speedup"]), M.suite_mean(rows["tau"]))
                extra = f" {_fmt(M.suite_mean(rows['speedup_vs_eager']), '.2f', '×')} |" if versus else ""
                lines.append(f"| {label}{mark} | " + " | ".join(cells) + f" | {mean} |" + extra)
            if versus:
                lines += ["", _compile_note(at)]
            parts.append("\n".join(lines))
    text = "\n\n".join(parts) + "\n"
    if lossy:
        text += ("\n† not lossless: its output is not guaranteed to equal the target's greedy output (T = 0) or "
                 "to follow the target's distribution (T > 0).\n")
    return text


def _compile_note(rows: pd.DataFrame) -> str:
    """One line under a compiled runtime's table: each label's compile time (warm-up, outside every turn's wall time)
    and, if any, compilation left inside measured turns. Example: "Compilation (warm-up, not in any turn's time):
    vanilla@compiled 61.2 s, pld@compiled 75.0 s." """
    parts, inside = [], []
    for label, g in rows.groupby("label", sort=False):
        parts.append(f"{label} {_fmt(_max_float(g['compile_s']), '.1f', ' s')}")
        left = _sum_float(g["turn_compile_s"])
        if left == left and left > 0:
            inside.append(f"{label} {left:.1f} s")
    text = "Compilation (warm-up, not in any turn's time): " + ", ".join(parts) + "."
    if inside:
        text += " Still inside measured turns (their speed is not steady-state): " + ", ".join(inside) + "."
    return text


def records_note(found: RecordsRead, run_dir: Path, summary: pd.DataFrame | None = None) -> str:
    """A Markdown line on what reading the records left out (unreadable lines, superseded attempts, incomplete
    questions, answers that failed to score); "" when nothing was. Example: "- records: 1 unreadable line
    skipped (records.jsonl:5); 2 incomplete questions left out"."""
    parts = []
    if found.bad_lines:
        where = [b.split(": ", 1)[0].removeprefix(f"{run_dir}{os.sep}") for b in found.bad_lines]
        more = f", and {len(where) - 5} more" if len(where) > 5 else ""
        s = "s" if len(where) > 1 else ""
        parts.append(f"{len(where)} unreadable line{s} skipped ({', '.join(where[:5])}{more})")
    if found.superseded:
        parts.append(f"{found.superseded} records of superseded attempts left out")
    if found.incomplete:
        s = "s" if len(found.incomplete) > 1 else ""
        parts.append(f"{len(found.incomplete)} incomplete question{s} left out (resume the run to finish them)")
    if summary is not None and "n_score_errors" in summary and summary["n_score_errors"].sum():
        parts.append(f"{int(summary['n_score_errors'].sum())} answers failed to score (score_error); the quality of "
                     "their groups is n/a")
    return f"- records: {'; '.join(parts)}\n" if parts else ""


def provenance_header(manifest: Mapping[str, Any], turns: pd.DataFrame) -> str:
    """A few Markdown lines saying which code, libraries, device and model produced the numbers."""
    prov = provenance(manifest)
    if not manifest:
        return f"_No {MANIFEST_FILE} in the run directory: provenance unknown._\n"

    def one(col: str) -> str:
        vals = [str(v) for v in dict.fromkeys(turns[col].dropna())] if col in turns else []
        return ", ".join(vals) or "?"

    dirty = " (dirty)" if prov["git_dirty"] else ""
    return "\n".join([
        f"- run `{prov['run_id'] or one('run_id')}`, {prov['created'] or '?'}; git `{prov['git_hash'] or '?'}`{dirty}",
        f"- target {one('target')}, dtype {one('dtype')}, device {prov['device_name'] or one('device')}",
        f"- python {prov['python_version'] or '?'}, torch {prov['torch_version'] or '?'}, "
        f"transformers {prov['transformers_version'] or '?'}",
    ]) + "\n"


def _series_name(label: str, temperature: float, temperatures: Sequence[float]) -> str:
    return label if len(temperatures) <= 1 else f"{label} (T={temperature:g})"


def _style_series(ax, n: int) -> None:
    """Distinct colours for up to 20 series (the default cycle repeats after 10, so an ablation's 13 entries would
    share colours)."""
    if n > 10:
        ax.set_prop_cycle(color=[matplotlib.colormaps["tab20"](i % 20) for i in range(n)])


def _legend(ax, n: int) -> None:
    """The legend inside the axes for a few series; beside them for many, where it would hide bars and lines (the
    figure is then saved with ``bbox_inches="tight"`` so that it is not cut off)."""
    if n > 6:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize="small")


def _grouped_bars(summary: pd.DataFrame, value: str, ylabel: str, title: str, path: Path,
                  hline: float | None = None) -> Path | None:
    """Bars of ``summary[value]``: suites on the x axis, one bar per (label, temperature). None if no value."""
    data = summary[summary[value].notna()]
    if data.empty:
        return None
    suites = list(dict.fromkeys(data["suite"]))
    temps = sorted(data["temperature"].unique())
    series = list(dict.fromkeys(zip(data["label"], data["temperature"])))
    fig = Figure(figsize=(max(6.0, 1.2 * len(suites) * max(len(series), 2) / 2), 4.0))
    ax = fig.subplots()
    _style_series(ax, len(series))
    width = 0.8 / len(series)
    x = np.arange(len(suites))                                             # [S]
    for i, (label, temp) in enumerate(series):
        rows = data[(data["label"] == label) & (data["temperature"] == temp)].set_index("suite")
        heights = [rows[value].get(s, np.nan) for s in suites]              # [S]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, heights, width, label=_series_name(label, temp, temps))
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, suites)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _legend(ax, len(series))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_speedup(summary: pd.DataFrame, path: Path, baseline_label: str = "vanilla") -> Path | None:
    """Grouped bars of the speed-up (ratio of means) per suite; None when there is no baseline. With several
    runtimes each label is compared with its own runtime's baseline (the summary's ``baseline`` column)."""
    versus = baseline_label if _runtimes(summary) == ["eager"] else f"{baseline_label} of the same runtime"
    return _grouped_bars(summary, "speedup", f"speed-up vs {versus} (×)", "Speed-up per suite", path, 1.0)


def plot_tau(summary: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars of tau per suite."""
    return _grouped_bars(summary, "tau", "τ (tokens per target forward)", "Mean accepted length per suite", path,
                         1.0)


def plot_tokens_per_s(summary: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars of mean tokens/s per suite."""
    return _grouped_bars(summary, "tokens_per_s", "tokens / s (mean over questions)", "Throughput per suite", path)


def _drafting_labels(turns: pd.DataFrame) -> list[tuple[str, float]]:
    """(label, temperature) pairs of measured turns that drafted at least once (vanilla-like methods excluded)."""
    ok = turns[_measured(turns)]
    out = []
    for (label, temp), g in ok.groupby(["label", "temperature"], sort=False):
        if any(_lists(g["draft_depths"])):
            out.append((label, temp))
    return out


def plot_accept_histogram(turns: pd.DataFrame, path: Path) -> Path | None:
    """Share of verification steps by tokens appended (accepted + bonus), per drafting method, all suites pooled."""
    series = _drafting_labels(turns)
    if not series:
        return None
    ok = turns[_measured(turns)]
    temps = sorted({t for _, t in series})
    hists = {s: M.accept_length_histogram(_lists(ok[(ok["label"] == s[0]) & (ok["temperature"] == s[1])]
                                                 ["accept_lengths"])) for s in series}
    lengths = sorted({n for h in hists.values() for n in h})
    fig = Figure(figsize=(max(6.0, 0.6 * len(lengths) * len(series)), 4.0))
    ax = fig.subplots()
    _style_series(ax, len(series))
    width = 0.8 / len(series)
    x = np.arange(len(lengths))                                            # [L]
    for i, s in enumerate(series):
        total = sum(hists[s].values())
        shares = [hists[s].get(n, 0) / total if total else 0.0 for n in lengths]  # [L]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, shares, width, label=_series_name(*s, temps))
    ax.set_xticks(x, [str(n) for n in lengths])
    ax.set_xlabel("tokens appended per verification step (accepted drafts + 1)")
    ax.set_ylabel("share of steps")
    ax.set_title("Accepted-length histogram (all suites)")
    _legend(ax, len(series))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_acceptance_per_position(turns: pd.DataFrame, path: Path) -> Path | None:
    """Per-position acceptance rate (harness.measure.metrics.acceptance_per_position), one line per drafting method."""
    series = _drafting_labels(turns)
    if not series:
        return None
    ok = turns[_measured(turns)]
    temps = sorted({t for _, t in series})
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    _style_series(ax, len(series))
    for label, temp in series:
        g = ok[(ok["label"] == label) & (ok["temperature"] == temp)]
        rates = M.acceptance_per_position(_lists(g["accepted_drafts"]), _lists(g["draft_depths"]))
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=_series_name(label, temp, temps))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance per draft position (all suites)")
    _legend(ax, len(series))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _json_cell(v: Any) -> Any:
    """Lists / arrays / dicts as JSON text, so a CSV cell round-trips; everything else unchanged."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (list, tuple, dict)) else v


def _for_parquet(df: pd.DataFrame) -> pd.DataFrame:
    """Cells Arrow cannot type as JSON text: dicts (e.g. an ``error`` object; Arrow cannot mix dicts and None) and
    lists in a column that also holds scalars (e.g. ``opt.tree``: a tree name for one method, rank paths for
    another)."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype != object:
            continue
        kinds = {type(v) for v in out[col] if v is not None and not (isinstance(v, float) and v != v)}
        if dict in kinds or (list in kinds and len(kinds) > 1):
            out[col] = out[col].map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v)
    return out


def _write_table(df: pd.DataFrame, stem: Path) -> dict[str, Path]:
    """``stem.parquet`` and ``stem.csv`` (list columns JSON-encoded in the CSV)."""
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    _for_parquet(df).to_parquet(parquet, index=False)
    df.map(_json_cell).to_csv(csv, index=False)
    return {f"{stem.name}_parquet": parquet, f"{stem.name}_csv": csv}


def write_report(run_dir: str | Path, baseline_label: str | None = None) -> dict[str, Path]:
    """Rebuild ``tables/`` and ``plots/`` of a run directory from its records; returns name -> path written.

    The baseline is ``baseline_label``, else the manifest's ``config.baseline``, else "vanilla". Plots that have
    nothing to show (a speed-up without a baseline, acceptance without a drafting method) are not written.
    """
    run_dir = Path(run_dir)
    if not record_files(run_dir):
        raise FileNotFoundError(f"{run_dir / RECORDS_FILE}: no records; is {run_dir} a draftbench run directory?")
    manifest = read_manifest(run_dir) or {}  # no manifest: the report says provenance unknown
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    baseline = baseline_label or config.get("baseline") or "vanilla"
    found = load_records(run_dir)
    records = found.records
    if not records:
        raise ValueError(f"{run_dir / RECORDS_FILE}: contains no complete record")

    turns = turns_table(records, manifest)
    questions = with_knobs(questions_table(turns), turns)   # one opt.<knob> column per ablated option
    summary = with_knobs(summary_table(turns, baseline_label=baseline), turns)
    tables, plots = run_dir / "tables", run_dir / "plots"
    tables.mkdir(exist_ok=True)
    plots.mkdir(exist_ok=True)
    paths: dict[str, Path] = {}
    paths |= _write_table(turns, tables / "turns")
    paths |= _write_table(questions, tables / "questions")
    paths |= _write_table(summary, tables / "summary")
    categories = category_table(turns, baseline)
    if not categories.empty:
        categories.to_csv(tables / "categories.csv", index=False)
        paths["categories_csv"] = tables / "categories.csv"
    histogram_table(turns).to_csv(tables / "accept_hist.csv", index=False)
    paths["accept_hist_csv"] = tables / "accept_hist.csv"
    divergence = divergence_table(turns, baseline)
    divergence.to_csv(tables / "divergence.csv", index=False)
    paths["divergence_csv"] = tables / "divergence.csv"
    md = run_dir / SUMMARY_MD
    md.write_text(f"# draftbench results: {run_dir.name}\n\n{provenance_header(manifest, turns)}"
                  f"{records_note(found, run_dir, summary)}\n{paper_table(summary, baseline)}"
                  f"{divergence_note(divergence)}\n{ablation_markdown(turns[_measured(turns)], baseline)}"
                  + (f"\n{category_markdown(categories, summary, baseline)}" if not categories.empty else ""),
                  encoding="utf-8")
    paths["summary_md"] = md
    for name, written in (
        ("speedup", plot_speedup(summary, plots / "speedup.png", baseline)),
        ("tau", plot_tau(summary, plots / "tau.png")),
        ("tokens_per_s", plot_tokens_per_s(summary, plots / "tokens_per_s.png")),
        ("accept_hist", plot_accept_histogram(turns, plots / "accept_hist.png")),
        ("acceptance", plot_acceptance_per_position(turns, plots / "acceptance.png")),
    ):
        if written is not None:
            paths[f"plot_{name}"] = written
    paths |= write_ablation(run_dir, turns[_measured(turns)], baseline)
    paths["report_html"] = write_html_report(run_dir, manifest, turns, _measured(turns), questions, summary,
                                             paper_table(summary, baseline), baseline,
                                             {k: v for k, v in paths.items() if k.startswith("plot_")})
    return paths

