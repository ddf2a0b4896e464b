"""The precision matrix of a run with ``precisions`` (``harness/run/presets/precision.yaml``): what the target's
precision and the draft head's do to acceptance, speed and greedy output, one row per label.

A run with ``precisions`` measures every entry with the target in each precision (float32, bfloat16, float16, int8;
:func:`harness.models.with_precision`), and a head method's entries may set ``head_precision``
(:func:`harness.models.set_head_precision`). :func:`precision_table` gives, per label (suite, temperature):

- ``target_precision`` (the records' ``precision``; "as served (<engine>)" for an entry another engine ran on its
  own target, such as llama.cpp's server on the GGUF as shipped, ``engine_options: {launch: llama.cpp}``) and
  ``head_precision`` (the entry's option; empty for a head as loaded, in the target's dtype, and for a method
  without a head);
- τ, ``acc@i`` (acceptance per draft position), ``draft_acceptance_rate``, tokens/s and the speed-up, from the
  summary table (:func:`harness.report.tables.summary_table`), where speed-up and ``lossless_share`` are measured
  against the baseline at the same precision (``vanilla@int8`` for ``eagle2@int8``,
  :func:`harness.measure.records.baseline_labels`): the lossless share there says whether the method stays lossless
  in that precision;
- ``reference_share`` and ``reference_divergent``: the share and number of its turns whose greedy output equals /
  differs from the float32 reference (the baseline label itself: vanilla with the target in float32), and the first
  of those divergences (the lowest position; question, turn, both tokens and both logit margins there, the dtype's
  tie tolerance and the kind, :func:`harness.measure.metrics.divergence`): how far the precision moves the output
  of the model, and whether the first change was a near tie (rounding) or a confident change.

:func:`write_precision` writes ``tables/precision.csv`` and ``plots/precision.png`` (τ per label, one bar per target
precision) and returns the Markdown section of ``summary.md`` and ``report.html``; None for a run without
``precisions``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import metrics as M
from harness.measure.records import PRECISIONS, REFERENCE_PRECISION, label_precisions
from harness.measure.rundir import atomic_file
from harness.report.formatting import markdown_table
from harness.report.tables import GROUP, measured_rows

FIRST = ["first_question", "first_turn", "first_position", "first_token", "reference_token", "first_margin",
         "reference_margin", "first_tolerance", "first_kind"]
COLUMNS = ["label", "method", "suite", "temperature", "target_precision", "head_precision", "n_turns", "tau",
           "draft_acceptance_rate", "tokens_per_s", "speedup", "baseline", "lossless_share", "reference_share",
           "reference_divergent", *FIRST]


def has_precisions(turns: pd.DataFrame) -> bool:
    """Whether the run measured target precisions (its records name a ``precision``)."""
    return "precision" in turns and turns["precision"].notna().any()


def _head_precisions(turns: pd.DataFrame) -> dict[str, str]:
    """label -> its ``head_precision`` option; "" where it has none (a head as loaded, in the target's dtype, or a
    method without a head)."""
    if "opt.head_precision" not in turns:
        return {}
    return {label: str(g.dropna().iloc[0]) if g.notna().any() else ""
            for label, g in turns.groupby("label", sort=False)["opt.head_precision"]}


def precision_table(summary: pd.DataFrame, turns: pd.DataFrame, baseline_label: str = "vanilla") -> pd.DataFrame:
    """One row per row of ``summary`` (label, method, suite, temperature) of a run with precisions (see the module
    docstring for the columns), sorted by method, head precision (none first) and target precision (both in
    :data:`PRECISIONS`' order); empty (with :data:`COLUMNS` and the ``acc@i`` columns) for a run without them.
    ``turns``: the run's turns table; the float32 reference is ``baseline_label``'s rows (NaN columns when the run
    has none)."""
    acc_cols = [c for c in summary.columns if c.startswith("acc@")]
    if not has_precisions(turns) or summary.empty:
        return pd.DataFrame(columns=[*COLUMNS[:9], *acc_cols, *COLUMNS[9:]])
    precisions, heads = label_precisions(turns), _head_precisions(turns)
    ok = turns[measured_rows(turns)]
    rows = []
    for _, s in summary.iterrows():
        label, suite, temp = s["label"], s["suite"], s["temperature"]
        mine = ok[(ok["label"] == label) & (ok["suite"] == suite) & (ok["temperature"] == temp)]
        ref = ok[(ok["label"] == baseline_label) & (ok["suite"] == suite) & (ok["temperature"] == temp)]
        greedy = float(temp) == 0.0 and not ref.empty
        found = M.divergences(mine.to_dict("records"), ref.to_dict("records")) if greedy else []
        first = min(found, key=lambda d: (d["position"], str(d["question_id"]), d["turn"])) if found else None
        rows.append({
            **{k: s[k] for k in GROUP}, "target_precision": precisions.get(label) or _served(s),
            "head_precision": heads.get(label, ""), "n_turns": s.get("n_turns"), "tau": s.get("tau"),
            "draft_acceptance_rate": s.get("draft_acceptance_rate", math.nan),
            **{c: s[c] for c in acc_cols}, "tokens_per_s": s.get("tokens_per_s"), "speedup": s.get("speedup"),
            "baseline": s.get("baseline"), "lossless_share": s.get("lossless_share"),
            "reference_share": (M.lossless_share(mine.to_dict("records"), ref.to_dict("records")) if greedy
                                else math.nan),
            "reference_divergent": float(len(found)) if greedy else math.nan,
            **_first(first),
        })
    order = {p: i for i, p in enumerate(PRECISIONS)}
    out = pd.DataFrame(rows, columns=[*COLUMNS[:9], *acc_cols, *COLUMNS[9:]])
    methods = {m: i for i, m in enumerate(dict.fromkeys(out["method"]))}
    key = [(methods[m], order.get(h, -1 if h == "" else len(order)), order.get(p, len(order)), str(lb))
           for m, h, p, lb in zip(out["method"], out["head_precision"], out["target_precision"], out["label"])]
    return out.iloc[sorted(range(len(out)), key=key.__getitem__)].reset_index(drop=True)


def _served(row: pd.Series) -> str:
    """The target precision of a summary row whose records name none: the float32 reference on the harness engine,
    else "as served (<engine>)" (another engine's own target, such as the GGUF's Q4_1 kernels in llama.cpp)."""
    engine = row.get("engine")
    return REFERENCE_PRECISION if engine in (None, "harness") or pd.isna(engine) else f"as served ({engine})"


def _first(d: dict | None) -> dict:
    """The :data:`FIRST` columns of one divergence of :func:`harness.measure.metrics.divergences` (None: none)."""
    if d is None:
        return {c: None for c in FIRST}
    return {"first_question": str(d["question_id"]), "first_turn": d["turn"], "first_position": d["position"],
            "first_token": d["token"], "reference_token": d["baseline_token"], "first_margin": d["method_margin"],
            "reference_margin": d["baseline_margin"], "first_tolerance": d["tolerance"], "first_kind": d["kind"]}


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else str(v)


def precision_markdown(table: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """The ``## Precision matrix`` Markdown section of ``table`` (:func:`precision_table`); "" when it is empty."""
    if table.empty:
        return ""
    acc = [c for c in table.columns if c.startswith("acc@")][:3]
    head = ["label", "target", "head", "τ", *acc, "speed-up", "lossless vs same precision",
            f"= fp32 {baseline_label}", "first divergence from fp32 (pos, margins ours / ref, kind)"]
    lines = ["## Precision matrix", "",
             f"Target precision x head precision. Speed-up and lossless share: against {baseline_label} at the same "
             f"target precision; `= fp32 {baseline_label}`: share of turns whose greedy output equals the float32 "
             "reference's; the first divergence from it with both logit margins (top-1 minus top-2).", ""]
    rows = []
    for _, r in table.iterrows():
        first = ("none" if pd.isna(r["first_position"]) and r["reference_divergent"] == 0 else "n/a"
                 if pd.isna(r["first_position"]) else
                 f"q{r['first_question']} t{int(r['first_turn'])} @{int(r['first_position'])}: "
                 f"{_fmt(r['first_margin'])} / "
                 f"{_fmt(r['reference_margin'])}, {r['first_kind']}")
        cells = [r["label"], PRECISIONS.get(r["target_precision"], r["target_precision"]), r["head_precision"] or "—",
                 _fmt(r["tau"], 2), *(_fmt(r[c], 2) for c in acc), _fmt(r["speedup"], 2),
                 _fmt(r["lossless_share"], 2), _fmt(r["reference_share"], 2), first]
        rows.append([str(c) for c in cells])
    return "\n".join([*lines, *markdown_table(head, rows, left=3)]) + "\n"


def plot_precision(table: pd.DataFrame, path: Path) -> Path | None:
    """τ per entry (its label without the precision suffix) with one bar per target precision; None when no row
    has a τ."""
    data = table[table["tau"].notna()]
    if data.empty:
        return None
    suffixes = tuple(f"@{short}" for short in PRECISIONS.values())
    base = [lb[: -len(next(s for s in suffixes if lb.endswith(s)))] if lb.endswith(suffixes) else lb
            for lb in data["label"]]
    data = data.assign(entry=base)
    entries = list(dict.fromkeys(data["entry"]))
    precisions = [p for p in PRECISIONS if p in set(data["target_precision"])]
    fig = Figure(figsize=(max(6.0, 0.8 * len(entries) + 2), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(precisions))
    for i, p in enumerate(precisions):
        rows = data[data["target_precision"] == p].groupby("entry")["tau"].mean()
        ax.bar(np.arange(len(entries)) + (i - (len(precisions) - 1) / 2) * width,
               [rows.get(e, np.nan) for e in entries], width, label=f"target {PRECISIONS[p]}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(np.arange(len(entries)), [e[:40] for e in entries], rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title("Precision matrix: τ per entry and target precision")
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


@dataclass
class PrecisionReport:
    """What :func:`write_precision` wrote: the table, its Markdown section and the files."""

    table: pd.DataFrame
    markdown: str
    paths: dict[str, Path] = field(default_factory=dict)


def write_precision(summary: pd.DataFrame, turns: pd.DataFrame, baseline_label: str, tables: Path,
                    plots: Path) -> PrecisionReport | None:
    """``tables/precision.csv`` and ``plots/precision.png`` of a run with precisions; None for any other run."""
    if not has_precisions(turns):
        return None
    table = precision_table(summary, turns, baseline_label)
    paths = {}
    with atomic_file(tables / "precision.csv") as tmp:
        table.to_csv(tmp, index=False)
    paths["precision_csv"] = tables / "precision.csv"
    plot = plot_precision(table, plots / "precision.png")
    if plot is not None:
        paths["precision_plot"] = plot
    return PrecisionReport(table, precision_markdown(table, baseline_label), paths)
