"""The Markdown of a run's ``tables/summary.md`` (besides its provenance header, :mod:`harness.report.report`):
the paper table (labels × suites, cells "speed-up× / τ"), the per-category leaderboard pivot, the greedy
divergence note, the note on records left out and the headroom section (ledger and time breakdown). A label that is a
bound rather than a method (the ``oracle``) carries "‡" wherever it appears. Numbers read as
:mod:`harness.report.formatting` says; every number comes from the tables of :mod:`harness.report.tables`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from harness.measure import acceptance as ACC
from harness.measure import headroom as HR
from harness.measure import metrics as M
from harness.measure.records import RecordsRead
from harness.report.formatting import (
    interval,
    markdown_escape,
    markdown_table,
    missing,
    number,
    ratio,
    size,
    speedup_tau,
)
from harness.report.tables import max_value, sum_values, summary_runtimes


def category_markdown(categories: pd.DataFrame, summary: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """Markdown pivot per (suite, temperature): labels × categories plus the suite's overall, cells "speed-up× / τ"
    (Spec-Bench's leaderboard layout for the spec_bench suite). Empty text when no suite has categories."""
    if categories.empty:
        return ""
    parts = []
    for (suite, temp), at in categories.groupby(["suite", "temperature"], sort=False):
        cats = list(dict.fromkeys(at["category"]))
        table = []
        for label in _row_order(at, baseline_label):
            rows = at[at["label"] == label].set_index("category")
            overall = summary[(summary["label"] == label) & (summary["suite"] == suite)
                              & (summary["temperature"] == temp)]
            cells = [speedup_tau(rows.at[c, "speedup"], rows.at[c, "tau"]) if c in rows.index else "" for c in cats]
            cells.append(speedup_tau(overall["speedup"].iloc[0], overall["tau"].iloc[0]) if len(overall) else "")
            table.append([f"{label}{not_deployable_mark(summary[summary['label'] == label])}", *cells])
        lines = [f"**{suite}, temperature {temp:g}, per category** — speed-up vs `{baseline_label}` × / τ", "",
                 *markdown_table(["method", *map(str, cats), "overall"], table)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def acceptance_markdown(summary: pd.DataFrame) -> str:
    """Markdown table of the acceptance figures as engines report them, one row per drafting (label, suite,
    temperature): the engine, τ, vLLM's / AIPerf's mean acceptance length, the draft acceptance rate, drafted tokens
    per drafting step and the accepted drafts terminal steps lost to a cut (definitions and terminal-step conventions:
    :mod:`harness.measure.metrics`), then what each engine's acceptance counts (the summary's ``acceptance_from``).
    Empty text when no row drafted."""
    if "drafted_per_step" not in summary:
        return ""
    rows = summary[summary["drafted_per_step"].notna()]
    if rows.empty:
        return ""
    table = [[str(r["label"]) + (" ‡" if not_deployable(r.get("deployable")) else ""),
              str(r.get("engine") or "harness"), str(r["suite"]), f"{float(r['temperature']):g}",
              number(r["tau"]), number(r["mean_acceptance_length"]), number(r["draft_acceptance_rate"], ".3f"),
              number(r["drafted_per_step"]), number(r["drafts_cut"], ".0f")] for _, r in rows.iterrows()]
    lines = ["**Acceptance as engines report it** — mean acceptance length = 1 + accepted / drafting steps "
             "(vLLM, AIPerf); rate = accepted / drafted tokens (a tree: its depth); terminal steps count their "
             "verdict before a cut at EOS or the budget, τ what they emitted", "",
             *markdown_table(["method", "engine", "suite", "T", "τ", "mean acc. length", "draft acc. rate",
                              "drafted/step", "drafts cut"], table, left=4)]
    if "acceptance_from" in rows:
        sources = dict.fromkeys((str(r.get("engine") or "harness"), r["acceptance_from"]) for _, r in rows.iterrows()
                                if isinstance(r["acceptance_from"], str))
        if sources:
            lines += ["", "What each engine's acceptance counts:", ""]
            lines += [f"- {engine}: {source}" for engine, source in sources]
    return "\n".join(lines) + "\n"


def collapse_warnings(summary: pd.DataFrame) -> list[str]:
    """One line per (label, suite, temperature) of a run's summary whose speculation collapsed
    (:func:`harness.measure.acceptance.acceptance_collapsed`: drafts proposed, acc@1 under
    :data:`harness.measure.acceptance.COLLAPSE_ACC1`), naming the label and the likely causes; [] when none did.
    Example: eagle2 on tiny at T = 0 with acc@1 0.01 and 3 drafted tokens per step -> ["warning: acceptance collapse:
    eagle2 (tiny, T=0) accepted its first draft token in 1.0% of drafting steps (floor 5%) while proposing 3.00
    drafted tokens per step; ... likely causes: ..."]."""
    if "acc@1" not in summary or "drafted_per_step" not in summary:
        return []
    return [f"warning: acceptance collapse: {r['label']} ({r['suite']}, T={float(r['temperature']):g}) accepted its "
            f"first draft token in {float(r['acc@1']):.1%} of drafting steps (floor {ACC.COLLAPSE_ACC1:.0%}) while "
            f"proposing {float(r['drafted_per_step']):.2f} drafted tokens per step, so speculation is likely slower "
            f"than none; likely causes: {'; '.join(ACC.COLLAPSE_CAUSES)}"
            for r in summary.to_dict("records") if ACC.acceptance_collapsed(r["acc@1"], r["drafted_per_step"])]


def collapse_note(summary: pd.DataFrame) -> str:
    """:func:`collapse_warnings` as a Markdown block above the paper table (empty text when none collapsed)."""
    lines = collapse_warnings(summary)
    if not lines:
        return ""
    return "\n".join(["**Warning: acceptance collapse**", "", *[f"- {line}" for line in lines]]) + "\n\n"


def divergence_note(divergence: pd.DataFrame) -> str:
    """Markdown lines under the paper table when some greedy turn differs from the baseline (empty otherwise)."""
    if divergence.empty:
        return ""
    lines = ["", "**Greedy divergence from the baseline** (first differing token; logit margin = top-1 minus top-2 "
                 "of the target in each run; a tie is within the dtype's rounding noise, see "
                 "`harness/measure/metrics.py` `tie_tolerance`):", ""]
    for label, g in divergence.groupby("label", sort=False):
        counts = g["kind"].value_counts()
        lines.append(f"- {markdown_escape(label)}: {len(g)} turn(s) differ: {int(counts.get('tie', 0))} tie(s) within "
                     f"noise, {int(counts.get('disagreement', 0))} disagreement(s), {int(counts.get('unknown', 0))} "
                     "without margins")
    return "\n".join(lines) + "\n"


def _row_order(summary: pd.DataFrame, baseline_label: str) -> list[str]:
    labels = list(dict.fromkeys(summary["label"]))
    bases = set(summary["baseline"]) if "baseline" in summary else set()
    return sorted(labels, key=lambda lab: lab not in bases | {baseline_label})


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
    runtimes = summary_runtimes(summary)
    lossy = oracle = False
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
            table = []
            for label in _row_order(at, baseline_label):
                rows = at[at["label"] == label]
                mark = ""
                if rows["lossless"].eq(False).any():
                    mark, lossy = " †", True
                mark += not_deployable_mark(rows)
                oracle = oracle or bool(mark.endswith("‡"))
                cells = [f"{label}{mark}"]
                for suite in suites:
                    r = rows[rows["suite"] == suite]
                    cells.append(speedup_tau(r["speedup"].iloc[0], r["tau"].iloc[0]) if len(r) else "")
                cells.append(speedup_tau(M.suite_mean(rows["speedup"]), M.suite_mean(rows["tau"])))
                if versus:
                    cells.append(ratio(M.suite_mean(rows["speedup_vs_eager"])))
                table.append(cells)
            lines = [f"{head} — cells: speed-up vs `{base}` (ratio of mean tokens/s on the same questions) × / τ "
                     "(mean accepted length per target forward, bonus token included)"
                     + (f"; last column: mean speed-up vs eager `{baseline_label}`" if versus else ""), "",
                     *markdown_table(["method", *suites, "mean", *(["vs eager"] if versus else [])], table)]
            if versus:
                lines += ["", _compile_note(at)]
            parts.append("\n".join(lines))
    text = "\n\n".join(parts) + "\n"
    if lossy:
        text += ("\n† not lossless: its output is not guaranteed to equal the target's greedy output (T = 0) or "
                 "to follow the target's distribution (T > 0).\n")
    if oracle:
        text += f"\n{NOT_DEPLOYABLE}\n"
    return text


def _compile_note(rows: pd.DataFrame) -> str:
    """One line under a compiled runtime's table: each label's compile time (warm-up, outside every turn's wall time)
    and, if any, compilation left inside measured turns. Example: "Compilation (warm-up, not in any turn's time):
    vanilla@compiled 61.2 s, pld@compiled 75.0 s." """
    parts, inside = [], []
    for label, g in rows.groupby("label", sort=False):
        parts.append(f"{markdown_escape(label)} {number(max_value(g['compile_s']), '.1f', ' s')}")
        left = sum_values(g["turn_compile_s"])
        if left == left and left > 0:
            inside.append(f"{markdown_escape(label)} {left:.1f} s")
    text = "Compilation (warm-up, not in any turn's time): " + ", ".join(parts) + "."
    if inside:
        text += " Still inside measured turns (their speed is not steady-state): " + ", ".join(inside) + "."
    return text


def records_note(found: RecordsRead, run_dir: Path, summary: pd.DataFrame | None = None) -> str:
    """A Markdown line on what reading the records left out (lines that are unreadable, not valid records or
    duplicates: :func:`harness.measure.records.load_records`; superseded attempts, incomplete questions, answers
    that failed to score); "" when nothing was. Example: "- records: 1 bad line skipped (records.jsonl:5); 2
    incomplete questions left out"."""
    parts = []
    if found.bad_lines:
        where = [b.split(": ", 1)[0].removeprefix(f"{run_dir}{os.sep}") for b in found.bad_lines]
        more = f", and {len(where) - 5} more" if len(where) > 5 else ""
        s = "s" if len(where) > 1 else ""
        parts.append(f"{len(where)} bad line{s} skipped ({', '.join(where[:5])}{more}; the warnings say why)")
    if found.superseded:
        parts.append(f"{found.superseded} records of superseded attempts left out")
    if found.incomplete:
        s = "s" if len(found.incomplete) > 1 else ""
        parts.append(f"{len(found.incomplete)} incomplete question{s} left out (resume the run to finish them)")
    if summary is not None and "n_score_errors" in summary and summary["n_score_errors"].sum():
        parts.append(f"{int(summary['n_score_errors'].sum())} answers failed to score (score_error); the quality of "
                     "their groups is n/a")
    return f"- records: {'; '.join(parts)}\n" if parts else ""


def context_markdown(context: pd.DataFrame, crossover: pd.DataFrame, baseline_label: str = "vanilla") -> str:
    """Markdown of a run with context-length buckets (:func:`harness.report.context.context_table`), per (suite,
    temperature): labels × input lengths, cells "speed-up× [95% CI] / τ" (geometric mean of per-prompt speed-ups
    with its bootstrap CI), and the input length at which the speed-up falls below 1.0
    (:func:`harness.report.context.crossover_table`); then prefill and decode per input length. Empty text when the
    run has no buckets."""
    if context.empty:
        return ""
    parts = []
    for (suite, temp), at in context.groupby(["suite", "temperature"], sort=False):
        buckets = sorted(at["context_bucket"].unique())
        cross = crossover[(crossover["suite"] == suite) & (crossover["temperature"] == temp)].set_index("label")
        table, detail = [], []
        for label in _row_order(at, baseline_label):
            rows = at[at["label"] == label].set_index("context_bucket")
            cells = [f"{_speedup_ci(rows.loc[b])} / {number(rows.loc[b, 'tau'])}" if b in rows.index else ""
                     for b in buckets]
            crossing, decode = "(baseline)", ""
            if label in cross.index:
                c = cross.loc[label]
                crossing = ("not within these lengths" if pd.isna(c["crossover_bucket"])
                            else f"{int(c['crossover_bucket'])} ({_speedup_ci(c)})")
                decode = ("not within these lengths" if pd.isna(c["decode_crossover_bucket"])
                          else str(int(c["decode_crossover_bucket"])))
            table.append([label, *cells, crossing, decode])
            for b, r in rows.iterrows():
                detail.append([label, str(int(b)), number(r["prompt_tokens"], ".0f"), number(r["prefill_s"], ".3f"),
                               number(r["tokens_per_s"], ".1f"), number(r["decode_tokens_per_s"], ".1f"),
                               ratio(r["decode_speedup"]), number(r["draft_ms_per_step"], ".1f"),
                               number(r["verify_ms_per_step"], ".1f"), size(r["kv_cache_bytes"]),
                               size(r["draft_kv_bytes"])])
        parts.append("\n".join([
            f"**{suite}, temperature {temp:g}, against input length** — speed-up vs `{at['baseline'].iloc[0]}` "
            "(geometric mean over prompts) × [95% CI] / τ; last columns: the input length from which the speed-up "
            "stays below 1.0, and from which the decode speed-up (prefill left out) does", "",
            *markdown_table(["method", *(f"{int(b)} tokens" for b in buckets), "speed-up < 1.0 from",
                             "decode speed-up < 1.0 from"], table), "",
            f"**{suite}, temperature {temp:g}, prefill and decode per input length** — tokens/s with prefill (all "
            "tokens over the whole turn) and without (decode: `harness.measure.metrics.decode_tokens_per_second`), "
            "draft and verify time per verification step, the target's KV cache and the draft head's own at the turn's "
            "length", "",
            *markdown_table(["method", "input", "prompt tokens", "prefill s", "tok/s", "decode tok/s",
                             "decode speed-up", "draft ms/step", "verify ms/step", "KV cache", "draft KV"], detail)]))
    return "\n\n".join(parts) + "\n"


def _speedup_ci(row: pd.Series) -> str:
    """A row's geometric-mean speed-up with its 95% CI. Example: 1.42, 1.30, 1.55 -> "1.42 [1.30, 1.55]×"."""
    return interval(row["speedup_gmean"], row["speedup_ci_lo"], row["speedup_ci_hi"]) + "×"


NOT_DEPLOYABLE = ("‡ not deployable: an oracle that knows the target's greedy continuation (an untimed greedy pass of "
                  "the same turn); a bound, not a method.")


def not_deployable(flag) -> bool:
    """Whether a ``deployable`` cell says False (None or NaN: a table made before the column: deployable)."""
    return not missing(flag) and not bool(flag)


def not_deployable_mark(rows: pd.DataFrame) -> str:
    """" ‡" for the rows of a label whose ``deployable`` column says False (the ``oracle``), else ""."""
    return " ‡" if "deployable" in rows and rows["deployable"].eq(False).any() else ""


def headroom_markdown(headroom: pd.DataFrame) -> str:
    """The report's headroom section (:func:`harness.report.tables.headroom_table`), per row (label, suite,
    temperature): the ledger, measured speed-up S, free-draft bound and oracle bound S* each with its 95% CI, then
    where the time goes (shares of the wall time; the share of verification work spent on rejected slots), energy
    per token and per accepted draft token, and the cost of a million tokens at the user's price. Definitions:
    docs/reference.md#headroom and :mod:`harness.measure.metrics`. Empty text for an empty table."""
    if headroom.empty:
        return ""
    ledger, where = [], []
    for _, r in headroom.iterrows():
        name = f"{r['label']}{' ‡' if not_deployable(r.get('deployable')) else ''}"
        key = [name, str(r["suite"]), f"{float(r['temperature']):g}"]
        oracle = "" if missing(r["oracle_label"]) else f" ({r['oracle_label']})"
        ledger.append([*key, interval(r["speedup"], r["speedup_ci_lo"], r["speedup_ci_hi"]),
                       interval(r["free_draft_speedup"], r["free_draft_ci_lo"], r["free_draft_ci_hi"]),
                       interval(r["oracle_speedup"], r["oracle_ci_lo"], r["oracle_ci_hi"]) + oracle])
        where.append([*key, *(number(r[f"share_{p}"], ".1%") for p in HR.TIME_PARTS),
                      number(r["rejected_verify_share"], ".1%"), number(r["energy_per_token_j"], ".3g"),
                      number(r["energy_per_accepted_token_j"], ".3g"), str(r["energy_source"]),
                      number(r["cost_per_million_tokens"], ".2f")])
    notes = sorted({str(n) for n in headroom["timing_note"] if not missing(n)})
    lines = ["**Headroom** — speed-up vs the baseline (ratio of mean tokens/s on the same questions) × [95% CI, "
             "bootstrap over questions]: measured S; free-draft bound (the same accepted lengths, drafting at zero "
             "cost); oracle bound S* (the `oracle` entry named, ‡: it drafts the target's own greedy continuation at "
             "its budget, measured; temperature 0 only)", "",
             *markdown_table(["method", "suite", "T", "S", "free-draft bound", "S* (oracle)"], ledger, left=3), "",
             "**Where the time goes** — shares of the wall time (the engine's synchronised marks; prefill, draft, "
             "verify, host overhead in the step loop, other = outside it); rejected = share of the verified slots "
             "(root included) that were not accepted; energy in J per token and per accepted draft token; $ per "
             "million tokens at the given price per hour (batch 1)", "",
             *markdown_table(["method", "suite", "T", "prefill", "draft", "verify", "overhead", "other",
                              "rejected", "J/token", "J/accepted", "energy from", "$/1M tokens"], where, left=3)]
    lines += [f"- {n}" for n in notes] if notes else []
    if headroom["deployable"].eq(False).any():
        lines += ["", NOT_DEPLOYABLE]
    return "\n".join(lines) + "\n"
