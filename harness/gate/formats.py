"""The output of ``draftbench compare`` (:mod:`harness.gate.compare`): the cells as a terminal table, Markdown for a
pull-request comment or ``$GITHUB_STEP_SUMMARY``, one JSON object, and one self-contained HTML page."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from harness.gate.compare import Comparison, Thresholds
from harness.measure import noise as NOISE
from harness.report.formatting import NA, interval, markdown_escape, markdown_table, missing, number, size
from harness.report.html import write_tables_page


def _arrow(b: Any, n: Any, spec: str, suffix: str = "") -> str:
    """BASE → NEW. Example: _arrow(3.1, 3.25, ".3f") -> "3.100 → 3.250"."""
    return f"{number(b, spec, suffix)} → {number(n, spec, suffix)}"


def _ci(g: Any, lo: Any, hi: Any) -> str:
    """A change with its CI, "n/a" alone when there is none.
    Example: _ci(1.02, 0.98, 1.07) -> "1.020 [0.980, 1.070]"."""
    return NA if missing(g) else interval(g, lo, hi, ".3f")


COLUMNS = ("cell", "method", "q", "τ BASE → NEW", "Δτ", "acc. rate BASE → NEW", "drafted/step BASE → NEW",
           "speed-up BASE → NEW", "Δ speed-up [95% CI]",
           "tok/s BASE → NEW", "Δ tok/s [95% CI]", "lossless", "quality", "outputs changed", "peak mem NEW",
           "J/token NEW", "tolerance", "verdict")


def table_rows(cmp: Comparison) -> list[list[str]]:
    """The cells as text rows in :data:`COLUMNS` order (the terminal and Markdown tables)."""
    out = []
    for r in cmp.rows:
        if r["status"] in ("missing", "new"):
            out.append([r["cell"], *["-"] * (len(COLUMNS) - 2), r["status"]])
            continue
        outputs = ("not gated" if r["turns_compared"] is None
                   else f"{r['turns_changed']}/{r['turns_compared']} turns")
        verdict = r["status"] + (f" ({', '.join(r['rules_failed'])})" if r["rules_failed"] else "")
        out.append([
            r["cell"], str(r["method"]), str(r["n_questions"]), _arrow(r["tau_base"], r["tau_new"], ".3f"),
            number(r["tau_change"] * 100 if not missing(r["tau_change"]) else None, "+.1f", "%"),
            _arrow(r["draft_acceptance_rate_base"], r["draft_acceptance_rate_new"], ".3f"),
            _arrow(r["drafted_per_step_base"], r["drafted_per_step_new"], ".2f"),
            _arrow(r["speedup_base"], r["speedup_new"], ".2f", "×"),
            _ci(r["speedup_change"], r["speedup_change_lo"], r["speedup_change_hi"]),
            _arrow(r["tokens_per_s_base"], r["tokens_per_s_new"], ".1f"),
            _ci(r["tokens_per_s_change"], r["tokens_per_s_change_lo"], r["tokens_per_s_change_hi"]),
            number(r["lossless_share_new"], ".2f"), _arrow(r["quality_base"], r["quality_new"], ".3f"),
            outputs, size(r["peak_memory_bytes_new"]), number(r["energy_per_token_j_new"], ".3g"),
            str(r.get("tolerance") or NA), verdict,
        ])
    return out


def _gated(th: Thresholds) -> str:
    parts = [f"outputs{'' if th.gate_outputs else ' (off: --no-outputs)'}", f"τ (drop > {th.tau_rtol:.1%})",
             f"speed-up (CI upper end < {1 - th.speed_tol:g})" if th.gate_speed else "not speed-up (--no-speed)",
             "lossless share", f"quality (drop > {th.quality_tol:g})", "errors", "missing cells/questions"]
    if th.tps_tol is not None:
        parts.append(f"tok/s (CI upper end < {1 - th.tps_tol:g})")
    parts.append(f"tolerances fitted on BASE's repeats where it has >= {NOISE.MIN_FIT_REPEATS}" if th.fit
                 else "fixed tolerances only (--no-fit)")
    if th.acceptance_rtol is not None:
        parts.append(f"acceptance within ±{th.acceptance_rtol:.1%} and per-position floors where exact gating does "
                     "not apply (other device or dtype, T > 0, engines)")
    return ", ".join(parts)


def _verdict(cmp: Comparison) -> str:
    n = len(cmp.failures)
    return "PASS" if not n else f"FAIL: {n} regression{'s' if n > 1 else ''}"


def format_text(cmp: Comparison) -> str:
    """Terminal report: sides, what is gated, the cell table, findings, warnings, verdict."""
    rows = [list(COLUMNS), *table_rows(cmp)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [f"BASE  {cmp.base.path}  ({cmp.base.describe()})", f"NEW   {cmp.new.path}  ({cmp.new.describe()})",
             f"gated on: {_gated(cmp.thresholds)}", ""]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    for f in cmp.findings:
        lines.append(f"{'FAIL' if f.fails else 'note'}  {f.cell}  {f.rule}: {f.message}")
    for w in cmp.warnings:
        lines.append(f"warning: {w}")
    lines.append(_verdict(cmp))
    return "\n".join(lines) + "\n"


def format_markdown(cmp: Comparison) -> str:
    """Markdown for a pull-request comment or ``$GITHUB_STEP_SUMMARY``."""
    lines = [f"### draftbench compare: {_verdict(cmp)}", "",
             f"- BASE `{cmp.base.path}`: {markdown_escape(cmp.base.describe())}",
             f"- NEW `{cmp.new.path}`: {markdown_escape(cmp.new.describe())}",
             f"- gated on: {markdown_escape(_gated(cmp.thresholds))}", "",
             *markdown_table(COLUMNS, [[markdown_escape(c) for c in r] for r in table_rows(cmp)], left=len(COLUMNS))]
    if cmp.findings:
        lines += ["", "**Findings**", ""]
        lines += [f"- {'❌ FAIL' if f.fails else 'ℹ️ note'} `{f.cell}` {f.rule}: {markdown_escape(f.message)}"
                  for f in cmp.findings]
    if cmp.warnings:
        lines += ["", "**Warnings**", ""] + [f"- {markdown_escape(w)}" for w in cmp.warnings]
    return "\n".join(lines) + "\n"


def _json_safe(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, str):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def to_json(cmp: Comparison) -> dict[str, Any]:
    """Everything as one JSON object: verdict, exit code, sides, thresholds, cells, findings, warnings."""
    side = lambda s: {"path": str(s.path), "kind": s.kind, "provenance": s.provenance,  # noqa: E731
                      "baseline_label": s.baseline_label}
    return _json_safe({
        "verdict": "pass" if not cmp.failures else "fail", "exit_code": cmp.exit_code,
        "base": side(cmp.base), "new": side(cmp.new), "thresholds": asdict(cmp.thresholds),
        "cells": cmp.rows, "findings": [asdict(f) for f in cmp.findings], "warnings": cmp.warnings,
    })


FORMATS = {"table": format_text, "markdown": format_markdown,
           "json": lambda cmp: json.dumps(to_json(cmp), indent=1, ensure_ascii=False) + "\n"}


def write_html(cmp: Comparison, path: str | Path) -> Path:
    """The comparison as one self-contained page (:func:`harness.report.html.write_tables_page`): the Markdown
    report (verdict, findings, warnings) as notes, then the cells and the findings as sortable tables."""
    findings = pd.DataFrame([asdict(f) for f in cmp.findings], columns=["cell", "rule", "message", "fails"])
    verdict = "PASS" if not cmp.failures else "FAIL"
    return write_tables_page(path, f"draftbench compare: {verdict}", {"Cells": pd.DataFrame(cmp.rows),
                                                                      "Findings": findings},
                             notes=format_markdown(cmp), subtitle=f"BASE {cmp.base.path} vs NEW {cmp.new.path}")
