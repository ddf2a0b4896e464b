"""From a run directory's records to its outputs: tables, a Markdown paper table, plots and one HTML page.

``write_report(run_dir)`` reads ``manifest.json`` and ``records.jsonl`` and writes::

    tables/turns.parquet, turns.csv          one row per turn (turns_table)
    tables/questions.parquet, questions.csv  one row per (label, method, suite, temperature, question)
    tables/summary.parquet, summary.csv      one row per (label, method, suite, temperature) (summary_table)
    tables/categories.csv                    per category, for suites with several (category_table)
    tables/accept_hist.csv                   accepted-length histogram (histogram_table)
    tables/validity.csv                      every validity check's verdict (harness.measure.validity)
    tables/summary.md                        provenance header + the Validity section (harness.measure.validity's
                                             run checks: what failed or could not be checked) + paper_table
                                             (+ divergence note, + the acceptance figures as engines report them
                                             when a method drafts)
    tables/divergence.csv                    greedy turns that differ from the baseline (divergence_table)
    tables/headroom.csv                      the headroom ledger (measured speed-up, free-draft bound, oracle bound S*
                                             with their CIs) and where the time goes, energy and cost (headroom_table);
                                             summary.md's Headroom section; plots/headroom.png, plots/time_breakdown.png
    plots/*.png                              speed-up, tau, tokens/s per suite; accepted lengths; acceptance/position
    tables/context.csv, crossover.csv,       for a run with context-length buckets (harness.run.context) only: every
    plots/context.png                        number per input length, where each speed-up falls below 1.0, the plot
    tables/ablation.csv, plots/ablation_*    for the options the run swept (``sweep:``) or names (``ablate:``) when they
                                             differ between entries of a method (harness.report.ablation)
    tables/referee.csv, plots/referee.png    runs with entries on another engine only: each engine entry held
                                             against the harness's own (harness.report.referee)
    tables/precision.csv, plots/precision.png   runs with ``precisions`` only: the precision matrix (target x head
                                             precision: acceptance, speed-up, lossless share, first divergence from
                                             the float32 reference; harness.report.precision)
    report.html                              all of it on one self-contained page (harness.report.html)

A run of load levels (``load:``, harness.run.load) has ``load.jsonl`` instead of records: its report is
``tables/load.csv``, ``tables/validity.csv``, ``tables/summary.md`` with the Validity and Load sections (the
frontier among them), ``plots/load_*.png`` and ``report.html`` (harness.report.load).

The tables are computed by :mod:`harness.report.tables` (which turns are measured, and how, is said there), the
Markdown by :mod:`harness.report.markdown`, the figures by :mod:`harness.report.plots`; this module reads the run
and writes the files. Unreadable record lines, superseded attempts and incomplete questions are listed in
``summary.md``'s header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.measure.records import load_records, record_files
from harness.measure.rundir import (
    LOAD_FILE,
    MANIFEST_FILE,
    RECORDS_FILE,
    SUMMARY_MD,
    atomic_file,
    read_manifest,
    run_subdir,
    write_text_atomic,
)
from harness.measure.validity import run_checks, validity_markdown
from harness.report.ablation import ablated_options, ablation_markdown, ablation_turns, with_knobs, write_ablation
from harness.report.context import context_table, crossover_table, has_context
from harness.report.html import write_html_report
from harness.report.load import write_load_report
from harness.report.markdown import (
    acceptance_markdown,
    category_markdown,
    collapse_note,
    context_markdown,
    divergence_note,
    headroom_markdown,
    paper_table,
    records_note,
)
from harness.report.plots import (
    plot_accept_histogram,
    plot_acceptance_per_position,
    plot_context,
    plot_headroom,
    plot_speedup,
    plot_tau,
    plot_time_breakdown,
    plot_tokens_per_s,
)
from harness.report.precision import write_precision
from harness.report.referee import write_referee
from harness.report.tables import (
    category_table,
    divergence_table,
    headroom_table,
    histogram_table,
    measured_rows,
    provenance,
    questions_table,
    summary_table,
    turns_table,
)


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


def _json_cell(v: Any) -> Any:
    """Lists / arrays / dicts as JSON text, so a CSV cell round-trips; everything else unchanged."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (list, tuple, dict)) else v


def _for_parquet(df: pd.DataFrame) -> pd.DataFrame:
    """Cells Arrow cannot type as JSON text, strings kept as they are: dicts (e.g. an ``error`` object; Arrow cannot
    mix dicts and None) and any column mixing kinds other than numbers (e.g. ``opt.tree``: a tree name for eagle1,
    rank paths for medusa, ``true`` for suffix)."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype != object:
            continue
        kinds = {type(v) for v in out[col] if v is not None and not (isinstance(v, float) and v != v)}
        if dict in kinds or (len(kinds) > 1 and not kinds <= {int, float}):
            out[col] = out[col].map(lambda v: v if v is None or isinstance(v, str) or (isinstance(v, float) and v != v)
                                    else json.dumps(v))
    return out


def _write_table(df: pd.DataFrame, stem: Path) -> dict[str, Path]:
    """``stem.parquet`` and ``stem.csv`` (list columns JSON-encoded in the CSV)."""
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    with atomic_file(parquet) as tmp:
        _for_parquet(df).to_parquet(tmp, index=False)
    with atomic_file(csv) as tmp:
        df.map(_json_cell).to_csv(tmp, index=False)
    return {f"{stem.name}_parquet": parquet, f"{stem.name}_csv": csv}


def write_report(run_dir: str | Path, baseline_label: str | None = None,
                 cost_per_hour: float | None = None) -> dict[str, Path]:
    """Rebuild ``tables/`` and ``plots/`` of a run directory from its records; returns name -> path written.

    The baseline is ``baseline_label``, else the manifest's ``config.baseline``, else "vanilla". Plots that have
    nothing to show (a speed-up without a baseline, acceptance without a drafting method) are not written.
    ``cost_per_hour``: the user's price of the machine per hour, for the headroom table's cost per million tokens
    (n/a without it; never assumed).
    """
    run_dir = Path(run_dir)
    if not record_files(run_dir) and (run_dir / LOAD_FILE).exists():  # a run of load levels (harness.run.load)
        manifest = read_manifest(run_dir) or {}
        config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
        return write_load_report(run_dir, baseline_label or config.get("baseline") or "vanilla",
                                 f"# draftbench results: {run_dir.name}\n\n", manifest)
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
    ablated = ablation_turns(turns[measured_rows(turns)], ablated_options(config))  # swept or named knobs only
    questions = with_knobs(questions_table(turns), turns)   # one opt.<knob> column per ablated option
    summary = with_knobs(summary_table(turns, baseline_label=baseline), turns)
    tables, plots = run_subdir(run_dir, "tables"), run_subdir(run_dir, "plots")
    paths: dict[str, Path] = {}
    paths |= _write_table(turns, tables / "turns")
    paths |= _write_table(questions, tables / "questions")
    paths |= _write_table(summary, tables / "summary")
    categories = category_table(turns, baseline)
    if not categories.empty:
        with atomic_file(tables / "categories.csv") as tmp:
            categories.to_csv(tmp, index=False)
        paths["categories_csv"] = tables / "categories.csv"
    with atomic_file(tables / "accept_hist.csv") as tmp:
        histogram_table(turns).to_csv(tmp, index=False)
    paths["accept_hist_csv"] = tables / "accept_hist.csv"
    divergence = divergence_table(turns, baseline)
    with atomic_file(tables / "divergence.csv") as tmp:
        divergence.to_csv(tmp, index=False)
    paths["divergence_csv"] = tables / "divergence.csv"
    referee = write_referee(turns, config, baseline, tables, plots)
    precision = write_precision(summary, turns, baseline, tables, plots)  # a run with precisions only
    context = context_table(turns, baseline) if has_context(turns) else None  # only a run with buckets has these
    if context is not None:
        crossover = crossover_table(context)
        for name, frame in (("context", context), ("crossover", crossover)):
            with atomic_file(tables / f"{name}.csv") as tmp:
                frame.to_csv(tmp, index=False)
            paths[f"{name}_csv"] = tables / f"{name}.csv"
    headroom = headroom_table(turns, baseline, cost_per_hour)
    with atomic_file(tables / "headroom.csv") as tmp:
        headroom.to_csv(tmp, index=False)
    paths["headroom_csv"] = tables / "headroom.csv"
    headroom_md = headroom_markdown(headroom)
    checks = run_checks(records, manifest)
    validity_md = validity_markdown(checks)
    with atomic_file(tables / "validity.csv") as tmp:
        pd.DataFrame([c.as_dict() for c in checks], columns=["name", "status", "detail", "scope"]).to_csv(
            tmp, index=False)
    paths["validity_csv"] = tables / "validity.csv"
    md = run_dir / SUMMARY_MD
    accepted = acceptance_markdown(summary)
    write_text_atomic(md, f"# draftbench results: {run_dir.name}\n\n{provenance_header(manifest, turns)}"
                      f"{records_note(found, run_dir, summary)}\n{collapse_note(summary)}{validity_md}\n"
                      f"{paper_table(summary, baseline)}"
                      f"{divergence_note(divergence)}" + (f"\n{accepted}" if accepted else "")
                      + f"\n{ablation_markdown(ablated, baseline)}"
                      + (f"\n{category_markdown(categories, summary, baseline)}" if not categories.empty else "")
                      + (f"\n{context_markdown(context, crossover, baseline)}" if context is not None else "")
                      + (f"\n{referee.markdown}" if referee else "")
                      + (f"\n{precision.markdown}" if precision else "")
                      + (f"\n{headroom_md}" if headroom_md else ""))
    paths["summary_md"] = md
    for name, written in (
        ("speedup", plot_speedup(summary, plots / "speedup.png", baseline)),
        ("tau", plot_tau(summary, plots / "tau.png")),
        ("tokens_per_s", plot_tokens_per_s(summary, plots / "tokens_per_s.png")),
        ("accept_hist", plot_accept_histogram(turns, plots / "accept_hist.png")),
        ("acceptance", plot_acceptance_per_position(turns, plots / "acceptance.png")),
        ("context", plot_context(context, plots / "context.png", baseline) if context is not None else None),
    ):
        if written is not None:
            paths[f"plot_{name}"] = written
    headroom_plots = {}
    for name, written in (("headroom", plot_headroom(headroom, plots / "headroom.png")),
                          ("time_breakdown", plot_time_breakdown(headroom, plots / "time_breakdown.png"))):
        if written is not None:
            headroom_plots[f"{name}_plot"] = paths[f"{name}_plot"] = written
    if referee:
        paths |= referee.paths
    if precision:
        paths |= precision.paths
    paths |= write_ablation(run_dir, ablated, baseline)
    paths["report_html"] = write_html_report(run_dir, manifest, turns, measured_rows(turns), questions, summary,
                                             paper_table(summary, baseline), baseline, ablated,
                                             {k: v for k, v in paths.items() if k.startswith("plot_")}, referee,
                                             (headroom_md, headroom, headroom_plots), validity_md, precision)
    return paths
