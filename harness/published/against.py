"""Measured next to reported: a run's records compared cell by cell with a published table.

``compare_run(run_dir, table)`` (``draftbench report RUN --against TABLE``; also printed by ``draftbench
reproduce``) matches the table's rows to the run's method labels and its columns to the run's suites and
categories, recomputes every reported metric from the same records, and writes::

    tables/against_<table>.csv, .parquet   one tidy row per (table row, column, metric)
    tables/against_<table>.md              the measured-vs-reported tables with both hardwares
    plots/against_<table>.png              measured vs reported, one point per cell, the diagonal drawn

Per cell and metric: ``reported``, ``measured``, ``delta`` = measured − reported and ``ratio`` = measured / reported
(:func:`harness.measure.metrics.measured_vs_reported`). Speed-ups are the papers' ratio of mean tokens/s against the
run's baseline on the same questions, with a percentile-bootstrap 95% CI over questions
(:func:`harness.measure.metrics.speedup_ratio_ci`); a ``mean_of`` column is the equal-weight mean of its columns
with a CI stratified by column. τ cells are recomputed in the table's own convention
(:data:`harness.measure.acceptance.TAU_CONVENTIONS`) and draftbench's τ of the same records is given beside them.

Row matching: a run made by ``draftbench reproduce`` records ``reproduce.rows`` (label -> row id) in its manifest.
For any other run, a row matches the label whose method is the row's method and whose recorded options include
every option of the row (the ``head`` is not compared: a run names a folder where the table names an id); a label
equal to the row id wins a tie.

An engine table (``engine:``, measured at batch sizes) is compared with a run of load levels (``load.jsonl``,
:mod:`harness.run.load`; ``draftbench reproduce`` makes one) by :func:`compare_load`: each column is the level at its
``batch_size`` (the concurrency), and its numbers are the load report's own (:func:`harness.report.load.load_table`,
nothing recomputed here): ``throughput_ratio`` = the level's output tokens/s over the baseline entry's at the same
concurrency, ``speedup`` = mean per-request tokens/s over the baseline's, paired by prompt, with its bootstrap CI,
``tokens_per_s`` / ``baseline_tokens_per_s`` = the two levels' output tokens/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.records import load_records
from harness.measure.rundir import atomic_file, file_stem, read_manifest, run_subdir, write_text_atomic
from harness.published.tables import Column, Table
from harness.report.formatting import interval, markdown_row, number
from harness.report.html import write_tables_page
from harness.report.load import load_table as load_levels
from harness.report.load import read_load_rows
from harness.report.tables import turns_table

METRIC_LABELS = {"speedup": "speed-up (×)", "tokens_per_s": "tokens/s", "baseline_tokens_per_s": "vanilla tokens/s",
                 "throughput_ratio": "throughput ratio (×, output tokens/s over the same engine without speculation)"}
# an engine table's cell metric -> the load report's column it is compared with (harness.report.load.load_table)
LOAD_METRICS = {"throughput_ratio": "throughput_ratio", "speedup": "speedup", "tokens_per_s": "output_tok_s"}
COLUMNS = ["table", "row", "row_label", "label", "method", "column", "column_label", "metric", "convention",
           "reported", "measured", "delta", "ratio", "ci_lo", "ci_hi", "tau_draftbench", "n_questions",
           "target", "hardware_reported", "hardware_measured"]


class AgainstError(ValueError):
    """A run that cannot be compared with a table (nothing matches); the message says what is missing."""


def _options_match(row_options: Mapping[str, Any], recorded: Mapping[str, Any]) -> bool:
    """True when every option the table row sets has the same value in the run (``head`` never compared).

    Example: row {depth: 5}, recorded {depth: 5, top_k: 10, head: "/x"} -> True; recorded {depth: 6} -> False."""
    for key, value in row_options.items():
        if key == "head":
            continue
        if key not in recorded or _norm(recorded[key]) != _norm(value):
            return False
    return True


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def recorded_options(turns: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """label -> (method, options) of the run, read from the records' ``opt.*`` columns (first record per label)."""
    out: dict[str, dict[str, Any]] = {}
    opt_cols = [c for c in turns.columns if c.startswith("opt.")]
    for label, g in turns.groupby("label", sort=False):
        first = g.iloc[0]
        opts = {c[4:]: first[c] for c in opt_cols
                if not (first[c] is None or (isinstance(first[c], float) and math.isnan(first[c])))}
        out[str(label)] = {"method": first["method"], "options": opts}
    return out


def target_keys(table: Table, run_target: str | None, model_dir: Mapping[str, str] | None = None) -> list[str]:
    """The table's target keys that a run's ``config.target`` stands for: the id itself or its ``--model-dir``
    folder. Example: targets {v7: lmsys/vicuna-7b-v1.3}, run target "/m/v7", model_dir {lmsys/vicuna-7b-v1.3:
    "/m/v7"} -> ["v7"]."""
    model_dir = model_dir or {}

    def same(a: str | None, b: str | None) -> bool:
        if a is None or b is None:
            return False
        if a == b:
            return True
        pa, pb = Path(a).expanduser(), Path(b).expanduser()
        return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()

    return [k for k, t in table.targets.items() if same(run_target, t.id) or same(run_target, model_dir.get(t.id))]


def match_rows(table: Table, turns: pd.DataFrame, manifest: Mapping[str, Any],
               model_dir: Mapping[str, str] | None = None, notes: list[str] | None = None) -> dict[str, str]:
    """Table row id -> run label for every runnable row that the run measured (see the module docstring).

    Without a ``reproduce`` record, only rows of the run's target count (:func:`target_keys`); a table with one
    target is compared even with another model, and ``notes`` gets a line saying so."""
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    run_target = config.get("target") or (str(turns["target"].iloc[0]) if len(turns) else None)
    return _match(table, recorded_options(turns), manifest, run_target, model_dir, notes)


def _match(table: Table, labels: Mapping[str, Mapping[str, Any]], manifest: Mapping[str, Any],
           run_target: str | None, model_dir: Mapping[str, str] | None, notes: list[str] | None) -> dict[str, str]:
    """:func:`match_rows` on the run's labels (label -> {method, options}) and target."""
    repro = manifest.get("reproduce") if isinstance(manifest.get("reproduce"), Mapping) else None
    if repro and repro.get("table") == table.id and isinstance(repro.get("rows"), Mapping):
        return {row_id: label for label, row_id in repro["rows"].items() if label in labels}
    keys = target_keys(table, run_target, model_dir)
    if not keys:
        if len(table.targets) > 1:
            raise AgainstError(f"the run's target {run_target!r} is none of the table's targets "
                               f"({', '.join(t.id for t in table.targets.values())}); if it is a local copy of one, "
                               "say which with --model-dir ID=FOLDER")
        keys = list(table.targets)
        if notes is not None:
            notes.append(f"the run's target is {run_target!r}, not the table's {table.targets[keys[0]].id!r}: the "
                         "numbers are compared anyway")
    out: dict[str, str] = {}
    for row in table.runnable_rows():
        if row.target not in keys:
            continue
        found = [lab for lab, info in labels.items()
                 if info["method"] == row.method and _options_match(row.options, info["options"])]
        if found:
            out[row.id] = row.id if row.id in found else found[0]
    return out


def _question_frame(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per measured question (no error turn): label, suite, temperature, question_id, category,
    tokens_per_s (Σ new / Σ wall over its turns) and the list of its turns' accept_lengths."""
    key = ["label", "suite", "temperature", "question_id"]
    rows = []
    for k, q in turns.groupby(key, sort=False, dropna=False):
        if (q["status"] != "ok").any():
            continue
        rows.append({**dict(zip(key, k)), "category": q["category"].iloc[0],
                     "tokens_per_s": M.tokens_per_second(list(q["new_tokens"]), list(q["wall_time_s"])),
                     "accept_lengths": [list(a) for a in q["accept_lengths"]]})
    return pd.DataFrame(rows, columns=[*key, "category", "tokens_per_s", "accept_lengths"])


def _select(questions: pd.DataFrame, label: str, col: Column, temperature: float) -> pd.DataFrame:
    sel = questions[(questions["label"] == label) & (questions["suite"] == col.suite)
                    & np.isclose(questions["temperature"].astype(float), temperature)]
    if col.category is not None:
        sel = sel[sel["category"] == col.category]
    return sel


def _tps(sel: pd.DataFrame) -> pd.Series:
    return pd.Series(sel["tokens_per_s"].to_numpy(dtype=float), index=sel["question_id"].astype(str).to_numpy())


def _per_question(sel: pd.DataFrame) -> dict[str, list[list[int]]]:
    return dict(zip(sel["question_id"].astype(str), sel["accept_lengths"]))


def measure_cells(questions: pd.DataFrame, table: Table, label: str, baseline: str, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, dict[str, Any]]:
    """column id -> measured values of one run label: speedup (+ ci_lo, ci_hi), tau in the table's convention and
    every other convention (``tau_<name>``), tau_draftbench, tokens_per_s, baseline_tokens_per_s, n_questions."""
    out: dict[str, dict[str, Any]] = {}
    simple = {cid: col for cid, col in table.columns.items() if col.suite is not None}
    for cid, col in simple.items():
        sel = _select(questions, label, col, table.temperature)
        base = _select(questions, baseline, col, table.temperature)
        est, lo, hi = M.speedup_ratio_ci([(_tps(sel), _tps(base))], n_boot=n_boot, seed=seed)
        per_q = _per_question(sel)
        cell = {"speedup": est, "ci_lo": lo, "ci_hi": hi, "n_questions": len(sel),
                "tokens_per_s": M.mean_tokens_per_second(list(sel["tokens_per_s"])),
                "baseline_tokens_per_s": M.mean_tokens_per_second(list(base["tokens_per_s"])),
                "_pairs": (_tps(sel), _tps(base))}
        for conv in ACC.TAU_CONVENTIONS:
            cell[f"tau_{conv}"] = ACC.tau_in_convention(conv, per_q) if per_q else math.nan
        out[cid] = cell
    for cid, col in table.columns.items():
        if col.mean_of is None:
            continue
        parts = [out[c] for c in col.mean_of]
        est, lo, hi = M.speedup_ratio_ci([p["_pairs"] for p in parts], n_boot=n_boot, seed=seed)
        cell = {"speedup": est, "ci_lo": lo, "ci_hi": hi, "n_questions": sum(p["n_questions"] for p in parts)}
        for metric in ("tokens_per_s", "baseline_tokens_per_s", *(f"tau_{c}" for c in ACC.TAU_CONVENTIONS)):
            cell[metric] = M.suite_mean([p[metric] for p in parts])
        out[cid] = cell
    for cell in out.values():
        cell.pop("_pairs", None)
        cell["tau"] = cell[f"tau_{table.tau_convention}"]
    return out


def compare_turns(turns: pd.DataFrame, table: Table, manifest: Mapping[str, Any] | None = None,
                  baseline: str | None = None, n_boot: int = 2000, seed: int = 0,
                  model_dir: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The tidy comparison (:data:`COLUMNS`): one row per (matched table row, column, metric) where the table
    reports a value or the run measured one (always speedup and tau). Raises :class:`AgainstError` when no row
    matches. ``df.attrs["notes"]`` holds lines worth printing (e.g. a target mismatch)."""
    manifest = manifest or {}
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    baseline = baseline or config.get("baseline") or "vanilla"
    notes: list[str] = []
    matched = match_rows(table, turns, manifest, model_dir, notes)
    if not matched:
        runnable = ", ".join(f"{r.id} ({r.method} {r.options})" for r in table.runnable_rows())
        have = ", ".join(f"{lab} ({i['method']})" for lab, i in recorded_options(turns).items())
        raise AgainstError(f"no row of table {table.id!r} matches a method of the run: the table's rows are "
                           f"{runnable}; the run has {have}")
    if baseline not in set(turns["label"]):
        raise AgainstError(f"the run has no baseline label {baseline!r}: speed-ups cannot be measured")
    hw_measured = _hardware(manifest, str(turns["device"].iloc[0]))
    questions = _question_frame(turns)
    temps = sorted({float(t) for t in questions["temperature"]})
    if not any(np.isclose(t, table.temperature) for t in temps):
        raise AgainstError(f"the run has no measured turn at temperature {table.temperature:g} (the table's); its "
                           f"temperatures: {', '.join(f'{t:g}' for t in temps) or 'none'}")
    missing = [s for s in table.suites if s not in set(questions["suite"])]
    if missing:
        notes.append(f"the run has no measured turn of suite(s) {', '.join(missing)}: those columns are empty")
    rows = []
    for row in table.rows:
        if row.id not in matched:
            continue
        label = matched[row.id]
        measured = measure_cells(questions, table, label, baseline, n_boot=n_boot, seed=seed)
        target_id = table.targets[row.target].id
        for cid, col in table.columns.items():
            got, rep = measured[cid], row.cells.get(cid, {})
            metrics = ["speedup", "tau", *[m for m in rep if m.startswith("tau_")], "tokens_per_s",
                       "baseline_tokens_per_s"]
            for metric in metrics:
                reported = rep.get(metric, math.nan)
                value = got.get(metric, math.nan)
                if math.isnan(reported) and metric not in ("speedup", "tau"):
                    continue
                delta, ratio = M.measured_vs_reported(value, reported)
                conv = (table.tau_convention if metric == "tau" else metric[4:] if metric.startswith("tau_")
                        else None)
                rows.append({
                    "table": table.id, "row": row.id, "row_label": row.label, "label": label,
                    "method": row.method, "column": cid, "column_label": col.label, "metric": metric,
                    "convention": conv, "reported": reported, "measured": value, "delta": delta, "ratio": ratio,
                    "ci_lo": got["ci_lo"] if metric == "speedup" else math.nan,
                    "ci_hi": got["ci_hi"] if metric == "speedup" else math.nan,
                    "tau_draftbench": got["tau_draftbench"] if conv is not None else math.nan,
                    "n_questions": got["n_questions"], "target": target_id,
                    "hardware_reported": table.hardware, "hardware_measured": hw_measured,
                })
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs["notes"] = notes
    return df


def _hardware(manifest: Mapping[str, Any], fallback: str = "?") -> str:
    device = manifest.get("device") if isinstance(manifest.get("device"), Mapping) else {}
    return device.get("device_name") or device.get("device_type") or fallback


def compare_load(rows: list[dict[str, Any]], table: Table, manifest: Mapping[str, Any] | None = None,
                 model_dir: Mapping[str, str] | None = None) -> pd.DataFrame:
    """An engine table against a run's load rows (``load.jsonl``): the tidy comparison (:data:`COLUMNS`), one row
    per (matched table row, column, metric) for the metrics the table reports, and always ``throughput_ratio`` and
    ``speedup`` for a row that speculates. A column is the level at its ``batch_size``; the measured numbers are the
    load report's (:func:`harness.report.load.load_table`, :data:`LOAD_METRICS`), the mean of a ``mean_of`` column
    the equal-weight mean of its columns'. Raises :class:`AgainstError` when no row matches."""
    manifest = manifest or {}
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    baseline = config.get("baseline") or "vanilla"
    levels = load_levels(rows, baseline)
    labels: dict[str, dict[str, Any]] = {}
    for r in rows:
        labels.setdefault(str(r["label"]), {"method": r["method"], "options": r.get("method_options") or {}})
    notes: list[str] = []
    run_target = config.get("target") or (str(rows[0].get("target")) if rows else None)
    matched = _match(table, labels, manifest, run_target, model_dir, notes)
    if not matched:
        runnable = ", ".join(f"{r.id} ({r.method} {r.options})" for r in table.runnable_rows())
        have = ", ".join(f"{lab} ({i['method']})" for lab, i in labels.items())
        raise AgainstError(f"no row of table {table.id!r} matches an entry of the load run: the table's rows are "
                           f"{runnable}; the run has {have}")
    base = next((b for b in levels["baseline"] if isinstance(b, str)), baseline)
    by_level = {(r["label"], int(r["concurrency"])): r for r in levels.to_dict("records")}
    notes.append(f"engine table: each column is the run's load level at its batch size (concurrency); throughput "
                 f"ratio = the level's output tokens/s over the baseline `{base}`'s at that concurrency, speed-up = "
                 "mean per-request tokens/s over the baseline's, paired by prompt (tables/load.csv)")
    hw_measured = _hardware(manifest)
    out = []
    for row in table.rows:
        if row.id not in matched:
            continue
        label = matched[row.id]
        measured: dict[str, dict[str, Any]] = {}
        for cid, col in table.columns.items():
            if col.mean_of is not None:
                continue
            got, theirs = by_level.get((label, col.batch_size)), by_level.get((base, col.batch_size))
            if got is None:
                notes.append(f"`{label}` has no level at concurrency {col.batch_size}: column {col.label} is empty")
            cell = {m: math.nan if got is None else got[c] for m, c in LOAD_METRICS.items()}
            cell.update(ci_lo=math.nan if got is None else got["speedup_lo"],
                        ci_hi=math.nan if got is None else got["speedup_hi"],
                        baseline_tokens_per_s=math.nan if theirs is None else theirs["output_tok_s"],
                        n_questions=0 if got is None else int(got["requests"] - got["failed"]))
            measured[cid] = cell
        for cid, col in table.columns.items():
            if col.mean_of is not None:
                parts = [measured[c] for c in col.mean_of]
                measured[cid] = {**{m: M.suite_mean([p[m] for p in parts]) for m in
                                    (*LOAD_METRICS, "baseline_tokens_per_s")},
                                 "ci_lo": math.nan, "ci_hi": math.nan,
                                 "n_questions": sum(p["n_questions"] for p in parts)}
        always = ["throughput_ratio", "speedup"] if row.method != "vanilla" else []
        for cid, col in table.columns.items():
            got, rep = measured[cid], row.cells.get(cid, {})
            for metric in dict.fromkeys([*always, *(m for m in rep if m in got)]):
                reported = rep.get(metric, math.nan)
                delta, ratio = M.measured_vs_reported(got[metric], reported)
                out.append({
                    "table": table.id, "row": row.id, "row_label": row.label, "label": label,
                    "method": row.method, "column": cid, "column_label": col.label, "metric": metric,
                    "convention": None, "reported": reported, "measured": got[metric], "delta": delta,
                    "ratio": ratio, "ci_lo": got["ci_lo"] if metric == "speedup" else math.nan,
                    "ci_hi": got["ci_hi"] if metric == "speedup" else math.nan, "tau_draftbench": math.nan,
                    "n_questions": got["n_questions"], "target": table.targets[row.target].id,
                    "hardware_reported": table.hardware, "hardware_measured": hw_measured,
                })
    df = pd.DataFrame(out, columns=COLUMNS)
    df.attrs["notes"] = notes
    return df


def comparison_markdown(df: pd.DataFrame, table: Table, run_name: str = "") -> str:
    """The comparison as Markdown: source and both hardwares, then one table per metric (rows × columns), each
    cell "measured vs reported (Δ, ×ratio)" with the speed-up's 95% CI and draftbench's τ beside the paper's."""
    hw_measured = ", ".join(dict.fromkeys(df["hardware_measured"].astype(str))) if len(df) else "?"
    lines = [f"# {run_name or 'run'} against `{table.id}`", "",
             f"- reported: {table.title}", f"- source: {table.cite()}",
             f"- hardware: reported **{table.hardware}** ({table.dtype}, {table.framework}); "
             f"measured **{hw_measured}**",
             f"- protocol: suites {', '.join(table.suites)}, T = {table.temperature:g}, "
             f"max_new_tokens {table.max_new_tokens}, warm-up {table.warmup}, repeats {table.repeats}; "
             f"tau convention `{table.tau_convention}`", ""]
    if table.notes:
        lines += [f"Protocol notes: {table.notes.strip()}", ""]
    for note in df.attrs.get("notes", []):
        lines += [f"Note: {note}", ""]
    col_ids = [c for c in table.columns if c in set(df["column"])]
    for metric in dict.fromkeys(df["metric"]):
        sub = df[df["metric"] == metric]
        if sub["reported"].isna().all() and sub["measured"].isna().all():
            continue
        conv = sub["convention"].dropna().iloc[0] if sub["convention"].notna().any() else None
        title = (f"τ in the `{conv}` convention (draftbench τ of the same records in brackets)" if conv
                 else METRIC_LABELS.get(metric, metric) + (" with the measured 95% bootstrap CI"
                                                           if metric == "speedup" else ""))
        lines += [f"**{title}** — measured vs reported (Δ = measured − reported, ×ratio)", "",
                  markdown_row(["row", *(table.columns[c].label for c in col_ids)]),
                  "|---|" + "---:|" * len(col_ids)]
        for row_id in dict.fromkeys(sub["row"]):
            r = sub[sub["row"] == row_id]
            cells = []
            for cid in col_ids:
                x = r[r["column"] == cid]
                if x.empty:
                    cells.append("")
                    continue
                x = x.iloc[0]
                text = (interval(x["measured"], x["ci_lo"], x["ci_hi"])
                        if metric == "speedup" and not math.isnan(x["ci_lo"]) else number(x["measured"]))
                if conv:
                    text += f" [τ {number(x['tau_draftbench'])}]"
                if not math.isnan(x["reported"]):
                    text += f" vs {number(x['reported'])} ({number(x['delta'], '+.2f')}, ×{number(x['ratio'])})"
                cells.append(text)
            lines.append(markdown_row([r["row_label"].iloc[0], *cells]))
        lines.append("")
    if table.engine is not None:  # no τ: the engine's own numbers at batch sizes
        lines += ["A large delta usually means different hardware (throughput ratios do not transfer across GPUs), "
                  f"another version of {table.engine['name']} than the source's ({table.engine['version']}), other "
                  "engine settings, or a protocol difference listed above.", ""]
    else:
        lines += ["A large delta usually means different hardware (speed-ups do not transfer across GPUs), a "
                  "different baseline (the source's vanilla loop vs draftbench's), a different τ convention, or a "
                  "protocol difference listed above; τ depends on the head and the prompts only, so compare τ first.",
                  ""]
    return "\n".join(lines)


def plot_against(df: pd.DataFrame, path: Path, title: str = "") -> Path | None:
    """Measured (y) vs reported (x), one point per cell, speed-up and τ in two panels, the diagonal y = x drawn.
    None when no cell has both numbers."""
    panels = [(m, lab) for m, lab in (("speedup", "speed-up (×)"), ("throughput_ratio", "throughput ratio (×)"),
                                      ("tau", "τ (source's convention)"))
              if ((df["metric"] == m) & df["reported"].notna() & df["measured"].notna()).any()]
    if not panels:
        return None
    fig = Figure(figsize=(5.0 * len(panels), 4.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (metric, lab) in zip(axes, panels):
        sub = df[(df["metric"] == metric) & df["reported"].notna() & df["measured"].notna()]
        for row_label, g in sub.groupby("row_label", sort=False):
            yerr = None
            if metric == "speedup" and g["ci_lo"].notna().all():
                yerr = np.vstack([g["measured"] - g["ci_lo"], g["ci_hi"] - g["measured"]]).clip(min=0)
            ax.errorbar(g["reported"], g["measured"], yerr=yerr, fmt="o", capsize=2, label=str(row_label))
        lo = float(min(sub["reported"].min(), sub["measured"].min(), 1.0)) * 0.9
        hi = float(max(sub["reported"].max(), sub["measured"].max())) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, linestyle="--", label="measured = reported")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"reported {lab}")
        ax.set_ylabel(f"measured {lab}")
        ax.legend(fontsize="small")
    fig.suptitle(title or "measured vs reported")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120)
    return path


def compare_run(run_dir: str | Path, table: Table, n_boot: int = 2000, seed: int = 0,
                model_dir: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Compare a run directory with ``table``; write the CSV/parquet/Markdown/PNG (module docstring) and return
    ``{"frame": DataFrame, "markdown": str, "paths": {name: Path}}``."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir) or {}  # no manifest: rows are matched by method and options
    if table.engine is not None:  # measured at batch sizes: compared with the run's load levels
        rows = read_load_rows(run_dir)
        if not rows:
            raise AgainstError(f"{run_dir}: no load levels (load.jsonl); table {table.id!r} was measured in "
                               f"{table.engine['name']} at batch size(s) {', '.join(map(str, table.batch_sizes()))} "
                               f"and is compared with a run of load levels: `draftbench reproduce {table.id}` makes "
                               "one")
        df = compare_load(rows, table, manifest, model_dir)
    else:
        records = load_records(run_dir).complete_records  # a partial question never enters a mean
        if not records:
            raise AgainstError(f"{run_dir}: no records; is it a draftbench run directory?")
        turns = turns_table(records, manifest)
        df = compare_turns(turns, table, manifest, n_boot=n_boot, seed=seed, model_dir=model_dir)
    md = comparison_markdown(df, table, run_dir.name)
    tables, plots = run_subdir(run_dir, "tables"), run_subdir(run_dir, "plots")
    stem = file_stem(f"against_{table.id}")
    paths: dict[str, Path] = {"against_csv": tables / f"{stem}.csv", "against_parquet": tables / f"{stem}.parquet",
                              "against_md": tables / f"{stem}.md"}
    with atomic_file(paths["against_csv"]) as tmp:
        df.to_csv(tmp, index=False)
    with atomic_file(paths["against_parquet"]) as tmp:
        df.to_parquet(tmp, index=False)
    write_text_atomic(paths["against_md"], md)
    plot = plot_against(df, plots / f"{stem}.png", f"{run_dir.name} vs {table.id}")
    if plot is not None:
        paths["against_plot"] = plot
    paths["against_html"] = write_tables_page(
        run_dir / f"{stem}.html", f"{run_dir.name} vs {table.id}", {"Measured vs reported": df}, notes=md,
        plots={"measured vs reported": plot} if plot is not None else None, subtitle=table.cite())
    return {"frame": df, "markdown": md, "paths": paths}
