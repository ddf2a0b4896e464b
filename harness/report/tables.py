"""From a run's records to tidy tables: one row per turn, per question, per (label, method, suite, temperature),
per category, per divergent turn and per accepted length. The report (:mod:`harness.report.report`) writes them;
``draftbench compare`` and the comparison with a published table reduce a run with the same functions.

Options that differ between entries of one method (ablation knobs) get their own ``opt.<name>`` column in the
questions and summary tables, taken from the records' ``method_options`` (:func:`harness.report.ablation.with_knobs`).

Every number is computed by a :mod:`harness.measure.metrics` function; this module only selects and groups rows.

Which turns are measured (:func:`measured_rows`): a question with any error turn is left out of every measurement
(its other turns would give a partial question), and is counted in ``n_errors``; so is an incomplete question (a
turn's record is missing, :mod:`harness.measure.records`), counted in ``n_incomplete``. A question's tokens/s pools
all its turns over seeds and repeats. Speed-ups compare a label with the baseline label on the same suite,
temperature and questions; a label measured under another runtime than eager (``runtime`` of its records, e.g.
``eagle2@compiled``) is compared with the baseline of its own runtime (``vanilla@compiled``) when the run has one
(:func:`harness.measure.records.baseline_labels`), and ``speedup_vs_eager`` gives every label's ratio to the eager
baseline as well. Quality is the mean score of the measured questions, and NaN when any answer of the group failed
to score (``n_score_errors``): a mean over the answers that happened to score would look like a result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from harness.measure import acceptance as ACC
from harness.measure import headroom as HR
from harness.measure import metrics as M
from harness.measure.records import baseline_labels, label_engines, label_runtimes, runtime_label

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
# columns every turns table derives from a turn's record
TURN_DERIVED = ("tokens_per_s", "tau_turn", "draft_acceptance_rate_turn", "drafted_per_step_turn")
# nested dict fields of a record -> prefix of their dotted columns
# (an engine turn's ``engine_options`` sit beside the method's options, so that a sweep over them gives knobs)
FLATTENED = {"method_options": "opt", "engine_options": "opt.engine_options", "timings": "timing",
             "counters": "counter", "speculation_off": "spec_off"}

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
    row["tau_turn"] = ACC.tau([lengths]) if ok and lengths is not None else math.nan
    accepted, drafted, steps = ACC.draft_counts(rec.get("accepted_drafts"), rec.get("draft_depths"),
                                              rec.get("engine_counters")) if ok else (None, None, None)
    row["draft_acceptance_rate_turn"] = ACC.draft_acceptance_rate([accepted], [drafted])
    row["drafted_per_step_turn"] = ACC.drafted_per_step([drafted], [steps])
    return row


def turns_table(records: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One tidy row per turn record: the record's fields, ``method_options`` / ``timings`` / ``counters``
    flattened to ``opt.*`` / ``timing.*`` / ``counter.*``, run provenance from the manifest (``run_id``,
    ``git_hash``, ``device_name``, ``torch_version``, ...), and derived ``tokens_per_s`` and ``tau_turn``
    (NaN on error rows). Provenance and derived columns come first, then the record fields, then the turn's
    ``draft_acceptance_rate_turn`` and ``drafted_per_step_turn`` (NaN when it drafted nothing,
    :func:`harness.measure.acceptance.draft_counts`)."""
    prov = provenance(manifest or {})
    rows = [_turn_row(r, prov) for r in records]
    df = pd.DataFrame(rows)
    for col in (*PROVENANCE, *BASE_COLUMNS, *TURN_DERIVED):
        if col not in df.columns:
            df[col] = None
    for col in TURN_DERIVED:
        df[col] = df[col].astype(float)
    first = [*PROVENANCE, *BASE_COLUMNS[1:], "tokens_per_s", "tau_turn"]
    rest = [c for c in df.columns if c not in first and c not in TURN_DERIVED]
    return df[[*first, *rest, *TURN_DERIVED[2:]]]


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


def measured_rows(turns: pd.DataFrame) -> pd.Series:
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
    measured, complete, score_failed = measured_rows(turns), _complete(turns), _score_failed(turns)
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
            "tau": ACC.tau(ok["accept_lengths"]) if len(ok) else math.nan,
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


def lists(col: pd.Series) -> list[list[int]]:
    """A list column as plain lists, None (not recorded) as []."""
    return [list(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else [] for v in col]


def max_depth(turns: pd.DataFrame) -> int:
    """Deepest draft of any turn in the table (0 when no method drafts): how many acc@i columns the summary has."""
    return max((max(d) for d in lists(turns["draft_depths"]) if d), default=0)


def draft_totals(turns: pd.DataFrame) -> pd.DataFrame:
    """Per row of a turns table, the turn's ``accepted_drafts_total``, ``drafted_tokens`` and ``draft_steps``
    (:func:`harness.measure.acceptance.draft_counts`: an engine's counters where its records carry them; NaN where a
    turn has none), and ``drafts_cut``: accepted drafts its terminal step lost to a cut at EOS or the budget
    (Σ accepted_drafts − Σ :func:`harness.measure.acceptance.drafts_before_cut`)."""
    counters = turns["engine_counters"] if "engine_counters" in turns else [None] * len(turns)
    rows = []
    for acc, depth, lengths, engine in zip(lists(turns["accepted_drafts"]), lists(turns["draft_depths"]),
                                           lists(turns["accept_lengths"]), counters):
        engine = engine if isinstance(engine, dict) else None
        a, d, n = ACC.draft_counts(acc, depth, engine)
        rows.append({"accepted_drafts_total": a, "drafted_tokens": d, "draft_steps": n,
                     "drafts_cut": sum(acc) - sum(ACC.drafts_before_cut(lengths, acc)) if depth else None})
    return pd.DataFrame(rows, index=turns.index, columns=["accepted_drafts_total", "drafted_tokens", "draft_steps",
                                                          "drafts_cut"], dtype=float)


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
    :func:`harness.measure.acceptance.tau_eagle_script`); speedup (ratio of means) and speedup_gmean with its
    bootstrap CI (speedup_ci_lo/hi) vs ``baseline_label`` on the same suite, temperature and questions (NaN without a
    baseline); quality (NaN when n_score_errors > 0); lossless_share (temperature 0 only, vs the baseline's
    output ids); energy_per_token_j;
    divergent_turns and divergent_ties (temperature 0: turns that differ from the baseline, and how many of them
    are near ties within the dtype's noise); deployable (False for a bound such as the ``oracle``,
    :func:`deployable_labels`); peak_memory_bytes (CUDA peak allocated, else RSS) and
    peak_reserved_bytes; acc@i and acc_cond@i for i = 1..deepest draft in the table (NaN for methods that never
    draft); draft_acceptance_rate (accepted / drafted tokens), drafted_per_step (per drafting step),
    mean_acceptance_length (vLLM's and AIPerf's: 1 + accepted / drafting steps) and drafts_cut (accepted drafts
    that terminal steps lost to a cut at EOS or the budget), pooled over the measured turns (:func:`draft_totals`,
    NaN for methods that never draft); lossless (the method's declared flag); runtime; engine (``harness`` or the
    engine that ran the label, :func:`harness.measure.records.label_engines`) and acceptance_from (what its
    acceptance counts, :func:`acceptance_sources`); baseline (the label the
    speed-up, lossless share and divergence are measured against: the baseline of the row's runtime,
    :func:`baseline_labels`),
    speedup_vs_eager (ratio of means vs the eager ``baseline_label``: for a compiled row, its speed-up over eager
    decoding) and eager_match_share (temperature 0: share of turns whose output equals the eager baseline's),
    compile_s (the most compile seconds any of the label's records reports: warm-up, never inside a turn's wall
    time) and turn_compile_s (compilation left inside measured turns, normally 0).
    """
    questions = questions_table(turns)
    measured = measured_rows(turns)
    score_failed = _score_failed(turns)
    depth = max_depth(turns)
    runtimes, bases = label_runtimes(turns), baseline_labels(turns, baseline_label)
    engines, sources = label_engines(turns), acceptance_sources(turns)
    deployable = deployable_labels(turns)
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
        accepted, depths = lists(ok["accepted_drafts"]), lists(ok["draft_depths"])
        rss = ok["peak_rss_bytes"] if ok["peak_rss_bytes"].notna().any() else ok["rss_bytes"]
        row = {
            **dict(zip(GROUP, key)),
            "n_questions": int(q["tokens_per_s"].notna().sum()),
            "n_turns": len(ok),
            "n_errors": int((g["status"] != "ok").sum()),
            "n_incomplete": int((~q["complete"]).sum()),
            "n_score_errors": int(score_failed.loc[g.index].sum()),
            "tokens_per_s": M.mean_tokens_per_second(tps),
            "tau": ACC.tau(lists(ok["accept_lengths"])),
            "tau_script": ACC.tau_eagle_script(_turns_per_question(ok)),
            "speedup": M.speedup_ratio_of_means(tps, base_tps),
            "speedup_gmean": gmean,
            "speedup_ci_lo": lo,
            "speedup_ci_hi": hi,
            "quality": M.quality(ok["score"]) if not score_failed.loc[g.index].any() else math.nan,
            "lossless_share": (M.lossless_share(ok.to_dict("records"), base_ok.to_dict("records"))
                               if float(temp) == 0.0 else math.nan),
            **_divergence_counts(ok, base_ok, temp),
            "energy_per_token_j": HR.energy_per_token(list(ok["energy_j"]), list(ok["new_tokens"])),
            "peak_memory_bytes": M.peak_memory(list(rss), list(ok["cuda_peak_allocated_bytes"])),
            "peak_reserved_bytes": M.peak_reserved(list(ok["cuda_peak_reserved_bytes"])),
            "lossless": _lossless_flag(g["lossless"]),
            "deployable": deployable.get(label, True),
            "runtime": runtimes.get(label, "eager"),
            "engine": engines.get(label, "harness"),
            "acceptance_from": sources.get(label),
            "baseline": base,
            "speedup_vs_eager": M.speedup_ratio_of_means(tps, _per_question_tps(eager_q)),
            "eager_match_share": (M.lossless_share(ok.to_dict("records"), eager_ok.to_dict("records"))
                                  if float(temp) == 0.0 else math.nan),
            "compile_s": max_value(g["compile_s"]),
            "turn_compile_s": sum_values(ok["turn_compile_s"]),
        }
        row.update(_acceptance(ok))
        acc = ACC.acceptance_per_position(accepted, depths, max_pos=depth)
        cond = ACC.conditional_acceptance_per_position(accepted, depths, max_pos=depth)
        row.update({f"acc@{i + 1}": v for i, v in enumerate(acc)})
        row.update({f"acc_cond@{i + 1}": v for i, v in enumerate(cond)})
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("quality", "energy_per_token_j", "peak_memory_bytes", "peak_reserved_bytes"):
        if col in df.columns:
            df[col] = df[col].astype(float)
    return df


def deployable_labels(turns: pd.DataFrame) -> dict[str, bool]:
    """label -> whether it is a method one can deploy: False when its records say ``deployable: false`` (the
    ``oracle``, a bound that knows the target's greedy continuation), True otherwise (the field is absent)."""
    column = turns["deployable"] if "deployable" in turns else [None] * len(turns)
    out: dict[str, bool] = {}
    for label, flag in zip(turns["label"], column):
        out[label] = out.get(label, True) and flag is not False
    return out


HEADROOM_COLUMNS = [
    *GROUP, "deployable", "runtime", "baseline", "n_questions", "tokens_per_s",
    "speedup", "speedup_ci_lo", "speedup_ci_hi",
    "free_draft_speedup", "free_draft_ci_lo", "free_draft_ci_hi",
    "oracle_label", "oracle_speedup", "oracle_ci_lo", "oracle_ci_hi",
    *(f"share_{part}" for part in HR.TIME_PARTS), "rejected_verify_share", "timing_note",
    "energy_per_token_j", "energy_per_accepted_token_j", "energy_source", "cost_per_hour", "cost_per_million_tokens",
]
NO_SPLIT = "n/a: no synchronised draft/verify split (profile off, another engine, or a method without one)"


def _values(ok: pd.DataFrame, column: str) -> list:
    """A column's values as a list, None where missing (and everywhere when the table has no such column)."""
    if column not in ok:
        return [None] * len(ok)
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in ok[column]]


def _synchronised(ok: pd.DataFrame, column: str) -> list:
    """``timing.<part>`` of each turn where the split was measured with a device sync at each mark, else None."""
    return [v if s is True else None for v, s in zip(_values(ok, column), _values(ok, "timings_synchronised"))]


def _oracle_for(label: str, suite, temp, labels: pd.DataFrame) -> str | None:
    """The not-deployable label that holds ``label``'s oracle bound on (suite, temperature): the one whose option
    ``pair`` names ``label``, else the only one without a pair measured against the same baseline; None otherwise.
    ``labels``: one row per (label, suite, temperature) with deployable, baseline and pair."""
    at = labels[(labels["suite"] == suite) & (labels["temperature"] == temp) & ~labels["deployable"]]
    if label in set(at["label"]):
        return label
    mine = labels[(labels["label"] == label) & (labels["suite"] == suite) & (labels["temperature"] == temp)]
    at = at[at["baseline"].isin(set(mine["baseline"]))]
    paired = at[at["pair"] == label]
    if len(paired):
        return str(paired["label"].iloc[0])
    free = at[at["pair"] == ""]
    return str(free["label"].iloc[0]) if len(free) == 1 else None


def headroom_table(turns: pd.DataFrame, baseline_label: str = "vanilla", cost_per_hour: float | None = None,
                   n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The headroom ledger and the time breakdown: one row per (label, method, suite, temperature), the report's
    cells (:data:`HEADROOM_COLUMNS`).

    ``speedup`` is the measured S (ratio of mean tokens/s vs the row's baseline on the same questions, the paper
    table's), ``free_draft_speedup`` the free-draft bound (the same turns with their drafting time removed,
    :func:`harness.measure.headroom.free_draft_tokens_per_second`), ``oracle_speedup`` the oracle bound S* of the
    not-deployable entry that holds it (``oracle_label``: the ``oracle`` entry whose option ``pair`` names the row's
    label, else the run's only unpaired one; temperature 0 only, :func:`harness.measure.headroom.oracle_bound`); each
    with its percentile-bootstrap 95% CI over questions (:func:`harness.measure.metrics.speedup_ratio_ci`).
    ``share_<part>``: where the wall time goes (:func:`harness.measure.headroom.time_breakdown`),
    ``rejected_verify_share``: the verification work spent on rejected slots
    (:func:`harness.measure.headroom.rejected_verification_share`); without a synchronised split these are NaN and
    ``timing_note`` says why. Energy per token and per accepted draft token (NVML on CUDA, RAPL on CPU, the records'
    ``energy_source``), and the cost of a million tokens at ``cost_per_hour`` (the user's price; NaN without it).
    """
    measured = measured_rows(turns)
    ok_all = turns[measured]
    questions = questions_table(turns)
    runtimes, bases = label_runtimes(turns), baseline_labels(turns, baseline_label)
    deployable = deployable_labels(turns)
    pairs = _values(ok_all, "opt.pair")
    # an oracle's pair names an entry's label as configured; under another runtime that entry is "<label>@<runtime>"
    paired = [runtime_label(p, runtimes.get(lb)) if isinstance(p, str) and p else ""
              for p, lb in zip(pairs, ok_all["label"])]
    labels = pd.DataFrame({"label": ok_all["label"], "suite": ok_all["suite"], "temperature": ok_all["temperature"],
                           "pair": paired}).drop_duplicates()
    labels["deployable"] = [deployable.get(lb, True) for lb in labels["label"]]
    labels["baseline"] = [bases.get(lb, baseline_label) for lb in labels["label"]]

    def tps_of(label: str, suite, temp) -> pd.Series:
        return _per_question_tps(questions[(questions["label"] == label) & (questions["suite"] == suite)
                                           & (questions["temperature"] == temp)])

    rows = []
    for key, ok in ok_all.groupby(GROUP, dropna=False, sort=False):
        label, _, suite, temp = key
        base = bases.get(label, baseline_label)
        tps, base_tps = tps_of(label, suite, temp), tps_of(base, suite, temp)
        s = M.speedup_ratio_ci([(tps, base_tps)], n_boot=n_boot, seed=seed)
        draft = _synchronised(ok, "timing.draft_s")
        draft_of = dict(zip(ok.index, draft))
        free = {qid: HR.free_draft_tokens_per_second(list(q["new_tokens"]), list(q["wall_time_s"]),
                                                    [draft_of[i] for i in q.index])
                for qid, q in ok.groupby("question_id", sort=False)}
        f = M.speedup_ratio_ci([(pd.Series(free, dtype=float), base_tps)], n_boot=n_boot, seed=seed)
        oracle = _oracle_for(label, suite, temp, labels) if float(temp) == 0.0 else None
        o = (HR.oracle_bound(tps_of(oracle, suite, temp), tps_of(bases.get(oracle, baseline_label), suite, temp),
                            n_boot=n_boot, seed=seed) if oracle else (math.nan,) * 3)
        shares = HR.time_breakdown(list(ok["wall_time_s"]), list(ok["prefill_time_s"]), draft,
                                  _synchronised(ok, "timing.verify_s"), _synchronised(ok, "timing.overhead_s"))
        tree = _values(ok, "counter.tree_tokens")
        steps = [max(len(a) - 1, 0) for a in lists(ok["accept_lengths"])]
        accepted = [sum(a) for a in lists(ok["accepted_drafts"])]
        sources = [v for v in dict.fromkeys(_values(ok, "energy_source")) if v]
        mean_tps = M.mean_tokens_per_second(tps)
        rows.append({
            **dict(zip(GROUP, key)), "deployable": deployable.get(label, True),
            "runtime": runtimes.get(label, "eager"), "baseline": base,
            "n_questions": int(tps.notna().sum()), "tokens_per_s": mean_tps,
            "speedup": s[0], "speedup_ci_lo": s[1], "speedup_ci_hi": s[2],
            "free_draft_speedup": f[0], "free_draft_ci_lo": f[1], "free_draft_ci_hi": f[2],
            "oracle_label": oracle, "oracle_speedup": o[0], "oracle_ci_lo": o[1], "oracle_ci_hi": o[2],
            **{f"share_{part}": v for part, v in shares.items()},
            "rejected_verify_share": HR.rejected_verification_share(tree, accepted, steps),
            "timing_note": NO_SPLIT if math.isnan(shares["draft"]) else None,
            "energy_per_token_j": HR.energy_per_token(list(ok["energy_j"]), list(ok["new_tokens"])),
            "energy_per_accepted_token_j": HR.energy_per_accepted_token(list(ok["energy_j"]), accepted),
            "energy_source": "; ".join(sources) if sources else ("nvml" if ok["energy_j"].notna().any()
                                                                  else "n/a: not recorded"),
            "cost_per_hour": cost_per_hour if cost_per_hour is not None else math.nan,
            "cost_per_million_tokens": HR.cost_per_million_tokens(cost_per_hour, mean_tps),
        })
    df = pd.DataFrame(rows, columns=HEADROOM_COLUMNS)
    for col in ("energy_per_token_j", "cost_per_hour"):
        df[col] = df[col].astype(float)
    return df


HARNESS_ACCEPTANCE = "the harness's own verification steps: every target forward, per position in order"


def acceptance_sources(turns: pd.DataFrame) -> dict[str, str | None]:
    """label -> what its acceptance figures count: the records' ``engine_acceptance`` (an engine that speculated,
    :func:`harness.backends.contract.acceptance_source`); :data:`HARNESS_ACCEPTANCE` for the harness's own labels;
    None for another engine's label that never speculated (or records older than the field). Example: records of
    ``vllm-ngram`` with engine_acceptance "vLLM's spec-decode counters ...", ``vllm-vanilla`` (engine vllm) and
    ``pld`` (the harness) without it -> {"vllm-ngram": "vLLM's spec-decode counters ...", "vllm-vanilla": None,
    "pld": HARNESS_ACCEPTANCE}."""
    engines = label_engines(turns)
    column = turns["engine_acceptance"] if "engine_acceptance" in turns else [None] * len(turns)
    out: dict[str, str | None] = {label: HARNESS_ACCEPTANCE if engine == "harness" else None
                                  for label, engine in engines.items()}
    for label, source in zip(turns["label"], column):
        if isinstance(source, str) and source:
            out[label] = source
    return out


def _acceptance(ok: pd.DataFrame) -> dict[str, float]:
    """The pooled engine-convention acceptance columns of one group's measured turns (see :func:`summary_table`)."""
    t = draft_totals(ok)
    acc, drafted, steps = list(t["accepted_drafts_total"]), list(t["drafted_tokens"]), list(t["draft_steps"])
    cut = t["drafts_cut"].dropna()
    return {"draft_acceptance_rate": ACC.draft_acceptance_rate(acc, drafted),
            "drafted_per_step": ACC.drafted_per_step(drafted, steps),
            "mean_acceptance_length": ACC.mean_acceptance_length(acc, steps),
            "drafts_cut": float(cut.sum()) if len(cut) else math.nan}


def max_value(col: pd.Series) -> float:
    """The largest number of a column, ignoring what is not a number (NaN when none is)."""
    values = pd.to_numeric(col, errors="coerce").dropna()
    return float(values.max()) if len(values) else math.nan


def sum_values(col: pd.Series) -> float:
    """The sum of a column's numbers, ignoring what is not a number (NaN when none is)."""
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
    measured = measured_rows(turns)
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
                             "tau": ACC.tau(lists(ok["accept_lengths"]))})
    return pd.DataFrame(rows, columns=cols)


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
    the dtype's tie tolerance, the kind ("tie" within rounding noise / "disagreement" / "unknown") and the reason
    for it (e.g. "method's token 6 is not the baseline's runner-up 4"), from
    :func:`harness.measure.metrics.divergences`."""
    columns = ["label", "method", "suite", "question_id", "turn", "seed", "position", "token", "baseline_token",
               "method_margin", "baseline_margin", "tolerance", "kind", "reason"]
    ok = turns[measured_rows(turns) & (turns["temperature"].astype(float) == 0.0)]
    bases = baseline_labels(turns, baseline_label)
    rows = []
    for (label, method), g in ok.groupby(["label", "method"], sort=False):
        base = bases.get(label, baseline_label)
        if label == base:
            continue
        for d in M.divergences(g.to_dict("records"), ok[ok["label"] == base].to_dict("records")):
            rows.append({"label": label, "method": method, **d})
    return pd.DataFrame(rows, columns=columns)


def histogram_table(turns: pd.DataFrame) -> pd.DataFrame:
    """Tidy accepted-length histogram: (label, method, suite, temperature, accept_length, steps), verification
    steps of measured turns only (:func:`harness.measure.acceptance.accept_length_histogram`)."""
    measured = measured_rows(turns)
    rows = []
    for key, g in turns[measured].groupby(GROUP, dropna=False, sort=False):
        for length, count in ACC.accept_length_histogram(lists(g["accept_lengths"])).items():
            rows.append({**dict(zip(GROUP, key)), "accept_length": length, "steps": count})
    return pd.DataFrame(rows, columns=[*GROUP, "accept_length", "steps"])


def summary_runtimes(summary: pd.DataFrame) -> list[str]:
    """The runtimes of a summary's rows, eager first (["eager"] for summaries made before runtimes existed)."""
    if "runtime" not in summary:
        return ["eager"]
    found = list(dict.fromkeys(r if isinstance(r, str) else "eager" for r in summary["runtime"]))
    return sorted(found, key=lambda r: r != "eager")
