"""The report of a run with load levels (:mod:`harness.run.load`): its rows, one table, a Markdown section, plots.

Per (entry, concurrency), from the level's latest attempt (``load.jsonl``, :data:`LOAD_FILE`): requests and
failures; output tokens/s over the level's wall window (:func:`harness.measure.metrics.level_throughput`); time to
first token p50/p99; per-token latency p50/p95/p99 from every request's per-token arrival times
(:func:`harness.measure.metrics.per_token_latencies`, pooled over the level's requests; not per chunk) and how many
requests had chunk times split over several tokens; acceptance from the server's counters diffed around the whole
level (draft acceptance rate and vLLM's mean acceptance length, :func:`harness.measure.acceptance.draft_acceptance_rate`
and :func:`harness.measure.acceptance.mean_acceptance_length`); and, for every entry that speculates, the speed-up over
the ``vanilla`` entry at the same concurrency: the ratio of mean per-request tokens/s over the prompts both
measured, paired by prompt, with a bootstrap 95% CI from :data:`MIN_CI_REQUESTS` pairs up
(:func:`harness.measure.metrics.speedup_ratio_ci`), beside the ratio of the two levels' throughputs. The concurrency
at which speculation stops paying is :func:`harness.measure.metrics.stops_paying` of those speed-ups.

The throughput-interactivity frontier (vllm-project/speculators' plot): per level, output tokens/s against tokens/s
per user (:func:`harness.measure.metrics.tokens_per_user`, 1 / mean per-token latency), one curve per entry with
vanilla's, each point labelled with its concurrency and the level where an entry's speculation stops paying
marked (:func:`frontier_markdown`, :func:`plot_frontier`). A speculative entry's curve above and right of
vanilla's gives both more throughput and more interactivity; the crossover is where it falls inside.

The load report also checks the run's validity (:func:`harness.measure.validity.load_checks`: the eight load
conditions and the run's own) and writes ``report.html`` (:func:`write_load_report`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure import validity as V
from harness.measure.rundir import LOAD_FILE, atomic_file, read_run_file, run_subdir, write_text_atomic
from harness.report.formatting import interval, markdown_table, missing, number, ratio
from harness.report.html import REPORT_FILE, markdown_tables_html, plots_html, provenance_html, render_page, table_html

MIN_CI_REQUESTS = 8  # paired requests a level needs for a speed-up CI
SPLIT_NOTE = "chunks of several tokens"  # the served client's engine_notes phrase for split chunk times


def read_load_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of the run's ``load.jsonl``, in file order (a torn last line is skipped); [] without the file."""
    data = read_run_file(Path(run_dir) / LOAD_FILE)  # a link out of the run or a FIFO: RunFileError
    if data is None:
        return []
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def latest_levels(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(label, concurrency) -> the rows of that level's latest attempt (a level measured again on resume leaves its
    earlier attempt in the file). Example: rows of attempts a, a, b for (eagle3, 4) -> the row of b."""
    last: dict[tuple[str, int], str] = {}
    for r in rows:
        last[(r["label"], r["concurrency"])] = r["attempt"]
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["label"], r["concurrency"])
        if r["attempt"] == last[key]:
            out.setdefault(key, []).append(r)
    return out


def _baseline(levels: Mapping[tuple[str, int], list[dict]], baseline_label: str) -> str | None:
    """The label speed-ups are taken against: ``baseline_label`` when it is a measured vanilla entry, else the
    first vanilla entry; None without one."""
    vanilla = [label for (label, _), rows in levels.items() if rows and rows[0]["method"] == "vanilla"]
    return baseline_label if baseline_label in vanilla else (vanilla[0] if vanilla else None)


def _tps(rows: list[dict]) -> dict[str, float]:
    """question id -> that request's tokens/s, for the successful requests."""
    return {r["question_id"]: M.tokens_per_second(r["new_tokens"], r["wall_time_s"])
            for r in rows if r["status"] == "ok"}


def load_table(rows: list[dict[str, Any]], baseline_label: str = "vanilla") -> pd.DataFrame:
    """One row per (entry, concurrency) of the latest attempts (see the module docstring); times in seconds."""
    levels = latest_levels(rows)
    base = _baseline(levels, baseline_label)
    out = []
    for (label, c), level in levels.items():
        ok = [r for r in level if r["status"] == "ok"]
        gaps = [g for r in ok for g in M.per_token_latencies(r.get("token_times_s"))]
        ttft = [r["prefill_time_s"] for r in ok if r.get("prefill_time_s") is not None]
        counters = level[0].get("level_counters") or {}
        tput = M.level_throughput([r["new_tokens"] for r in ok], [r["sent_s"] for r in ok],
                                  [r["finished_s"] for r in ok])
        row = {"label": label, "method": level[0]["method"], "engine": level[0]["engine"], "concurrency": c,
               "request_rate": level[0]["request_rate"], "burstiness": level[0]["burstiness"],
               "requests": len(level), "failed": len(level) - len(ok), "output_tok_s": tput,
               "tokens_per_user": M.tokens_per_user(gaps),
               "ttft_p50_s": M.latency_percentiles(ttft, (50,))[0], "ttft_p99_s": M.latency_percentiles(ttft, (99,))[0],
               **dict(zip(("token_latency_p50_s", "token_latency_p95_s", "token_latency_p99_s"),
                          M.latency_percentiles(gaps), strict=True)),
               "split_requests": sum(any(SPLIT_NOTE in n for n in r.get("engine_notes") or []) for r in ok),
               "acceptance_rate": ACC.draft_acceptance_rate([counters.get("accepted_tokens")],
                                                          [counters.get("draft_tokens")]),
               "mean_acceptance_length": ACC.mean_acceptance_length([counters.get("accepted_tokens")],
                                                                  [counters.get("drafts")]),
               "baseline": None, "speedup": math.nan, "speedup_lo": math.nan, "speedup_hi": math.nan,
               "throughput_ratio": math.nan}
        if base is not None and label != base and (base, c) in levels:
            mine, theirs = _tps(level), _tps(levels[(base, c)])
            est, lo, hi = M.speedup_ratio_ci([(mine, theirs)])
            if len(set(mine) & set(theirs)) < MIN_CI_REQUESTS:
                lo = hi = math.nan
            other = [r for r in levels[(base, c)] if r["status"] == "ok"]
            base_tput = M.level_throughput([r["new_tokens"] for r in other], [r["sent_s"] for r in other],
                                           [r["finished_s"] for r in other])
            row.update(baseline=base, speedup=est, speedup_lo=lo, speedup_hi=hi, throughput_ratio=tput / base_tput)
        out.append(row)
    return pd.DataFrame(out).sort_values(["label", "concurrency"], kind="stable").reset_index(drop=True)


def crossings(table: pd.DataFrame) -> dict[str, tuple[int, bool] | None]:
    """label -> where its speculation stops paying (:func:`harness.measure.metrics.stops_paying`), for every
    entry with a speed-up."""
    out = {}
    for label, rows in table[table["speedup"].notna()].groupby("label", sort=False):
        out[label] = M.stops_paying(list(zip(rows["concurrency"], rows["speedup"], rows["speedup_lo"],
                                             rows["speedup_hi"], strict=True)))
    return out


def frontier_markdown(table: pd.DataFrame) -> str:
    """The report's "Frontier" subsection: per concurrency and entry, output tokens/s and tokens/s per user with
    TTFT and per-token latency percentiles beside them, the level where an entry stops paying marked."""
    stops = {label: where[0] for label, where in crossings(table).items() if where is not None}
    head = ["concurrency", "entry", "output tok/s", "tok/s per user", "TTFT p50 / p99 (ms)",
            "per-token p50 / p99 (ms)", "speed-up", ""]
    rows = [[str(r["concurrency"]), r["label"], number(r["output_tok_s"], ".1f"), number(r["tokens_per_user"], ".1f"),
             f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])}",
             f"{_ms(r['token_latency_p50_s'])} / {_ms(r['token_latency_p99_s'])}",
             "" if missing(r["baseline"]) else ratio(r["speedup"]),
             "stops paying" if stops.get(r["label"]) == r["concurrency"] else ""]
            for r in table.sort_values(["concurrency", "label"], kind="stable").to_dict("records")]
    return "\n".join(["### Frontier", "", "Output tokens/s (throughput) against tokens/s per user (interactivity, "
                      "1000 / mean per-token latency in ms) at each level; plots/load_frontier.png draws one curve "
                      "per entry.", "", *markdown_table(head, rows, left=2), ""]) + "\n"


def _ms(x: Any) -> str:
    return number(None if x is None else x * 1000.0, ".1f")


def load_markdown(table: pd.DataFrame) -> str:
    """The report's "Load" section: the table, where speculation stops paying, and how per-token latency was
    measured."""
    head = ["entry", "concurrency", "requests", "output tok/s", "TTFT p50 / p99 (ms)",
            "per-token p50 / p95 / p99 (ms)", "acceptance rate", "mean acc. length", "speed-up [95% CI]"]
    rows = [[r["label"], str(r["concurrency"]),
             f"{r['requests']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
             number(r["output_tok_s"], ".1f"), f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])}",
             f"{_ms(r['token_latency_p50_s'])} / {_ms(r['token_latency_p95_s'])} / {_ms(r['token_latency_p99_s'])}",
             number(r["acceptance_rate"]), number(r["mean_acceptance_length"]),
             "" if missing(r["baseline"]) else interval(r["speedup"], r["speedup_lo"], r["speedup_hi"])]
            for r in table.to_dict("records")]
    first = table.iloc[0]
    rate = "all at once" if first["request_rate"] is None or pd.isna(first["request_rate"]) else \
        f"{first['request_rate']:g} requests/s, burstiness {first['burstiness']:g}"
    lines = ["## Load", "", f"Requests sent {rate}, at most `concurrency` in flight; each request a distinct prompt "
             "(the first turn of a question), each level its own prompts (acceptance moves with them too). "
             "Speed-up: mean per-request tokens/s over the vanilla entry's at the same concurrency, paired by prompt "
             f"(CI from {MIN_CI_REQUESTS} pairs). Acceptance: the server's counters diffed around the whole level.",
             "", *markdown_table(head, rows, left=1), ""]
    if table["baseline"].isna().all() and (table["method"] != "vanilla").any():
        lines.append("- No vanilla entry measured these levels: no speed-up (pair each speculative entry with a "
                     "vanilla one on the same kind of server).")
    for label, where in crossings(table).items():
        if where is None:
            lines.append(f"- `{label}`: speculation pays at every concurrency measured.")
        else:
            c, sure = where
            r = table[(table["label"] == label) & (table["concurrency"] == c)].iloc[0]
            lines.append(f"- `{label}`: speculation stops paying at concurrency {c} (speed-up {ratio(r['speedup'])}"
                         + ("; its CI lies below 1" if sure else "; its CI reaches 1 or there are too few requests")
                         + ").")
    split, total = int(table["split_requests"].sum()), int((table["requests"] - table["failed"]).sum())
    lines.append(f"- Per-token latency is the gap between consecutive tokens' arrivals, pooled over a level's "
                 f"requests. {split} of {total} requests had chunks of several tokens, whose time the client split "
                 "evenly over them: the mean is exact, the percentiles are smoothed (a wait of g before k tokens "
                 "reads as k gaps of g / k, so p95/p99 understate the longest wait).")
    return "\n".join(lines) + "\n"


def plot_load(table: pd.DataFrame, plots: Path) -> dict[str, Path]:
    """Throughput, per-token latency p50 (solid) / p95 (dashed) and speed-up (with its CI) against concurrency,
    one line per entry (log-2 concurrency axis); the speed-up plot only where there is a speed-up."""
    paths = {}
    panels = [("load_throughput", "output tokens/s", [("output_tok_s", "-")]),
              ("load_latency", "per-token latency (ms)", [("token_latency_p50_s", "-"), ("token_latency_p95_s", "--")]),
              ("load_speedup", "speed-up over vanilla", [("speedup", "-")])]
    for name, ylabel, series in panels:
        data = table[table[series[0][0]].notna()]
        if data.empty:
            continue
        fig = Figure(figsize=(6.0, 4.0))
        ax = fig.subplots()
        for i, (label, rows) in enumerate(data.groupby("label", sort=False)):
            color = matplotlib.colormaps["tab10"](i % 10)  # one colour per entry, p50 and p95 alike
            for column, style in series:
                y = rows[column] * (1000.0 if column.endswith("_s") else 1.0)
                suffix = f" {column.split('_')[2]}" if column.startswith("token_latency") else ""
                if column == "speedup":
                    err = [(rows["speedup"] - rows["speedup_lo"]).fillna(0),
                           (rows["speedup_hi"] - rows["speedup"]).fillna(0)]
                    ax.errorbar(rows["concurrency"], y, yerr=err, linestyle=style, marker="o", capsize=3, label=label,
                                color=color)
                else:
                    ax.plot(rows["concurrency"], y, linestyle=style, marker="o", label=label + suffix, color=color)
        if name == "load_speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        levels = sorted(data["concurrency"].unique())
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
        fig.tight_layout()
        with atomic_file(plots / f"{name}.png") as tmp:
            fig.savefig(tmp, dpi=120)
        paths[f"plot_{name}"] = plots / f"{name}.png"
    return paths


def plot_frontier(table: pd.DataFrame, path: Path) -> Path | None:
    """The throughput-interactivity frontier: output tokens/s (y) against tokens/s per user (x), one curve per
    entry through its levels in concurrency order, each point labelled with its concurrency, the level where an
    entry stops paying ringed; None when no level has both figures."""
    data = table[table["output_tok_s"].notna() & table["tokens_per_user"].notna()]
    if data.empty:
        return None
    stops = {label: where[0] for label, where in crossings(table).items() if where is not None}
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for i, (label, rows) in enumerate(data.sort_values("concurrency").groupby("label", sort=False)):
        color = matplotlib.colormaps["tab10"](i % 10)
        ax.plot(rows["tokens_per_user"], rows["output_tok_s"], marker="o", color=color, label=label)
        for r in rows.to_dict("records"):
            ax.annotate(str(r["concurrency"]), (r["tokens_per_user"], r["output_tok_s"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4), color=color)
            if stops.get(label) == r["concurrency"]:
                ax.scatter([r["tokens_per_user"]], [r["output_tok_s"]], s=160, facecolors="none",
                           edgecolors="red", linewidths=1.5, zorder=3)
    if stops:
        ax.scatter([], [], s=160, facecolors="none", edgecolors="red", label="stops paying")
    ax.set_xlabel("tokens/s per user (1000 / mean per-token latency, ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput-interactivity frontier (labels: concurrency)", fontsize=10)
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120)
    return path


def _body(md: str) -> str:
    """A section's Markdown without its own first ``## `` heading (the page's section heading says it)."""
    first, _, rest = md.partition("\n")
    return rest if first.startswith("## ") else md


def write_load_report(run_dir: Path, baseline_label: str, title: str,
                      manifest: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """``tables/load.csv``, ``tables/validity.csv``, the plots (the frontier among them), ``tables/summary.md``
    (``title``, the Validity section, then the Load section with its Frontier) and ``report.html`` of a run with
    load levels; name -> path written. ``manifest``: the run's (its configuration and device, for the checks)."""
    manifest = manifest or {}
    rows = read_load_rows(run_dir)
    table = load_table(rows, baseline_label)
    checks = V.load_checks(rows, latest_levels(rows), manifest)
    tables, plots = run_subdir(run_dir, "tables"), run_subdir(run_dir, "plots")
    with atomic_file(tables / "load.csv") as tmp:
        table.to_csv(tmp, index=False)
    validity = pd.DataFrame([c.as_dict() for c in checks], columns=["name", "status", "detail", "scope"])
    with atomic_file(tables / "validity.csv") as tmp:
        validity.to_csv(tmp, index=False)
    md = tables / "summary.md"
    validity_md = V.validity_markdown(checks, gated=False)  # compare reads harness runs, not load levels
    load_md = load_markdown(table) + "\n" + frontier_markdown(table)
    write_text_atomic(md, f"{title}{validity_md}\n{load_md}")
    written = {"plot_load_frontier": plot_frontier(table, plots / "load_frontier.png"), **plot_load(table, plots)}
    written = {k: v for k, v in written.items() if v is not None}
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    subtitle = (f"target {config.get('target', '?')} · load levels · baseline {baseline_label} · "
                f"git {manifest.get('git_hash') or '?'} · {manifest.get('created', '')}")
    sections = [("validity", "Validity", markdown_tables_html(_body(validity_md))
                 + table_html(validity, "validity-table")),
                ("load", "Load", markdown_tables_html(_body(load_md))), ("plots", "Plots", plots_html(written)),
                ("table", "Every level", table_html(table.astype(object).where(table.notna(), None), "load-table",
                                                     filterable=len(table) > 15)),
                ("provenance", "Provenance", provenance_html(manifest))]
    page = run_dir / REPORT_FILE
    write_text_atomic(page, render_page(f"draftbench: {run_dir.name}", subtitle, sections))
    return {"load_csv": tables / "load.csv", "validity_csv": tables / "validity.csv", "summary_md": md,
            "report_html": page, **written}
