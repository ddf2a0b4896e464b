"""One self-contained HTML page per run (``report.html``), and the same page builder for other tables (a compare, a
reproduction against published numbers).

Self-contained: inline CSS and a few lines of vanilla JavaScript, plots embedded as base64 PNG, no network request
(no CDN, no web font, an inline favicon), so the file opens from disk or from a CI artifact. Sections of a run's
page: provenance (from ``manifest.json``), the validity checks' failures (:mod:`harness.measure.validity`), the
paper table (the same text as ``tables/summary.md``), every plot,
the headroom ledger and where the time goes (``tables/headroom.csv`` with its two plots), the ablation pivots
(:mod:`harness.report.ablation`) when the run has knobs, the precision matrix (:mod:`harness.report.precision`)
when the run measured target precisions, the referee (:mod:`harness.report.referee`) when entries ran on another
engine, sortable and filterable summary and
per-question tables, and the losslessness audit with a divergence viewer (for every turn whose ``output_ids``
differ from the baseline's at temperature 0: the first differing token, and the two texts side by side around the
first differing character).

Every number cell carries its exact value in ``data-v`` (what sorting uses, and what the browser test compares with
``summary.csv``) and shows it with 4 significant digits.

For other commands: :func:`render_tables_page` renders a title, optional notes, named DataFrames and plots into the
same page style; :func:`write_tables_page` writes it (e.g. ``draftbench compare ... --html``).
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.measure import metrics as M
from harness.measure.rundir import write_text_atomic
from harness.report.ablation import ablation_pivots, ablation_table, knob_names
from harness.report.formatting import html_number, markdown_cells, missing
from harness.report.markdown import collapse_note

REPORT_FILE = "report.html"
CONTEXT_CHARS = 160           # text shown on each side of a divergence
MAX_DIVERGENCES = 40          # divergent turns shown per label (the count is always complete)
LOSSLESS_KEY = list(M.LOSSLESS_KEY)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d1e0;font-size:13px}
nav{padding:8px 24px;background:#eef1f6;font-size:13px;position:sticky;top:0;z-index:2}
nav a{margin-right:14px;color:#1d4ed8;text-decoration:none}
main{padding:8px 24px 40px}section{margin:18px 0 28px}
h2{font-size:17px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0;background:#fff}
th,td{border:1px solid #d8dde6;padding:3px 7px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f1f3f7;position:sticky;top:33px}
table.sortable th{cursor:pointer}table.sortable th:hover{background:#e2e7f0}
th.asc::after{content:" \\25B2";font-size:9px}th.desc::after{content:" \\25BC";font-size:9px}
.scroll{max-height:520px;overflow:auto;border:1px solid #d8dde6;display:inline-block;max-width:100%}
.scroll table{margin:0}input.filter{margin:4px 0;padding:3px 6px;width:280px;font-size:12.5px}
img.plot{max-width:100%;border:1px solid #d8dde6;background:#fff;margin:6px 0}
.plots{display:flex;flex-wrap:wrap;gap:10px}.plots figure{margin:0;max-width:100%}
figcaption{font-size:12px;color:#566}pre{background:#fff;border:1px solid #d8dde6;padding:8px;font-size:12px;
overflow:auto;max-height:360px}.ok{color:#167a3e;font-weight:600}.bad{color:#b42318;font-weight:600}
.div{display:grid;grid-template-columns:1fr 1fr;gap:8px}.div pre{white-space:pre-wrap;max-height:none;margin:0}
mark{background:#ffe08a}details{margin:6px 0}summary{cursor:pointer}.muted{color:#667085;font-size:12.5px}
"""

JS = """
function cellValue(td){var v=td.getAttribute('data-v');return v===null?td.textContent:v;}
function sortTable(th){var table=th.closest('table'),body=table.tBodies[0],idx=Array.prototype.indexOf.call(
th.parentNode.children,th),asc=!th.classList.contains('asc');Array.prototype.forEach.call(th.parentNode.children,
function(h){h.classList.remove('asc','desc');});th.classList.add(asc?'asc':'desc');var rows=Array.prototype.slice.call(
body.rows);var numeric=rows.every(function(r){var v=cellValue(r.cells[idx]);return v===''||!isNaN(parseFloat(v));});
rows.sort(function(a,b){var x=cellValue(a.cells[idx]),y=cellValue(b.cells[idx]);if(numeric){x=x===''?-Infinity:
parseFloat(x);y=y===''?-Infinity:parseFloat(y);return asc?x-y:y-x;}return asc?x.localeCompare(y):y.localeCompare(x);});
rows.forEach(function(r){body.appendChild(r);});}
function filterTable(input){var table=document.getElementById(input.getAttribute('data-table')),q=input.value
.toLowerCase();Array.prototype.forEach.call(table.tBodies[0].rows,function(r){r.style.display=
r.textContent.toLowerCase().indexOf(q)>=0?'':'none';});}
document.addEventListener('DOMContentLoaded',function(){document.querySelectorAll('table.sortable th').forEach(
function(th){th.addEventListener('click',function(){sortTable(th);});});document.querySelectorAll('input.filter')
.forEach(function(i){i.addEventListener('input',function(){filterTable(i);});});});
"""


def _cell(v: Any) -> str:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        exact = "" if missing(v) else repr(int(v) if isinstance(v, (int, np.integer)) else float(v))
        return f'<td class="n" data-v="{exact}">{html_number(v)}</td>'
    if isinstance(v, (list, tuple, dict)):
        text = json.dumps(v, ensure_ascii=False)
        short = text if len(text) <= 80 else text[:77] + "..."
        return f'<td title="{html.escape(text)}">{html.escape(short)}</td>'
    return f"<td>{'' if missing(v) else html.escape(str(v))}</td>"


def table_html(df: pd.DataFrame, table_id: str, sortable: bool = True, filterable: bool = False,
               index: bool = False) -> str:
    """A DataFrame as an HTML table: numbers right-aligned with their exact value in ``data-v``; lists as JSON."""
    if index:
        df = df.reset_index()
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in df.itertuples(index=False))
    klass = ' class="sortable"' if sortable else ""
    table = f'<table id="{table_id}"{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    box = f'<div class="scroll">{table}</div>'
    if filterable:
        box = (f'<input class="filter" data-table="{table_id}" placeholder="filter rows (any text)">'
               f"<br>{box}")
    return box


def markdown_tables_html(text: str) -> str:
    """The paper table's Markdown (:func:`harness.report.markdown.paper_table`) as HTML: ``|`` rows become a table,
    ``#`` lines and ``**bold**`` lines headings, other lines paragraphs."""
    out, rows = [], []

    def flush():
        if rows:
            head, *body = rows
            out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr></thead>"
                       "<tbody>" + "".join("<tr>" + "".join(
                           f'<td class="{"n" if i else ""}">{html.escape(c)}</td>' for i, c in enumerate(r))
                           + "</tr>" for r in body) + "</tbody></table>")
            rows.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|"):
            cells = markdown_cells(s)
            if not all(set(c) <= set("-:") for c in cells):
                rows.append(cells)
            continue
        flush()
        if not s:
            continue
        if s.startswith("#"):  # a Markdown heading: a sub-heading of the section
            out.append(f"<h3>{html.escape(s.lstrip('#').strip())}</h3>")
            continue
        s = html.escape(s)
        while s.count("**") >= 2:
            s = s.replace("**", "<strong>", 1).replace("**", "</strong>", 1)
        while s.count("`") >= 2:
            s = s.replace("`", "<code>", 1).replace("`", "</code>", 1)
        out.append(f"<p>{s}</p>")
    flush()
    return "\n".join(out)


def _img(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img class="plot" alt="{html.escape(Path(path).stem)}" src="data:image/png;base64,{data}">'


def plots_html(plots: Mapping[str, Path]) -> str:
    figures = [f"<figure>{_img(p)}<figcaption>{html.escape(Path(p).name)}</figcaption></figure>"
               for p in plots.values() if Path(p).is_file()]
    return f'<div class="plots">{"".join(figures)}</div>' if figures else '<p class="muted">No plots.</p>'


def render_page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """The page: ``sections`` = [(anchor, heading, inner HTML)], a navigation bar, inline CSS and JS."""
    nav = "".join(f'<a href="#{a}">{html.escape(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{html.escape(h)}</h2>{inner}</section>' for a, h, inner in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<link rel=\"icon\" href=\"data:,\"><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script>{JS}</script></head><body><header><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(subtitle)}</p></header><nav>{nav}</nav><main>{body}</main></body></html>\n")


def render_tables_page(title: str, tables: Mapping[str, pd.DataFrame], notes: str = "",
                       plots: Mapping[str, Path] | None = None, subtitle: str = "") -> str:
    """A page of named tables (sortable, filterable), optional Markdown-ish ``notes`` (rendered like the paper
    table: ``|`` tables, ``**bold**``) and plots: the HTML of ``draftbench compare`` and of a reproduction
    against published numbers. ``tables``: heading -> DataFrame, in order."""
    sections = []
    if notes:
        sections.append(("notes", "Notes", markdown_tables_html(notes)))
    for i, (heading, df) in enumerate(tables.items()):
        sections.append((f"t{i}", heading, table_html(df, f"table-{i}", filterable=len(df) > 15)))
    if plots:
        sections.append(("plots", "Plots", plots_html(plots)))
    return render_page(title, subtitle, sections)


def write_tables_page(path: str | Path, title: str, tables: Mapping[str, pd.DataFrame], notes: str = "",
                      plots: Mapping[str, Path] | None = None, subtitle: str = "") -> Path:
    """Write :func:`render_tables_page` to ``path``; returns it."""
    path = Path(path)
    write_text_atomic(path, render_tables_page(title, tables, notes, plots, subtitle))
    return path


# ---------------------------------------------------------------------------------------------------------------
# Losslessness audit
# ---------------------------------------------------------------------------------------------------------------


def _ids(v: Any) -> list[int] | None:
    if isinstance(v, (list, tuple, np.ndarray)):
        return [int(t) for t in v]
    return None


def divergences(turns: pd.DataFrame, baseline_label: str) -> pd.DataFrame:
    """Every ok turn at temperature 0 whose ``output_ids`` differ from the baseline's turn with the same
    (suite, question_id, turn, temperature, seed): label, suite, question_id, turn, first_token (the first differing
    token index, :func:`harness.measure.metrics.first_difference`), tokens (method, baseline), first_char, and
    both texts."""
    ok = turns[(turns["status"] == "ok") & (turns["temperature"].astype(float) == 0.0)]
    base = ok[ok["label"] == baseline_label]
    ref = {tuple(str(r[k]) for k in LOSSLESS_KEY): r for r in base.to_dict("records")}
    rows = []
    for r in ok[ok["label"] != baseline_label].to_dict("records"):
        b = ref.get(tuple(str(r[k]) for k in LOSSLESS_KEY))
        a_ids, b_ids = _ids(r.get("output_ids")), _ids(b.get("output_ids")) if b is not None else None
        if a_ids is None or b_ids is None:
            continue
        first = M.first_difference(a_ids, b_ids)
        if first is None:
            continue
        a_text, b_text = str(r.get("output_text") or ""), str(b.get("output_text") or "")
        rows.append({"label": r["label"], "suite": r["suite"], "question_id": str(r["question_id"]),
                     "turn": int(r["turn"]), "first_token": first, "tokens": len(a_ids), "baseline_tokens": len(b_ids),
                     "first_char": M.first_difference(a_text, b_text), "text": a_text, "baseline_text": b_text})
    return pd.DataFrame(rows, columns=["label", "suite", "question_id", "turn", "first_token", "tokens",
                                       "baseline_tokens", "first_char", "text", "baseline_text"])


def _around(text: str, at: int | None) -> str:
    """HTML of ``text`` within CONTEXT_CHARS of ``at``, the rest from ``at`` on highlighted."""
    at = len(text) if at is None else at
    lo, hi = max(0, at - CONTEXT_CHARS), min(len(text), at + CONTEXT_CHARS)
    return (("…" if lo else "") + html.escape(text[lo:at]) + "<mark>" + html.escape(text[at:hi]) + "</mark>"
            + ("…" if hi < len(text) else ""))


def audit_html(summary: pd.DataFrame, turns: pd.DataFrame, baseline_label: str) -> str:
    """Lossless share per label and the divergence viewer."""
    cols = [c for c in ("label", "method", "suite", "temperature", "lossless", "lossless_share", "n_turns")
            if c in summary.columns]
    rows = summary[summary["label"] != baseline_label][cols] if "label" in summary else summary
    parts = [f"<p>Share of each label's turns whose output token ids equal <code>{html.escape(baseline_label)}"
             "</code>'s for the same question, turn and seed (temperature 0 only; a lossless method must give 1). "
             "<code>lossless</code> is the method's declared flag.</p>",
             table_html(rows, "lossless-table")]
    div = divergences(turns, baseline_label)
    if div.empty:
        parts.append('<p class="ok">No turn differs from the baseline.</p>')
        return "".join(parts)
    parts.append(f'<p class="bad">{len(div)} turn(s) differ from the baseline.</p>')
    for label, g in div.groupby("label", sort=False):
        items = []
        for r in g.head(MAX_DIVERGENCES).itertuples(index=False):
            items.append(
                f"<details><summary>{html.escape(str(r.suite))} / {html.escape(str(r.question_id))} turn {r.turn}: "
                f"first differing token {r.first_token} (of {r.tokens} vs {r.baseline_tokens})</summary>"
                f'<div class="div"><div><h3>{html.escape(baseline_label)}</h3><pre>'
                f"{_around(r.baseline_text, r.first_char)}</pre></div><div><h3>{html.escape(str(label))}</h3><pre>"
                f"{_around(r.text, r.first_char)}</pre></div></div></details>")
        more = f'<p class="muted">… and {len(g) - MAX_DIVERGENCES} more.</p>' if len(g) > MAX_DIVERGENCES else ""
        parts.append(f"<h3>{html.escape(str(label))}: {len(g)} divergent turn(s)</h3>{''.join(items)}{more}")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# The run page
# ---------------------------------------------------------------------------------------------------------------


def provenance_html(manifest: Mapping[str, Any]) -> str:
    if not manifest:
        return '<p class="muted">No manifest.json in the run directory: provenance unknown.</p>'
    device = manifest.get("device") or {}
    versions = manifest.get("versions") or {}
    target = manifest.get("target") or {}
    facts = {
        "run": manifest.get("run_id"), "created": manifest.get("created"), "command": manifest.get("command"),
        "git": f"{manifest.get('git_hash') or '?'}{' (dirty)' if manifest.get('git_dirty') else ''}",
        "target": f"{target.get('name', '?')} ({target.get('dtype', '?')}, {target.get('num_parameters', '?')} "
                  "parameters)" if target else None,
        "device": device.get("device_name") or device.get("device"),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, Mapping) else None,
        "suites": ", ".join(f"{k} ({v.get('questions')} questions, sha256 {str(v.get('sha256'))[:12]})"
                            for k, v in (manifest.get("suites") or {}).items() if isinstance(v, Mapping)),
    }
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items()
                   if v not in (None, ""))
    methods = manifest.get("methods") or {}
    mrows = "".join(f"<tr><td>{html.escape(str(label))}</td><td>{html.escape(str(d.get('method')))}</td>"
                    f"<td>{html.escape(str(d.get('lossless')))}</td><td><code>"
                    f"{html.escape(json.dumps(d.get('options'), sort_keys=True))}</code></td></tr>"
                    for label, d in methods.items() if isinstance(d, Mapping))
    out = f"<table>{rows}</table>"
    if mrows:
        out += ("<h3>Methods</h3><table><thead><tr><th>label</th><th>method</th><th>lossless</th><th>options</th>"
                f"</tr></thead><tbody>{mrows}</tbody></table>")
    sweep = (manifest.get("config") or {}).get("sweep_spec")
    if sweep:
        grids = "\n".join(json.dumps(g) for g in sweep)
        out += f"<h3>Sweep (the grids the methods were expanded from)</h3><pre>{html.escape(grids)}</pre>"
    out += (f"<details><summary>manifest.json</summary><pre>"
            f"{html.escape(json.dumps(manifest, indent=1, default=str))}</pre></details>")
    return out


def ablation_html(turns: pd.DataFrame, baseline_label: str) -> str | None:
    """Knob list, pivots (τ / speed-up per knob value) and the ablation table; None when the run has no knob."""
    knobs = knob_names(turns)
    if not knobs:
        return None
    table = ablation_table(turns, baseline_label)
    parts = [f"<p>Knobs (options that differ between entries of a method, from the records): "
             f"{', '.join(f'<code>{html.escape(k)}</code>' for k in knobs)}. Other knobs are held at their reference "
             "value in each pivot (see <code>harness/report/ablation.py</code>).</p>"]
    for i, (title, pivot) in enumerate(ablation_pivots(table) if not table.empty else []):
        parts.append(f"<h3>{html.escape(title)}</h3>{table_html(pivot, f'pivot-{i}', sortable=False, index=True)}")
    if not table.empty:
        parts.append("<h3>Every entry</h3>" + table_html(table, "ablation-table"))
    return "".join(parts)


def write_html_report(run_dir: str | Path, manifest: Mapping[str, Any], turns: pd.DataFrame,
                      measured: pd.Series, questions: pd.DataFrame, summary: pd.DataFrame, paper_md: str,
                      baseline_label: str, ablated: pd.DataFrame, plots: Mapping[str, Path],
                      referee: Any = None,
                      headroom: tuple[str, pd.DataFrame, Mapping[str, Path]] | None = None,
                      validity_md: str = "", precision: Any = None) -> Path:
    """Write ``run_dir/report.html`` (see the module docstring) and return its path. ``measured``: the turns
    mask of rows that count (the report's rule); ``paper_md``: the paper table's Markdown; ``ablated``: the
    measured turns with the ablated knobs only (:func:`harness.report.ablation.ablation_turns`); ``referee``: the
    :class:`harness.report.referee.RefereeReport` of a run with engine entries (a section of its own), else None;
    ``headroom``: the headroom section's Markdown, its table and its plots (the ledger and where the time goes,
    :func:`harness.report.tables.headroom_table`), else None; ``validity_md``: the Validity section's Markdown
    (:func:`harness.measure.validity.validity_markdown`), a section of its own when not empty; ``precision``: the
    :class:`harness.report.precision.PrecisionReport` of a run with precisions (the precision matrix), else None."""
    run_dir = Path(run_dir)
    config = manifest.get("config") or {}
    device = (manifest.get("device") or {}).get("device_name") or "?"
    subtitle = (f"target {config.get('target', '?')} · suites {', '.join(map(str, config.get('suites') or []))} · "
                f"baseline {baseline_label} · {device} · git {manifest.get('git_hash') or '?'} · "
                f"{manifest.get('created', '')}")
    collapsed = collapse_note(summary)
    sections = [("collapse", "Warning: acceptance collapse", markdown_tables_html(collapsed))] if collapsed else []
    if validity_md:
        sections.append(("validity", "Validity", markdown_tables_html(validity_md.partition("\n")[2])))
    sections += [("paper", "Paper table", markdown_tables_html(paper_md)),
                 ("plots", "Plots", plots_html(plots))]
    if headroom is not None and not headroom[1].empty:
        headroom_md, table, headroom_plots = headroom
        sections.append(("headroom", "Headroom", markdown_tables_html(headroom_md) + plots_html(headroom_plots)
                         + table_html(table.astype(object).where(table.notna(), None), "headroom-table",
                                      filterable=len(table) > 15)))
    ablation = ablation_html(ablated, baseline_label)
    if ablation is not None:
        sections.append(("ablation", "Ablation", ablation))
    if precision is not None:
        plot = {k: v for k, v in precision.paths.items() if k.endswith("_plot")}
        sections.append(("precision", "Precision matrix", markdown_tables_html(precision.markdown) + plots_html(plot)
                         + table_html(precision.table.astype(object).where(precision.table.notna(), None),
                                      "precision-table", filterable=len(precision.table) > 15)))
    if referee is not None:
        sections.append(("referee", "Referee", markdown_tables_html(referee.markdown)
                         + table_html(referee.table.astype(object).where(referee.table.notna(), None),
                                      "referee-table", filterable=True)))
    sections += [
        ("summary", "Summary", '<p class="muted">One row per label, suite and temperature (tables/summary.csv); '
                               "click a header to sort.</p>" + table_html(summary, "summary-table", filterable=True)),
        ("questions", "Per question", table_html(questions, "questions-table", filterable=True)),
        ("audit", "Losslessness audit", audit_html(summary, turns, baseline_label)),
        ("provenance", "Provenance", provenance_html(manifest)),
    ]
    path = run_dir / REPORT_FILE
    write_text_atomic(path, render_page(f"draftbench: {run_dir.name}", subtitle, sections))
    return path
