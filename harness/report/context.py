"""The tables of a run with context-length buckets (:mod:`harness.run.context`): per (label, suite, temperature,
bucket) τ, draft and verify milliseconds per step, prefill, decode speed and the speed-ups with their CI, memory;
and per label the input length from which speculation stops paying (the crossover). Every number is a
:mod:`harness.measure` function; this module only selects and groups rows."""

from __future__ import annotations

import math

import pandas as pd

from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.records import baseline_labels
from harness.report.tables import GROUP, lists, max_value, measured_rows, summary_table


def has_context(turns: pd.DataFrame) -> bool:
    """Whether a run measured context-length buckets (records with ``context_bucket``, :mod:`harness.run.context`)."""
    return "context_bucket" in turns and bool(turns["context_bucket"].notna().any())


CONTEXT_COLUMNS = [
    *GROUP, "context_bucket", "prompt_tokens", "n_questions", "tau", "draft_ms_per_step", "verify_ms_per_step",
    "prefill_s", "tokens_per_s", "decode_tokens_per_s", "speedup", "speedup_gmean", "speedup_ci_lo", "speedup_ci_hi",
    "decode_speedup", "kv_cache_bytes", "draft_kv_bytes", "peak_memory_bytes",
]


def _step_ms(ok: pd.DataFrame, column: str) -> float:
    """Milliseconds of ``timing.<column>`` per verification step
    (:func:`harness.measure.acceptance.per_verification_step`); NaN when the turns carry no such timing (vanilla)."""
    if column not in ok:
        return math.nan
    totals = [v * 1000 if v is not None and not (isinstance(v, float) and math.isnan(v)) else None for v in ok[column]]
    return ACC.per_verification_step(totals, lists(ok["accept_lengths"]))


def _decode_tps(ok: pd.DataFrame) -> pd.Series:
    """question_id -> decode tokens/s [Q] (prefill left out, :func:`harness.measure.metrics.decode_tokens_per_second`)
    of one group's measured turns, pooled over each question's turns."""
    out = {qid: M.decode_tokens_per_second(list(q["new_tokens"]), list(q["wall_time_s"]), list(q["prefill_time_s"]))
           for qid, q in ok.groupby("question_id", sort=False)}
    return pd.Series(out, dtype=float)


def context_table(turns: pd.DataFrame, baseline_label: str = "vanilla", n_boot: int = 2000,
                  seed: int = 0) -> pd.DataFrame:
    """One row per (label, method, suite, temperature, context_bucket) of a run with context-length buckets: every
    bucket's numbers as :func:`summary_table` computes them for a suite (``tau``, ``acc@i``, ``tokens_per_s``,
    ``speedup`` and ``speedup_gmean`` with its bootstrap CI vs the baseline on the same prompts, peak memory),
    plus the mean ``prompt_tokens``, draft and verify milliseconds per verification step (``timings``), the mean
    ``prefill_s`` per turn, ``decode_tokens_per_s`` (mean over questions, prefill left out) and its
    ``decode_speedup`` (ratio of means), ``kv_cache_bytes`` (the target's KV cache at the longest turn's
    prompt + answer) and ``draft_kv_bytes`` (the drafter's own, the same way; NaN for a method without one).
    Empty when the run has no buckets."""
    if not has_context(turns):
        return pd.DataFrame(columns=CONTEXT_COLUMNS)
    measured = measured_rows(turns)
    bases = baseline_labels(turns, baseline_label)
    parts = []
    for bucket, sub in turns[turns["context_bucket"].notna()].groupby("context_bucket", sort=True):
        summary = summary_table(sub, baseline_label, n_boot=n_boot, seed=seed)
        ok_all = sub[measured.loc[sub.index]]
        extra = []
        for key, ok in ok_all.groupby(GROUP, dropna=False, sort=False):
            label, _, suite, temp = key
            base = ok_all[(ok_all["label"] == bases.get(label, baseline_label)) & (ok_all["suite"] == suite)
                          & (ok_all["temperature"] == temp)]
            decode = _decode_tps(ok)
            extra.append({
                **dict(zip(GROUP, key)),
                "prompt_tokens": float(pd.to_numeric(ok["prompt_tokens"]).mean()),
                "draft_ms_per_step": _step_ms(ok, "timing.draft_s"),
                "verify_ms_per_step": _step_ms(ok, "timing.verify_s"),
                "prefill_s": float(pd.to_numeric(ok["prefill_time_s"]).mean()),
                "decode_tokens_per_s": M.mean_tokens_per_second(decode),
                "decode_speedup": M.speedup_ratio_of_means(decode, _decode_tps(base)),
                "kv_cache_bytes": max_value(ok["kv_cache_bytes"]) if "kv_cache_bytes" in ok else math.nan,
                "draft_kv_bytes": max_value(ok["draft_kv_bytes"]) if "draft_kv_bytes" in ok else math.nan,
            })
        extra_columns = [*GROUP, *(c for c in CONTEXT_COLUMNS if c not in summary and c != "context_bucket")]
        merged = summary.merge(pd.DataFrame(extra, columns=extra_columns), on=GROUP, how="left")
        merged.insert(len(GROUP), "context_bucket", int(bucket))
        parts.append(merged)
    table = pd.concat(parts, ignore_index=True)
    acc = [c for c in table.columns if c.startswith("acc@")]
    split = CONTEXT_COLUMNS.index("tau") + 1
    return table[[*CONTEXT_COLUMNS[:split], *acc, *CONTEXT_COLUMNS[split:], "baseline"]]


def crossover_table(context: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, method, suite, temperature) of a context table, its baseline label left out: the input
    length at which its speed-up (``speedup_gmean``) falls below 1.0 for good
    (:func:`harness.measure.metrics.crossover_context`; None: not within the buckets measured) with that bucket's
    speed-up and 95% CI, whether the CI lies wholly below 1.0 there (``significant``), and the same crossing of the
    decode speed-up, prefill left out (``decode_crossover_bucket``): a long prompt's prefill, the same for every
    method, pulls every speed-up towards 1.0."""
    cols = [*GROUP, "crossover_bucket", "speedup_gmean", "speedup_ci_lo", "speedup_ci_hi", "significant",
            "decode_crossover_bucket"]
    rows = []
    for key, g in context.groupby(GROUP, dropna=False, sort=False):
        if (g["label"] == g["baseline"]).all():
            continue
        g = g.sort_values("context_bucket")
        bucket = M.crossover_context(list(g["context_bucket"]), list(g["speedup_gmean"]))
        at = g[g["context_bucket"] == bucket].iloc[0] if bucket is not None else None
        rows.append({**dict(zip(GROUP, key)), "crossover_bucket": bucket,
                     "speedup_gmean": at["speedup_gmean"] if at is not None else math.nan,
                     "speedup_ci_lo": at["speedup_ci_lo"] if at is not None else math.nan,
                     "speedup_ci_hi": at["speedup_ci_hi"] if at is not None else math.nan,
                     "significant": bool(at["speedup_ci_hi"] < 1.0) if at is not None else False,
                     "decode_crossover_bucket": M.crossover_context(list(g["context_bucket"]),
                                                                    list(g["decode_speedup"]))})
    return pd.DataFrame(rows, columns=cols)
