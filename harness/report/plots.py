"""A run's matplotlib figures (``plots/*.png`` of :mod:`harness.report.report`): speed-up, τ and tokens/s per
suite as grouped bars, the accepted-length histogram, the acceptance rate per draft position, the headroom ledger and
where the time goes. Every value comes
from the tables of :mod:`harness.report.tables`; a plot with nothing to show is not written (its function returns
None). Figures are drawn on :class:`matplotlib.figure.Figure` directly, so no global pyplot state or display is
needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import acceptance as ACC
from harness.measure import headroom as HR
from harness.measure.rundir import atomic_file
from harness.report.tables import lists, measured_rows, summary_runtimes

HIST_COLUMNS = 3  # panels per row of the accepted-length histogram


PLOT_LABEL = 60  # characters of a label shown in a legend or title (a 100,000-character label stalled the layout)


def _series_name(label: str, temperature: float, temperatures: Sequence[float]) -> str:
    """A series' name in a legend or title: its label, cut to :data:`PLOT_LABEL` characters (ending in "…"), and its
    temperature when the run has several."""
    label = str(label)
    label = label if len(label) <= PLOT_LABEL else label[:PLOT_LABEL - 1] + "…"
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
    return _save(fig, path)


def plot_speedup(summary: pd.DataFrame, path: Path, baseline_label: str = "vanilla") -> Path | None:
    """Grouped bars of the speed-up (ratio of means) per suite; None when there is no baseline. With several
    runtimes each label is compared with its own runtime's baseline (the summary's ``baseline`` column)."""
    versus = baseline_label if summary_runtimes(summary) == ["eager"] else f"{baseline_label} of the same runtime"
    return _grouped_bars(summary, "speedup", f"speed-up vs {versus} (×)", "Speed-up per suite", path, 1.0)


def plot_tau(summary: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars of tau per suite."""
    return _grouped_bars(summary, "tau", "τ (tokens per target forward)", "Mean accepted length per suite", path,
                         1.0)


def plot_tokens_per_s(summary: pd.DataFrame, path: Path) -> Path | None:
    """Grouped bars of mean tokens/s per suite."""
    return _grouped_bars(summary, "tokens_per_s", "tokens / s (mean over questions)", "Throughput per suite", path)


def _drafting(turns: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, float]], list[float]]:
    """The measured turns, the (label, temperature) pairs among them that drafted at least once (vanilla-like
    methods excluded) and those pairs' temperatures, sorted."""
    ok = turns[measured_rows(turns)]
    series = [(label, temp) for (label, temp), g in ok.groupby(["label", "temperature"], sort=False)
              if any(lists(g["draft_depths"]))]
    return ok, series, sorted({t for _, t in series})


def plot_accept_histogram(turns: pd.DataFrame, path: Path) -> Path | None:
    """Share of verification steps by tokens appended (accepted + bonus), all suites pooled: one panel per drafting
    method (label and temperature), up to :data:`HIST_COLUMNS` panels a row, all on the same axes so that the panels
    read side by side; each panel titled with its method and the histogram's mean (tokens per verification step,
    :func:`harness.measure.acceptance.tau_spec_bench`)."""
    ok, series, temps = _drafting(turns)
    if not series:
        return None
    turn_lengths = {s: lists(ok[(ok["label"] == s[0]) & (ok["temperature"] == s[1])]["accept_lengths"])
                    for s in series}
    hists = {s: ACC.accept_length_histogram(turn_lengths[s]) for s in series}
    lengths = list(range(1, max(n for h in hists.values() for n in h) + 1)) if any(hists.values()) else [1]
    cols = min(len(series), HIST_COLUMNS)
    rows = -(-len(series) // cols)
    fig = Figure(figsize=(3.2 * cols + 0.6, 2.6 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
    colors = matplotlib.colormaps["tab10" if len(series) <= 10 else "tab20"]
    for i, (s, ax) in enumerate(zip(series, axes)):
        total = sum(hists[s].values())
        shares = [hists[s].get(n, 0) / total if total else 0.0 for n in lengths]  # [L]
        ax.bar(lengths, shares, 0.8, color=colors(i % colors.N))
        mean = ACC.tau_spec_bench({0: turn_lengths[s]})  # the histogram's mean: tokens per verification step
        ax.set_title(f"{_series_name(*s, temps)}  (mean {mean:.2f})", fontsize=11)
        ax.set_xticks(lengths)
        ax.tick_params(labelsize=10)
        ax.grid(axis="y", linewidth=0.5, alpha=0.5)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    for ax in axes[max(len(series) - cols, 0):len(series)]:  # the lowest panel of each column
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("tokens per step (accepted + 1)", fontsize=10)
    for ax in axes[::cols]:
        ax.set_ylabel("share of steps", fontsize=10)
    fig.suptitle("Accepted-length histogram (all suites)", fontsize=12)
    return _save(fig, path)


def plot_acceptance_per_position(turns: pd.DataFrame, path: Path) -> Path | None:
    """Per-position acceptance rate (harness.measure.acceptance.acceptance_per_position), one line per drafting
    method."""
    ok, series, temps = _drafting(turns)
    if not series:
        return None
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    _style_series(ax, len(series))
    for label, temp in series:
        g = ok[(ok["label"] == label) & (ok["temperature"] == temp)]
        rates = ACC.acceptance_per_position(lists(g["accepted_drafts"]), lists(g["draft_depths"]))
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=_series_name(label, temp, temps))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance per draft position (all suites)")
    _legend(ax, len(series))
    return _save(fig, path)


def plot_referee(panels: Sequence[tuple[str, Sequence[float], Sequence[float]]], path: Path) -> Path | None:
    """Acceptance per draft position of each engine entry next to the harness entry it is held against
    (:mod:`harness.report.referee`), one panel per pair: ``panels`` = [(title, engine rates, harness rates)]. None
    when there is no pair or no pair drafted."""
    panels = [p for p in panels if len(p[1]) or len(p[2])]
    if not panels:
        return None
    fig = Figure(figsize=(4.0 * len(panels) + 1.0, 3.6))
    for ax, (title, engine, harness) in zip(np.atleast_1d(fig.subplots(1, len(panels), sharey=True)), panels):
        for rates, name, style in ((engine, "engine", "o-"), (harness, "harness", "s--")):
            ax.plot(range(1, len(rates) + 1), rates, style, label=name)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1.02)
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="small")
    fig.axes[0].set_ylabel("acceptance rate")
    fig.suptitle("Referee: acceptance per draft position, engine vs harness")
    return _save(fig, path)


def plot_context(context: pd.DataFrame, path: Path, baseline_label: str = "vanilla") -> Path | None:
    """Four panels against input length (:func:`harness.report.context.context_table`, log-2 x axis, one line per
    label and temperature, every suite pooled into its own lines): the speed-up (geometric mean with its 95% CI as
    error bars, 1.0 dashed), τ, draft and verify milliseconds per verification step (solid and dotted), and decode
    tokens/s (prefill left out). None when the run has no buckets."""
    if context.empty:
        return None
    series = list(dict.fromkeys(zip(context["label"], context["suite"], context["temperature"])))
    temps = sorted(context["temperature"].unique())
    suites = list(dict.fromkeys(context["suite"]))
    fig = Figure(figsize=(11.0, 8.0))
    axes = fig.subplots(2, 2).ravel()
    for ax in axes:
        _style_series(ax, len(series))
    for label, suite, temp in series:
        g = context[(context["label"] == label) & (context["suite"] == suite)
                    & (context["temperature"] == temp)].sort_values("context_bucket")
        name = _series_name(label, temp, temps) + (f" [{suite}]" if len(suites) > 1 else "")
        x = g["context_bucket"].to_numpy(dtype=float)                       # [B]
        y = g["speedup_gmean"].to_numpy(dtype=float)                        # [B]
        err = np.abs(np.vstack([y - g["speedup_ci_lo"].to_numpy(dtype=float),
                                g["speedup_ci_hi"].to_numpy(dtype=float) - y]))  # [2, B]
        line = axes[0].errorbar(x, y, yerr=np.nan_to_num(err), marker="o", capsize=3, label=name)
        color = line[0].get_color()
        axes[1].plot(x, g["tau"], marker="o", color=color, label=name)
        axes[2].plot(x, g["draft_ms_per_step"], marker="o", color=color, label=f"{name} draft")
        axes[2].plot(x, g["verify_ms_per_step"], marker="s", linestyle=":", color=color, label=f"{name} verify")
        axes[3].plot(x, g["decode_tokens_per_s"], marker="o", color=color, label=name)
    axes[0].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    titles = [(f"speed-up vs {baseline_label} (×, 95% CI)", "Speed-up against input length"),
              ("τ (tokens per target forward)", "Mean accepted length"),
              ("ms per verification step", "Draft (solid) and verify (dotted) time per step"),
              ("decode tokens / s (prefill left out)", "Decode throughput")]
    buckets = sorted(context["context_bucket"].unique())
    for ax, (ylabel, title) in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(buckets, [str(int(b)) for b in buckets])
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    _legend(axes[0], len(series))
    return _save(fig, path)


def _headroom_rows(headroom: pd.DataFrame, column: str) -> pd.DataFrame | None:
    """The rows of a headroom table other than the baselines' whose ``column`` has a value, each with its x label
    in ``name`` ("label [suite, T]" where the run has several suites or temperatures; "‡" on a label that is not
    deployable); None when no row has one (n/a is never drawn as 0)."""
    rows = headroom[headroom["label"] != headroom["baseline"]]
    several = rows["suite"].nunique() > 1 or rows["temperature"].nunique() > 1
    names = [f"{r['label']}{'' if bool(r['deployable']) else ' ‡'}"
             + (f"\n{r['suite']}, T={float(r['temperature']):g}" if several else "") for _, r in rows.iterrows()]
    rows = rows.assign(name=names)
    rows = rows[rows[column].notna()]
    return None if rows.empty else rows


def plot_headroom(headroom: pd.DataFrame, path: Path) -> Path | None:
    """The headroom ledger (:func:`harness.report.tables.headroom_table`): per method (and suite, temperature) three
    bars, the measured speed-up S, the free-draft bound and the oracle bound S*, each with its 95% CI as an error
    bar, 1.0 dashed. None when no row has a speed-up."""
    rows = _headroom_rows(headroom, "speedup")
    if rows is None:
        return None
    x = np.arange(len(rows))                                                 # [R]
    fig = Figure(figsize=(max(6.0, 1.1 * len(rows) + 2.0), 4.2))
    ax = fig.subplots()
    bars = (("speedup", "speedup_ci", "measured S"), ("free_draft_speedup", "free_draft_ci", "free-draft bound"),
            ("oracle_speedup", "oracle_ci", "oracle bound S* (not deployable)"))
    for i, (value, ci, name) in enumerate(bars):
        y = rows[value].to_numpy(dtype=float)                                # [R]
        err = np.abs(np.vstack([y - rows[f"{ci}_lo"].to_numpy(dtype=float),
                                rows[f"{ci}_hi"].to_numpy(dtype=float) - y]))  # [2, R]
        ax.bar(x + (i - 1) * 0.27, y, 0.27, yerr=np.nan_to_num(err), capsize=3, label=name)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, list(rows["name"]))
    ax.set_ylabel("speed-up vs baseline (×, 95% CI)")
    ax.set_title("Headroom: measured speed-up, free-draft bound, oracle bound")
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_time_breakdown(headroom: pd.DataFrame, path: Path) -> Path | None:
    """Where the time goes (:func:`harness.measure.headroom.time_breakdown`): one stacked bar per method (and suite,
    temperature) with a synchronised split, the shares of prefill, draft, verify, host overhead and other; above each
    bar the share of verified slots that were rejected. None when no row has a split (n/a is never drawn as 0)."""
    rows = _headroom_rows(headroom, "share_draft")
    if rows is None:
        return None
    x = np.arange(len(rows))                                                 # [R]
    fig = Figure(figsize=(max(6.0, 1.0 * len(rows) + 2.5), 4.2))
    ax = fig.subplots()
    bottom = np.zeros(len(rows))                                             # [R]
    for part in HR.TIME_PARTS:
        share = rows[f"share_{part}"].to_numpy(dtype=float)                  # [R]
        ax.bar(x, share, 0.6, bottom=bottom, label=part)
        bottom += share
    for xi, top, rejected in zip(x, bottom, rows["rejected_verify_share"]):
        if rejected == rejected:
            ax.annotate(f"rejected {rejected:.0%}", (xi, top), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(x, list(rows["name"]))
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("share of wall time")
    ax.set_title("Where the time goes (rejected: share of verified slots not accepted)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _save(fig, path)


def plot_scaling(table: pd.DataFrame, path: Path) -> Path | None:
    """The data-scaling curve (:mod:`harness.train.scaling`'s tidy table): held-out top-1 draft accuracy against
    training tokens (log x), one line per draft position and objective (colour = position, line style and marker =
    objective), and beside it τ against training tokens, one line per objective, when any point has τ. None when
    the table is empty."""
    if table.empty:
        return None
    objectives = list(dict.fromkeys(table["objective"]))
    positions = sorted(table["position"].unique())
    has_tau = table["tau"].notna().any()
    fig = Figure(figsize=(11.0 if has_tau else 6.5, 4.2))
    axes = np.atleast_1d(fig.subplots(1, 2 if has_tau else 1))
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    colors = matplotlib.colormaps["tab10"]
    for i, objective in enumerate(objectives):
        marker, line = styles[i % len(styles)]
        g = table[table["objective"] == objective]
        for j, pos in enumerate(positions):
            s = g[g["position"] == pos].sort_values("train_tokens")
            name = f"position {pos}" + (f" ({objective})" if len(objectives) > 1 else "")
            axes[0].plot(s["train_tokens"], s["acc"], marker=marker, linestyle=line, color=colors(j % 10), label=name)
        if has_tau:
            s = g[g["position"] == positions[0]].sort_values("train_tokens")
            axes[1].plot(s["train_tokens"], s["tau"], marker=marker, linestyle=line, label=objective)
    axes[0].set_ylabel("top-1 draft accuracy (held-out)")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_title("Held-out accuracy per draft position" + (f" ({objectives[0]})" if len(objectives) == 1 else ""))
    _legend(axes[0], len(objectives) * len(positions))
    if has_tau:
        axes[1].set_ylabel("τ (tokens per target forward)")
        axes[1].set_title("Mean accepted length")
        axes[1].legend(fontsize="small")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    """Lay ``fig`` out and write it to ``path`` whole (:func:`harness.measure.rundir.atomic_file`)."""
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path
