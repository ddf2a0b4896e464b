"""Ablations: knob columns, a per-entry ablation table and plots of every metric against a knob.

A *knob* is a method option (an ``opt.<name>`` column of the turns table, from the records' ``method_options``)
whose value differs between two labels of the same method, e.g. ``opt.mode`` in a ``--sweep jakiro.mode=hybrid,ar``
run, or ``opt.num_experts`` when the entries use heads with different expert counts (the Jakiro method records the
checkpoint's N). Knobs are found from the records only, never parsed back from labels.

``ablation_table`` has one row per (label, method, suite, temperature) of a drafting method, and per input length
(``context_bucket``) in a run with context-length buckets (:mod:`harness.run.context`), where the input length is a
knob of the table like the options (an x axis and a line of the plots: ``draft_window`` against the buckets, issue
#23 item 4): the knob values, τ with
its bootstrap CI (:func:`harness.measure.acceptance.tau_ci`), the speed-up (ratio of means) with its paired bootstrap CI
(:func:`harness.measure.metrics.speedup_ratio_ci`) against the baseline of the entry's own runtime
(:func:`harness.measure.records.baseline_labels`: ``vanilla@compiled`` for an entry measured compiled), acceptance
per draft position with its CI
(:func:`harness.measure.acceptance.acceptance_per_position_ci`), and per verification step the
draft forwards and the draft / verify / overhead milliseconds
(:func:`harness.measure.acceptance.per_verification_step`).

Plots put a knob X on the x axis, with one line per value of a second knob L where that gives two lines of at least
two points. Which entries a plot shows (:func:`plot_slice`): every other knob R must be at its reference value, where

- R is ignored when it is a function of X (``experts_per_tok`` = min(2, N) against ``num_experts``);
- when X is a function of R (R is finer, e.g. the ``head`` folder against ``num_experts``), R takes, for each value of
  X, its most common value among the entries with that X (ties: the first entry in run order);
- otherwise R takes its most common value over all the method's entries (ties: the first entry's).

So in the Jakiro paper's layout (N = 1..4 heads, plus ``mode=ar``, ``contrastive=off`` and a ``contrast_weight=0``
head at N = 2) the plot against ``num_experts`` shows the hybrid, contrastive entries of the heads trained alike, and
the plot against ``mode`` compares modes on the most used head. ``head`` itself is not an x axis when another knob
is a function of it (its recorded properties, such as ``num_experts``, are).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.records import baseline_labels
from harness.measure.rundir import atomic_file, file_stem, run_subdir
from harness.report.context import has_context
from harness.report.formatting import interval, markdown_table, number

OPT = "opt."
GROUP = ["label", "method", "suite", "temperature"]
HEAD_OPTION = "head"
BUCKET = "context_bucket"  # a run's input-length bucket: a knob of the ablation table, not a method option


def table_knobs(table: pd.DataFrame) -> list[str]:
    """The knob columns of an ablation table: its ``opt.*`` columns, then ``context_bucket`` when it has one."""
    return [c for c in table.columns if c.startswith(OPT)] + ([BUCKET] if BUCKET in table.columns else [])


def _cell(v: Any) -> Any:
    """A hashable, comparable form of an option value: lists / dicts as compact JSON text, NaN as None, and a whole
    float as an int (a column with a missing value turns 16 into 16.0)."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, separators=(",", ":"), sort_keys=True)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def label_options(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per label: ``label``, ``method`` and every ``opt.*`` column (the label's first record's value)."""
    cols = [c for c in turns.columns if c.startswith(OPT)]
    first = turns.drop_duplicates("label", keep="first")
    out = first[["label", "method", *cols]].copy()
    for c in cols:
        out[c] = out[c].map(_cell)
    return out.reset_index(drop=True)


def knob_names(turns: pd.DataFrame) -> list[str]:
    """The ``opt.*`` columns whose value differs between two labels of one method, in column order.
    Example: labels jakiro[mode=ar] and jakiro[mode=hybrid] with equal other options -> ["opt.mode"]."""
    opts = label_options(turns)
    out = []
    for c in [c for c in opts.columns if c.startswith(OPT)]:
        if any(g[c].nunique(dropna=False) > 1 for _, g in opts.groupby("method", sort=False)):
            out.append(c)
    return out


def ablated_options(config: Mapping[str, Any]) -> set[str]:
    """The options a run ablates: those of its ``sweep:`` grids (the manifest config's ``sweep_spec``, label ->
    option -> values) and those its ``ablate:`` field names. Example: sweep_spec [{"jakiro": {"mode": [...]}}],
    ablate ["lookup"] -> {"mode", "lookup"}; a run without either ablates nothing."""
    grids = config.get("sweep_spec") or []
    swept = {str(o) for g in grids if isinstance(g, Mapping) for opts in g.values() if isinstance(opts, Mapping)
             for o in opts}
    return swept | {str(o) for o in config.get("ablate") or []}


def ablation_turns(turns: pd.DataFrame, options: set[str]) -> pd.DataFrame:
    """``turns`` keeping, of the knob columns, only the ablated ``options`` and the knobs a kept knob determines
    within a method (``num_experts`` of a swept ``head``); the ablation tables and plots then show those only, not
    every option that merely differs between entries (eagle3 with and without ``lookup`` in one run)."""
    knobs = knob_names(turns)
    kept = {OPT + o for o in options} & set(knobs)
    opts = label_options(turns)
    for k in knobs:
        if k not in kept and any(_function_of(g[k], g[a]) for _, g in opts.groupby("method", sort=False)
                                 for a in kept if g[a].nunique(dropna=False) > 1):
            kept.add(k)
    return turns.drop(columns=[k for k in knobs if k not in kept])


def with_knobs(table: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """``table`` (a per-label table: questions, summary) with one column per knob, from the records' options,
    inserted after ``method``. Unchanged when the run has no knob."""
    knobs = knob_names(turns)
    if not knobs or table.empty:
        return table
    values = label_options(turns).set_index("label")[knobs]
    out = table.copy()
    at = list(out.columns).index("method") + 1 if "method" in out.columns else 0
    for i, k in enumerate(knobs):
        if k in out.columns:
            out = out.drop(columns=k)
        out.insert(at + i, k, out["label"].map(values[k]))
    return out


def _lists(col: pd.Series) -> list[list[int]]:
    return [list(v) if isinstance(v, (list, tuple, np.ndarray)) else [] for v in col]


def _column(g: pd.DataFrame, name: str) -> list:
    return list(g[name]) if name in g.columns else [None] * len(g)


def ablation_table(turns: pd.DataFrame, baseline_label: str = "vanilla", n_boot: int = 2000,
                   seed: int = 0) -> pd.DataFrame:
    """One row per (label, method, suite, temperature) of a method that drafted, and per ``context_bucket`` when
    the run has context-length buckets (the speed-up then against the baseline on the same bucket's prompts): knob
    values and every ablation number (see the module docstring). Empty when no method drafted. ``turns``: the
    measured turns (the report passes its measured rows: a question with an error turn is left out whole); error
    rows are skipped here too."""
    knobs = knob_names(turns)
    ok = turns[turns["status"] == "ok"]
    bases = baseline_labels(turns, baseline_label) if "runtime" in turns else {}
    depth = max((max(d) for d in _lists(ok["draft_depths"]) if d), default=0)
    buckets = has_context(ok)
    group = [*GROUP, BUCKET] if buckets else GROUP
    rows = []
    for key, g in ok.groupby(group, dropna=False, sort=False):
        label, _, suite, temp = key[:4]
        if not any(_lists(g["draft_depths"])):
            continue
        base_label = bases.get(label, baseline_label)  # the baseline of the entry's own runtime
        base = ok[(ok["label"] == base_label) & (ok["suite"] == suite) & (ok["temperature"] == temp)]
        if buckets:
            base = base[base[BUCKET].map(str) == str(key[4])]
        tps = {q: M.tokens_per_second(list(x["new_tokens"]), list(x["wall_time_s"]))
               for q, x in g.groupby("question_id", sort=False)}
        base_tps = {q: M.tokens_per_second(list(x["new_tokens"]), list(x["wall_time_s"]))
                    for q, x in base.groupby("question_id", sort=False)}
        per_q = [_lists(x["accept_lengths"]) for _, x in g.groupby("question_id", sort=False)]
        tau, tau_lo, tau_hi = ACC.tau_ci(per_q, n_boot=n_boot, seed=seed)
        sp, sp_lo, sp_hi = M.speedup_ratio_ci([(tps, base_tps)], n_boot=n_boot, seed=seed)
        lengths = _lists(g["accept_lengths"])
        ms = {name: [None if v is None or (isinstance(v, float) and math.isnan(v)) else 1000.0 * v
                     for v in _column(g, f"timing.{name}_s")] for name in ("draft", "verify", "overhead")}
        row = {**dict(zip(GROUP, key)),
               **{k: _cell(g[k].iloc[0]) for k in knobs},
               **({BUCKET: _cell(key[4])} if buckets else {}),
               "n_questions": len(per_q), "n_turns": len(g),
               "tau": tau, "tau_ci_lo": tau_lo, "tau_ci_hi": tau_hi,
               "speedup": sp, "speedup_ci_lo": sp_lo, "speedup_ci_hi": sp_hi,
               "tokens_per_s": M.mean_tokens_per_second(tps),
               "draft_forwards_per_step": ACC.per_verification_step(_column(g, "counter.draft_forwards"), lengths),
               "draft_ms_per_step": ACC.per_verification_step(ms["draft"], lengths),
               "verify_ms_per_step": ACC.per_verification_step(ms["verify"], lengths),
               "overhead_ms_per_step": ACC.per_verification_step(ms["overhead"], lengths)}
        by_q = list(g.groupby("question_id", sort=False))
        acc = ACC.acceptance_per_position_ci([_lists(x["accepted_drafts"]) for _, x in by_q],
                                           [_lists(x["draft_depths"]) for _, x in by_q], max_pos=depth,
                                           n_boot=n_boot, seed=seed)
        row.update({f"acc@{i + 1}": v for i, (v, _, _) in enumerate(acc)})
        row.update({f"acc@{i + 1}_ci_lo": lo for i, (_, lo, _) in enumerate(acc)})
        row.update({f"acc@{i + 1}_ci_hi": hi for i, (_, _, hi) in enumerate(acc)})
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------
# Which entries a plot shows
# ---------------------------------------------------------------------------------------------------------------


def _function_of(a: pd.Series, b: pd.Series) -> bool:
    """True when every value of ``b`` comes with one value of ``a`` (a is determined by b)."""
    return bool((pd.DataFrame({"a": a.map(str), "b": b.map(str)}).groupby("b")["a"].nunique() <= 1).all())


def _mode(values: pd.Series) -> Any:
    """Most common value, ties to the first one seen."""
    counts = values.map(str).value_counts(sort=False)
    best = counts.max()
    return next(v for v in values if counts[str(v)] == best)


def x_knobs(table: pd.DataFrame, knobs: Sequence[str]) -> list[str]:
    """Knobs worth an x axis: at least two values; not ``opt.head`` when another knob is a function of it; not a
    function of another (non-head) knob that has more values (``experts_per_tok`` against ``num_experts``)."""
    out = []
    for x in knobs:
        if table[x].map(str).nunique() < 2:
            continue
        others = [k for k in knobs if k != x]
        if x == OPT + HEAD_OPTION and any(_function_of(table[k], table[x]) and table[k].map(str).nunique() > 1
                                          for k in others):
            continue
        if any(k != OPT + HEAD_OPTION and _function_of(table[x], table[k]) and not _function_of(table[k], table[x])
               for k in others):
            continue
        out.append(x)
    return out


def plot_slice(table: pd.DataFrame, knobs: Sequence[str], x: str, line: str | None = None) -> pd.DataFrame:
    """The rows of one method's ablation table that a plot of ``x`` (one line per ``line`` value) shows: every
    other knob at its reference value (module docstring)."""
    keep = pd.Series(True, index=table.index)
    for r in [k for k in knobs if k not in (x, line)]:
        if _function_of(table[r], table[x]) or (line is not None and _function_of(table[r], table[line])):
            continue
        if _function_of(table[x], table[r]):
            ref = {str(xv): str(_mode(g[r])) for xv, g in table.groupby(table[x].map(str), sort=False)}
            keep &= table[r].map(str) == table[x].map(str).map(ref)
        else:
            keep &= table[r].map(str) == str(_mode(table[r]))
    return table[keep]


def _line_knob(table: pd.DataFrame, knobs: Sequence[str], x: str) -> str | None:
    """The first knob giving two or more lines of at least two points each against ``x``; None when none does."""
    for line in [k for k in x_knobs(table, knobs) if k != x]:
        if _function_of(table[line], table[x]) or _function_of(table[x], table[line]):
            continue
        sl = plot_slice(table, knobs, x, line)
        if sum(g[x].map(str).nunique() >= 2 for _, g in sl.groupby(sl[line].map(str))) >= 2:
            return line
    return None


def _x_positions(values: pd.Series) -> tuple[list[Any], dict[str, float], bool]:
    """Distinct x values in plot order, their positions and whether the axis is numeric."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct)
    if numeric:
        distinct = sorted(distinct)
        return distinct, {str(v): float(v) for v in distinct}, True
    return distinct, {str(v): float(i) for i, v in enumerate(distinct)}, False


def _name(knob: str) -> str:
    return knob[len(OPT):] if knob.startswith(OPT) else knob


def _series(sl: pd.DataFrame, x: str, line: str | None) -> list[tuple[str, pd.DataFrame]]:
    if line is None:
        return [("", sl)]
    return [(f"{_name(line)}={v}", g) for v, g in sl.groupby(sl[line].map(str), sort=False)]


def _lines(ax, sl: pd.DataFrame, x: str, line: str | None, y: str, lo: str | None = None, hi: str | None = None,
           style: str = "-", suffix: str = "") -> None:
    _, pos, _ = _x_positions(sl[x])
    for name, g in _series(sl, x, line):
        g = g.assign(_x=g[x].map(lambda v, pos=pos: pos[str(v)])).sort_values("_x")
        shown = f"{name}{suffix}" if name or suffix else None
        drawn = ax.plot(g["_x"], g[y], style, marker="o", label=shown)[0]
        if lo and hi and g[lo].notna().any():
            ax.fill_between(g["_x"], g[lo], g[hi], alpha=0.2, color=drawn.get_color())


def _axis(ax, sl: pd.DataFrame, x: str, ylabel: str) -> None:
    distinct, pos, _ = _x_positions(sl[x])
    ax.set_xticks([pos[str(v)] for v in distinct], [str(v) for v in distinct])
    ax.set_xlabel(_name(x))
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize="small")


def plot_knob(table: pd.DataFrame, knobs: Sequence[str], x: str, path: Path, title: str,
              baseline_label: str = "vanilla") -> Path | None:
    """τ, speed-up (both with 95% CI bands) and draft forwards per step against knob ``x``; None if < 2 points."""
    line = _line_knob(table, knobs, x)
    sl = plot_slice(table, knobs, x, line)
    if sl[x].map(str).nunique() < 2:
        return None
    fig = Figure(figsize=(13.0, 3.8))
    axes = fig.subplots(1, 3)
    _lines(axes[0], sl, x, line, "tau", "tau_ci_lo", "tau_ci_hi")
    _axis(axes[0], sl, x, "τ (tokens per target forward)")
    _lines(axes[1], sl, x, line, "speedup", "speedup_ci_lo", "speedup_ci_hi")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    _axis(axes[1], sl, x, f"speed-up vs {baseline_label}, same runtime (×)")
    _lines(axes[2], sl, x, line, "draft_forwards_per_step")
    _axis(axes[2], sl, x, "draft forwards per step")
    fig.suptitle(title + " — bands: 95% bootstrap CI over questions")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    return path


def plot_knob_acceptance(table: pd.DataFrame, knobs: Sequence[str], x: str, path: Path, title: str) -> Path | None:
    """Acceptance at each draft position against knob ``x`` (95% CI bands): one panel per line value, one line per
    position."""
    line = _line_knob(table, knobs, x)
    sl = plot_slice(table, knobs, x, line)
    positions = [c for c in sl.columns if c.startswith("acc@") and "_ci_" not in c and sl[c].notna().any()]
    if sl[x].map(str).nunique() < 2 or not positions:
        return None
    groups = _series(sl, x, line)
    fig = Figure(figsize=(4.6 * len(groups), 3.8))
    axes = np.atleast_1d(fig.subplots(1, len(groups)))
    for ax, (name, g) in zip(axes, groups):
        _, pos, _ = _x_positions(g[x])
        g = g.assign(_x=g[x].map(lambda v, pos=pos: pos[str(v)])).sort_values("_x")
        for c in positions:
            drawn = ax.plot(g["_x"], g[c], marker="o", label=f"position {c[4:]}")[0]
            if f"{c}_ci_lo" in g.columns:
                ax.fill_between(g["_x"], g[f"{c}_ci_lo"], g[f"{c}_ci_hi"], alpha=0.15, color=drawn.get_color())
        ax.set_ylim(0, 1.02)
        _axis(ax, g, x, "acceptance rate")
        if name:
            ax.set_title(name, fontsize="medium")
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    return path


def plot_knob_cost(table: pd.DataFrame, knobs: Sequence[str], x: str, path: Path, title: str) -> Path | None:
    """Draft (solid) and verify (dashed) milliseconds per verification step against knob ``x``."""
    line = _line_knob(table, knobs, x)
    sl = plot_slice(table, knobs, x, line)
    if sl[x].map(str).nunique() < 2 or not sl["draft_ms_per_step"].notna().any():
        return None
    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.subplots()
    _lines(ax, sl, x, line, "draft_ms_per_step", suffix=" draft")
    _lines(ax, sl, x, line, "verify_ms_per_step", style="--", suffix=" verify")
    _axis(ax, sl, x, "ms per verification step")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    return path


def ablation_pivots(table: pd.DataFrame, values: Sequence[str] = ("tau", "speedup")) -> list[tuple[str, pd.DataFrame]]:
    """Per method and x knob: (title, pivot) with the x knob's values as rows and the line knob's as columns (or one
    column), cells "τ / speed-up" of the entries a plot of that knob shows."""
    out = []
    knobs = table_knobs(table)
    for (method, suite, temp), t in table.groupby(["method", "suite", "temperature"], sort=False):
        mk = [k for k in knobs if t[k].map(str).nunique() > 1]
        for x in x_knobs(t, mk):
            line = _line_knob(t, mk, x)
            sl = plot_slice(t, mk, x, line)
            cells = sl.assign(_cell=[" / ".join(number(r[v]) for v in values) for _, r in sl.iterrows()])
            name = _name(line) if line else ""
            cols = (sl[line].map(lambda v, n=name: f"{n}={v}") if line
                    else pd.Series(" / ".join(values), index=sl.index))
            pivot = pd.DataFrame({"x": sl[x].map(str), "col": cols, "cell": cells["_cell"]}).pivot_table(
                index="x", columns="col", values="cell", aggfunc="first", sort=False)
            pivot.index.name, pivot.columns.name = _name(x), None
            out.append((f"{method}, {suite}, T={temp:g}: {' / '.join(values)} against {_name(x)}", pivot))
    return out


def write_ablation(run_dir: Path, turns: pd.DataFrame, baseline_label: str = "vanilla") -> dict[str, Path]:
    """``tables/ablation.csv`` and ``plots/ablation_<method>_<knob>[...].png`` when the run has knobs; {} otherwise."""
    if not knob_names(turns):
        return {}
    table = ablation_table(turns, baseline_label)
    if table.empty:
        return {}
    paths: dict[str, Path] = {}
    run_subdir(run_dir, "tables")
    run_subdir(run_dir, "plots")
    csv = run_dir / "tables" / "ablation.csv"
    with atomic_file(csv) as tmp:
        table.to_csv(tmp, index=False)
    paths["ablation_csv"] = csv
    groups = list(table.groupby(["method", "suite", "temperature"], sort=False))
    for (method, suite, temp), t in groups:
        knobs = [k for k in table_knobs(table) if t[k].map(str).nunique() > 1]
        tag = "" if len(groups) == 1 else f"_{suite}_T{temp:g}"
        for x in x_knobs(t, knobs):
            stem = file_stem(f"ablation_{method}_{_name(x)}{tag}")  # names from records stay in plots/
            title = f"{method} on {suite} (T={temp:g}) against {_name(x)}"
            for suffix, fn in (("", plot_knob), ("_acceptance", plot_knob_acceptance), ("_cost", plot_knob_cost)):
                args = (t, knobs, x, run_dir / "plots" / f"{stem}{suffix}.png", title)
                written = fn(*args, baseline_label) if fn is plot_knob else fn(*args)
                if written is not None:
                    paths[f"plot_{stem}{suffix}"] = written
    return paths


def ablation_markdown(turns: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """A Markdown table of the ablation (one row per drafting entry: its knobs, τ and speed-up with 95% CIs,
    acc@1, draft forwards and draft / verify ms per step), "" when the run has no knob. ``turns``: measured."""
    if not knob_names(turns):
        return ""
    table = ablation_table(turns, baseline_label)
    if table.empty:
        return ""
    knobs = table_knobs(table)
    head = ["label", *[_name(k) for k in knobs], "τ [95% CI]", f"speed-up vs {baseline_label} (same runtime) [95% CI]",
            "acc@1", "draft fwd / step", "draft ms / step", "verify ms / step"]
    rows = [[str(r["label"]), *[str(r[k]) for k in knobs],
             interval(r["tau"], r["tau_ci_lo"], r["tau_ci_hi"]),
             interval(r["speedup"], r["speedup_ci_lo"], r["speedup_ci_hi"]),
             number(r.get("acc@1")), number(r["draft_forwards_per_step"]), number(r["draft_ms_per_step"]),
             number(r["verify_ms_per_step"])] for r in table.to_dict("records")]
    lines = markdown_table(head, rows, left=1 + len(knobs))
    suites = ", ".join(f"{s} (T={t:g})" for s, t in dict.fromkeys(zip(table["suite"], table["temperature"])))
    return (f"**Ablation** ({suites}; knobs from the records' options; CIs: percentile bootstrap over questions)\n\n"
            + "\n".join(lines) + "\n")
