"""Every reported metric is defined once, with its formula in its docstring, in this module or one of its three
siblings: here throughput, speed-ups and their bootstrap CIs, memory, quality, losslessness and greedy divergence,
and the load levels' latency and throughput; τ and acceptance in :mod:`harness.measure.acceptance`; headroom, time,
energy and cost in :mod:`harness.measure.headroom`; run-to-run noise in :mod:`harness.measure.noise`.

Pure functions on plain Python / numpy / pandas inputs (no torch, no model). The raw counters they consume are the
fields of a turn record (see :mod:`harness.measure.records` and :class:`harness.engine.method.Generation`):

* ``accept_lengths``: tokens appended per target forward; element 0 is the prefill (1 token), each later element
  is one verification step (accepted drafts + 1 bonus token, cut at EOS / the token budget).
* ``accepted_drafts`` / ``draft_depths``: per verification step, the draft tokens accepted (uncut) and the depth of
  the draft that was proposed.

Conventions, stated once so that no script can drift from them:

* Tokens are always counted from token ids (``new_tokens == len(output_ids)``), for the baseline and every method.
* tau (mean accepted length) includes the bonus token and counts the prefill as a step, so vanilla is exactly 1.0.
* A terminal step (cut at EOS or the token budget) counts what it emitted in τ and the histogram, and the verifier's
  verdict before the cut in the acceptance rates (:func:`harness.measure.acceptance.drafts_before_cut` says which
  metric takes which).
* A speed-up compares a method with the baseline on the same questions only (paired on question ids).
* Missing measurements are ``None`` / NaN and are skipped, never read as zero.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

Number = int | float
PerQuestion = Mapping[Any, float] | pd.Series

# a turn is compared with the baseline's turn that has the same values of these record fields
LOSSLESS_KEY = ("suite", "question_id", "turn", "temperature", "seed")


def as_list(x: Number | Sequence[Number] | None) -> list:
    """A scalar becomes a one-element list; a sequence / array / Series becomes a plain list."""
    if x is None or isinstance(x, (int, float, np.integer, np.floating)):
        return [x]
    return list(x)


def is_missing(x: Any) -> bool:
    """True for None and NaN (how a record says "not measured")."""
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def tokens_per_second(new_tokens: Number | Sequence[Number], wall_time_s: Number | Sequence[Number]) -> float:
    """Throughput = Σ new_tokens / Σ wall_time_s (a pooled ratio, not a mean of per-turn ratios), prefill included
    (:func:`decode_tokens_per_second` is the rate without it).

    Called with one turn's numbers it gives that turn's rate; called with the turns of one question it gives the
    question's rate, which is what the papers average over questions. NaN when there is no time to divide by.
    Example: turns with (new, wall) = (100, 2.0) and (50, 0.5) -> 150 / 2.5 = 60.0 tokens/s.
    """
    tokens, times = as_list(new_tokens), as_list(wall_time_s)
    if len(tokens) != len(times):
        raise ValueError(f"tokens_per_second: new_tokens has {len(tokens)} values but wall_time_s has {len(times)}")
    pairs = [(n, t) for n, t in zip(tokens, times) if not is_missing(n) and not is_missing(t)]
    total_t = sum(t for _, t in pairs)
    if not pairs or total_t <= 0:
        return math.nan
    return sum(n for n, _ in pairs) / total_t


def decode_tokens_per_second(new_tokens: Number | Sequence[Number], wall_time_s: Number | Sequence[Number],
                             prefill_time_s: Number | Sequence[Number | None]) -> float:
    """Decode throughput, prefill left out = Σ (new_tokens − 1) / Σ (wall_time_s − prefill_time_s), pooled like
    :func:`tokens_per_second` (which is the throughput *with* prefill: every token over the whole wall time).

    The prefill forward produces a turn's first token, so that token and the prefill's time both leave the ratio;
    what remains is the rate of the decoding (or verification) steps, which a long prompt's prefill would otherwise
    hide. Turns without a prefill time or without tokens are skipped; NaN when no decode time remains.
    Example: (new, wall, prefill) = (33, 2.0, 1.0) and (17, 1.5, 0.5) -> (32 + 16) / (1.0 + 1.0) = 24.0 tokens/s.
    """
    tokens, times, prefills = as_list(new_tokens), as_list(wall_time_s), as_list(prefill_time_s)
    if not len(tokens) == len(times) == len(prefills):
        raise ValueError(f"decode_tokens_per_second: {len(tokens)} new_tokens, {len(times)} wall times and "
                         f"{len(prefills)} prefill times")
    rows = [(n - 1, t - p) for n, t, p in zip(tokens, times, prefills)
            if not (is_missing(n) or is_missing(t) or is_missing(p)) and n >= 1]
    decode_s = sum(t for _, t in rows)
    return sum(n for n, _ in rows) / decode_s if rows and decode_s > 0 else math.nan


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, bytes_per_value: int) -> int:
    """Bytes of a full-attention KV cache holding ``positions`` tokens = 2 (K and V) x layers x kv_heads x
    head_dim x positions x bytes per value.
    Example: SmolLM2-135M (30 layers, 3 kv heads, head_dim 64) at 4096 positions in float32 -> 2 * 30 * 3 * 64 *
    4096 * 4 = 188,743,680 bytes (180 MiB)."""
    return 2 * layers * kv_heads * head_dim * positions * bytes_per_value


def draft_kv_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, bytes_per_value: int,
                   window: int = 0) -> int:
    """Bytes of a draft head's own KV cache (the *stable* KV an EAGLE-style head keeps for the committed positions,
    EAGLE-1 arXiv:2401.15077 Sec. 3.1; Jakiro's heads alike) when the context holds ``positions`` tokens: the
    :func:`kv_cache_bytes` of the head's layers over the positions it keeps, all of them, or with a draft attention
    window W > 0 (option ``draft_window``) the last W. A separate draft model (SpS, arXiv:2211.17192) adds one call
    per group of layers that keep the same window (full layers: 0).
    Example: a one-layer head shaped like SmolLM2-135M's layers (3 kv heads, head_dim 64) at 4096 positions in
    float32 -> 2 * 1 * 3 * 64 * 4096 * 4 = 6,291,456 bytes (6 MiB); with window 512 -> 786,432 bytes."""
    return kv_cache_bytes(layers, kv_heads, head_dim, min(positions, window) if window else positions, bytes_per_value)


def crossover_context(buckets: Sequence[int], speedups: Sequence[float]) -> int | None:
    """The input length at which speculation stops paying: the shortest bucket whose speed-up is below 1.0 with
    every longer bucket below 1.0 too (a bucket without a speed-up, NaN, is skipped). None when the longest measured
    bucket still has a speed-up >= 1.0 (no crossover in range) or nothing was measured.
    Examples: buckets [512, 2048, 4096] with speed-ups [1.4, 0.9, 0.8] -> 2048; [1.4, 0.9, 1.1] -> None;
    [0.9, 0.8, 0.7] -> 512 (below 1.0 from the shortest bucket on).
    """
    if len(buckets) != len(speedups):
        raise ValueError(f"crossover_context: {len(buckets)} buckets but {len(speedups)} speed-ups")
    measured = sorted((b, s) for b, s in zip(buckets, speedups) if not is_missing(s))
    crossing = None
    for bucket, speedup in reversed(measured):
        if speedup >= 1.0:
            break
        crossing = bucket
    return crossing


def paired(method_tps: PerQuestion, baseline_tps: PerQuestion) -> tuple[np.ndarray, np.ndarray]:
    """Method and baseline values ``[Q]`` for the questions both have measured (positive, finite), in key order."""
    m, b = pd.Series(dict(method_tps), dtype=float), pd.Series(dict(baseline_tps), dtype=float)
    both = pd.concat([m.rename("m"), b.rename("b")], axis=1, join="inner")
    both = both[np.isfinite(both["m"]) & np.isfinite(both["b"]) & (both["m"] > 0) & (both["b"] > 0)]
    both = both.sort_index(key=lambda idx: idx.map(str))
    return both["m"].to_numpy(), both["b"].to_numpy()


def mean_tokens_per_second(per_question_tps: PerQuestion | Sequence[float]) -> float:
    """Mean over questions of each question's tokens/s (see :func:`tokens_per_second`), unmeasured ones skipped.

    This is the "tokens/s" column of the summary and the numerator of the papers' speed-up. NaN when no question
    was measured. Example: {a: 30.0, b: 10.0, c: NaN} -> 20.0.
    """
    values = per_question_tps.values() if isinstance(per_question_tps, Mapping) else per_question_tps
    present = [float(v) for v in values if not is_missing(v)]
    return sum(present) / len(present) if present else math.nan


def suite_mean(values: Iterable[float | None]) -> float:
    """Equal-weight mean over suites (the "mean" column of the paper table), NaN / None skipped.

    Every suite weighs the same whatever its number of questions, as the EAGLE/Jakiro scripts average their six
    datasets. Example: speed-ups [2.0, 3.0, NaN] -> 2.5.
    """
    present = [float(v) for v in values if not is_missing(v)]
    return sum(present) / len(present) if present else math.nan


def speedup_ratio_of_means(method_tps: PerQuestion, baseline_tps: PerQuestion) -> float:
    """Speed-up as the papers report it: mean tokens/s of the method ÷ mean tokens/s of the baseline.

    Both means run over the SAME questions: the inputs map question id -> that question's tokens/s, and a
    question missing (or not measured) on either side is dropped from both. NaN when no question is shared.
    Example: method {a: 30, b: 10, c: 99}, baseline {a: 10, b: 10} -> c dropped -> mean(30, 10) / mean(10, 10) = 2.0.
    """
    m, b = paired(method_tps, baseline_tps)
    return mean_tokens_per_second(list(m)) / mean_tokens_per_second(list(b)) if len(m) else math.nan


def speedup_geomean(method_tps: PerQuestion, baseline_tps: PerQuestion, n_boot: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of per-question speed-ups with a percentile-bootstrap 95% CI: ``(gmean, lo, hi)``.

    r_q = method_tps[q] / baseline_tps[q] over the shared questions; gmean = exp(mean_q log r_q). The CI resamples
    questions with replacement ``n_boot`` times (numpy generator seeded with ``seed``, so it is reproducible) and
    takes the 2.5th and 97.5th percentiles of the resampled gmeans. Unlike the ratio of means, one long question
    cannot dominate it. Example: ratios 2 and 8 -> gmean 4.0. NaN triple when no question is shared.
    """
    if n_boot < 1:
        raise ValueError(f"speedup_geomean: n_boot must be >= 1, got {n_boot}")
    m, b = paired(method_tps, baseline_tps)
    if not len(m):
        return math.nan, math.nan, math.nan
    logr = np.log(m / b)                                   # [Q]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(logr), size=(n_boot, len(logr)))  # [n_boot, Q]
    boot = np.exp(logr[idx].mean(axis=1))                  # [n_boot]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.exp(logr.mean())), float(lo), float(hi)


def speedup_ratio_ci(groups: Sequence[tuple[PerQuestion, PerQuestion]], n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """A speed-up as the papers report it, with a percentile-bootstrap 95% CI: ``(estimate, lo, hi)``.

    ``groups`` are ``(method_tps, baseline_tps)`` pairs (question id -> tokens/s), one per suite or category. The
    estimate is the equal-weight mean over groups (:func:`suite_mean`) of each group's
    :func:`speedup_ratio_of_means`; with one group it is that group's ratio of means. Each of the ``n_boot``
    replicates resamples, within every group, its shared questions with replacement (method and baseline values of
    a question stay paired) and recomputes the estimate; lo / hi are the 2.5th / 97.5th percentiles. Groups with no
    shared question are left out. Example: one group, method {a: 20, b: 40}, baseline {a: 10, b: 10} -> estimate
    30 / 10 = 3.0; resamples {a,a}, {a,b}, {b,b} give 2.0, 3.0, 4.0, so 2.0 <= lo <= 3.0 <= hi <= 4.0.
    """
    if n_boot < 1:
        raise ValueError(f"speedup_ratio_ci: n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    estimates, boots = [], []
    for method_tps, baseline_tps in groups:
        m, b = paired(method_tps, baseline_tps)
        if not len(m):
            continue
        estimates.append(m.mean() / b.mean())
        idx = rng.integers(0, len(m), size=(n_boot, len(m)))      # [n_boot, Q]
        boots.append(m[idx].mean(axis=1) / b[idx].mean(axis=1))   # [n_boot]
    if not estimates:
        return math.nan, math.nan, math.nan
    lo, hi = np.percentile(np.mean(boots, axis=0), [2.5, 97.5])
    return float(np.mean(estimates)), float(lo), float(hi)


def measured_vs_reported(measured: float | None, reported: float | None) -> tuple[float, float]:
    """How a measured number compares with a published one: ``(delta, ratio)`` = (measured − reported,
    measured / reported). NaN where either is missing (or, for the ratio, the reported value is 0).
    Example: measured 2.5, reported 3.62 -> (-1.12, 0.6906)."""
    if is_missing(measured) or is_missing(reported):
        return math.nan, math.nan
    delta = float(measured) - float(reported)
    return delta, float(measured) / float(reported) if float(reported) != 0 else math.nan



def peak_memory(peak_rss_bytes: Sequence[Number | None] | None = None,
                cuda_peak_allocated_bytes: Sequence[Number | None] | None = None) -> int | None:
    """Peak memory in bytes: the max of CUDA peak *allocated* memory if any turn has it, else the max of process RSS.

    On a GPU the device memory is what limits a method (host RSS is mostly the Python process); on CPU RSS is all
    there is. Allocated, not reserved: reserved memory includes the caching allocator's free blocks, which depend
    on what ran before (the runner empties the cache between methods, and reports reserved beside it, see
    :func:`peak_reserved`). None when neither was measured.
    Example: rss [5, 7], cuda [None, None] -> 7; rss [5, 7], cuda [3] -> 3.
    """
    for values in (cuda_peak_allocated_bytes, peak_rss_bytes):
        present = [v for v in as_list(values) if not is_missing(v)] if values is not None else []
        if present:
            return int(max(present))
    return None


def peak_reserved(cuda_peak_reserved_bytes: Sequence[Number | None] | None) -> int | None:
    """Max CUDA peak *reserved* memory (allocated + the allocator's cache) over turns; None when not measured.
    Example: [3, None, 8] -> 8."""
    present = [v for v in as_list(cuda_peak_reserved_bytes) if not is_missing(v)] if cuda_peak_reserved_bytes else []
    return int(max(present)) if present else None


def quality(scores: Iterable[Number | None]) -> float | None:
    """Mean quality score over the scored turns (None / NaN ignored); None when nothing was scored.

    Example: [1.0, None, 0.0, 1.0] -> 2/3.
    """
    present = [float(s) for s in scores if not is_missing(s)]
    return sum(present) / len(present) if present else None


def _lossless_key(rec: Mapping[str, Any]) -> tuple:
    missing = [f for f in LOSSLESS_KEY if f not in rec]
    if missing:
        raise KeyError(f"lossless_share: turn record lacks field(s) {missing}; needs {list(LOSSLESS_KEY)}")
    return tuple(str(rec[f]) if f == "question_id" else float(rec[f]) if f == "temperature" else rec[f]
                 for f in LOSSLESS_KEY)


def lossless_share(method_turns: Iterable[Mapping[str, Any]],
                   vanilla_turns: Iterable[Mapping[str, Any]]) -> float:
    """Share of the method's turns whose ``output_ids`` equal the baseline's for the same
    (suite, question_id, turn, temperature, seed).

    Only meaningful at temperature 0, where a lossless method must reproduce greedy decoding token for token (at
    T > 0 the random streams differ, so a lossless method legitimately produces other tokens); callers restrict
    it to T = 0. Turns without a baseline counterpart, or without ``output_ids`` on either side, are skipped;
    NaN when none is comparable. Example: 3 comparable turns, 2 identical -> 0.667.
    """
    reference: dict[tuple, list[int]] = {}
    for rec in vanilla_turns:
        ids = rec.get("output_ids")
        if ids is not None:
            reference.setdefault(_lossless_key(rec), [int(t) for t in ids])
    same = total = 0
    for rec in method_turns:
        ids, ref = rec.get("output_ids"), reference.get(_lossless_key(rec))
        if ids is None or ref is None:
            continue
        total += 1
        same += [int(t) for t in ids] == ref
    return same / total if total else math.nan


def relative_change(new: float | None, base: float | None) -> float:
    """Relative change of a figure between two runs: new / base − 1 (so −0.05 is a 5% drop).

    NaN when either value is missing or base is 0. Example: τ 2.0 -> 1.9 gives −0.05.
    """
    if is_missing(new) or is_missing(base) or base == 0:
        return math.nan
    return float(new) / float(base) - 1.0


def per_question_speedups(method_tps: PerQuestion, baseline_tps: PerQuestion) -> pd.Series:
    """Per-question speed-up s_q = method_tps[q] / baseline_tps[q] (both measured in the SAME run), indexed by
    question id, over the questions both have measured (positive, finite). The ratios whose geometric mean is
    :func:`speedup_geomean`. Example: method {a: 30, b: 10}, baseline {a: 10, b: 20, c: 5} -> {a: 3.0, b: 0.5}.
    """
    m, b = pd.Series(dict(method_tps), dtype=float), pd.Series(dict(baseline_tps), dtype=float)
    both = pd.concat([m.rename("m"), b.rename("b")], axis=1, join="inner")
    both = both[np.isfinite(both["m"]) & np.isfinite(both["b"]) & (both["m"] > 0) & (both["b"] > 0)]
    both = both.sort_index(key=lambda idx: idx.map(str))
    return (both["m"] / both["b"]).astype(float)


def paired_change(new: PerQuestion, base: PerQuestion, n_boot: int = 2000,
                  seed: int = 0) -> tuple[float, float, float]:
    """Change of a per-question figure from run BASE to run NEW, paired on questions: ``(gmean, lo, hi)``.

    r_q = new[q] / base[q] over the questions both runs measured (positive, finite); gmean = exp(mean_q log r_q);
    95% CI by the percentile bootstrap over questions (``n_boot`` resamples, numpy generator seeded with ``seed``):
    exactly the estimator of :func:`speedup_geomean`, with NEW in the place of the method and BASE in the place
    of the baseline. ``draftbench compare`` applies it to per-question speed-ups (:func:`per_question_speedups`,
    each run's own ratio to its own vanilla, so a machine that is uniformly slower or faster cancels out) and to
    per-question tokens/s. Example: base {a: 2.0, b: 1.0}, new {a: 1.8, b: 0.9} -> every r_q = 0.9 ->
    (0.9, 0.9, 0.9).
    """
    return speedup_geomean(new, base, n_boot=n_boot, seed=seed)


# ---- greedy divergence from the baseline: a near tie that rounding flipped, or a real disagreement ----------------
# Relative precision (machine epsilon) of the dtypes a target runs in: the spacing of representable logits near x
# is about eps * |x|.
DTYPE_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
# A margin within this many epsilons of the top logit counts as a tie that rounding can flip: the tree forward and
# one-token decoding sum in different orders, so their logits differ by a few units in the last place.
TIE_ULPS = 4


def tie_tolerance(dtype: str, top_logit: float) -> float:
    """The largest top-1 minus top-2 logit margin that is a tie within ``dtype``'s rounding noise:
    ``TIE_ULPS * DTYPE_EPS[dtype] * max(|top_logit|, 1)``.

    Example: bfloat16, top logit 20 -> 4 * 2^-7 * 20 = 0.625; float32, top logit 20 -> 9.5e-6.
    """
    if dtype not in DTYPE_EPS:
        raise ValueError(f"tie_tolerance: unknown dtype {dtype!r}; known: {', '.join(DTYPE_EPS)}")
    return TIE_ULPS * DTYPE_EPS[dtype] * max(abs(float(top_logit)), 1.0)


def divergence(method: Mapping[str, Any], baseline: Mapping[str, Any],
               one_sided: bool = False) -> dict[str, Any] | None:
    """How a greedy turn of a method departs from the baseline's turn (same question, turn, seed): None when the
    ``output_ids`` are equal, else

    ``{"position": k, "token", "baseline_token", "method_margin", "baseline_margin", "tolerance", "kind", "reason"}``

    with k = :func:`first_difference`, each run's top-1 minus top-2 logit margin at k (``logit_margins`` of the
    records: how close that run's target was to choosing another token), the tie tolerance of the record's dtype
    (:func:`tie_tolerance` at the larger top logit, ``logit_tops``), ``kind`` and ``reason`` (one line saying why):

    - "tie": both margins are within the tolerance and each run's runner-up (``logit_runner_ups``) is the other
      run's token: the runs' logits differ by rounding and a near tie flipped. Expected now and then in bf16/fp16
      (a tree forward and one-token decoding sum in other orders); not a bug. A run whose margin is exactly 0 had
      several tokens at its top logit (common in bf16, whose logits near 24 are multiples of 0.125): its choice and
      its recorded runner-up are each one of them (argmax and topk order equal values differently), so the other
      run's token may be a third one, as valid as both; that run's runner-up is not checked.
    - "disagreement": a margin exceeds the tolerance (that run's target was confident), or a run's runner-up, at
      a margin above 0, is not the other run's token (the other run chose a token this one did not rank second).
      A bug, or a method that is not lossless.
    - "unknown": no margins recorded (sampling, or records written before margins were).

    ``one_sided``: the method's run exposes no logits (another engine, :mod:`harness.backends`), so the baseline's
    side decides alone: "disagreement" when its margin exceeds the tolerance or, above 0, its runner-up is not the
    method's token, else "tie"; "unknown" only without the baseline's margins.

    Examples (bfloat16): ids [5, 6, 7] vs [5, 9, 7], margins [.., 0.25, ..] and [.., 0.5, ..], tops 20, runner-ups 9
    and 6 -> position 1, tolerance 0.625, kind "tie". A three-way tie in the baseline: ids [5, 6] vs [5, 9], method
    margin 0.125 with runner-up 9, baseline margin 0.0 with runner-up 4 (the third token at its top), tops 23.875 ->
    tolerance 4 * 2^-7 * 23.875 = 0.746, kind "tie"; the same with a baseline margin of 0.5: "disagreement",
    reason "method's token 6 is not the baseline's runner-up 4".
    """
    ids, ref = method.get("output_ids") or [], baseline.get("output_ids") or []
    k = first_difference(ids, ref)
    if k is None:
        return None

    def at(rec: Mapping[str, Any], field: str) -> float | None:
        values = rec.get(field)
        if values is None or isinstance(values, float) or k >= len(values) or is_missing(values[k]):
            return None
        return float(values[k])

    token = int(ids[k]) if k < len(ids) else None
    baseline_token = int(ref[k]) if k < len(ref) else None
    mm, bm = at(method, "logit_margins"), at(baseline, "logit_margins")
    tops = [t for t in (at(method, "logit_tops"), at(baseline, "logit_tops")) if t is not None]
    dtype = str(method.get("dtype") or baseline.get("dtype") or "")
    tol = tie_tolerance(dtype, max(abs(t) for t in tops)) if tops and dtype in DTYPE_EPS else None
    sides = [("baseline", bm, at(baseline, "logit_runner_ups"), "method", token)]
    if not one_sided:
        sides.insert(0, ("method", mm, at(method, "logit_runner_ups"), "baseline", baseline_token))
    if tol is None or any(margin is None for _, margin, *_ in sides):
        missing = [side for side, margin, *_ in sides if margin is None]
        why = (f"no logit margins in the {' and '.join(missing)} record" if missing
               else f"no tie tolerance (logit_tops missing or dtype {dtype!r} not in {', '.join(DTYPE_EPS)})")
        kind, reasons = "unknown", [why]
    else:
        reasons = [f"{side}'s margin {margin:g} exceeds the tolerance {tol:.3g}"
                   for side, margin, _, _, _ in sides if margin > tol]
        reasons += [f"{other}'s token {other_token} is not the {side}'s runner-up {int(second)}"
                    for side, margin, second, other, other_token in sides
                    if margin > 0 and second is not None and int(second) != other_token]
        kind = "disagreement" if reasons else "tie"
        if not reasons:
            exact = [side for side, margin, *_ in sides if margin == 0]
            reasons = [f"margins within the tolerance {tol:.3g}"
                       + (f"; {' and '.join(exact)} margin 0: several tokens share the top logit" if exact else "")]
    return {"position": k, "token": token, "baseline_token": baseline_token, "method_margin": mm,
            "baseline_margin": bm, "tolerance": tol, "kind": kind, "reason": "; ".join(reasons)}


def divergences(method_turns: Iterable[Mapping[str, Any]],
                baseline_turns: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`divergence` of every method turn that differs from its baseline turn (matched on
    ``LOSSLESS_KEY``, as :func:`lossless_share`), each with that key's fields. Temperature 0 only."""
    reference = {}
    for rec in baseline_turns:
        if rec.get("output_ids") is not None:
            reference.setdefault(_lossless_key(rec), rec)
    out = []
    for rec in method_turns:
        ref = reference.get(_lossless_key(rec))
        if ref is None or rec.get("output_ids") is None:
            continue
        d = divergence(rec, ref)
        if d is not None:
            out.append({**{f: rec[f] for f in LOSSLESS_KEY}, **d})
    return out


def bootstrap_rows(n: int, n_boot: int, seed: int) -> np.ndarray:
    """Question indices ``[n_boot, n]`` drawn with replacement (numpy generator seeded with ``seed``)."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first position where two sequences (token ids, or text) differ; None when they are equal.

    When one is a prefix of the other the index is the shorter one's length. The losslessness audit uses it on a
    method's and the baseline's ``output_ids`` (the first differing token) and ``output_text`` (where to centre
    the side-by-side view). Example: [5, 6, 7] vs [5, 6, 9, 1] -> 2; [5, 6] vs [5, 6, 7] -> 2; "ab" vs "ab" -> None.
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


# ---- load levels (harness.report.load): many requests in flight on one served engine ----

def per_token_latencies(token_times_s: Sequence[float] | None) -> list[float]:
    """Per-token latencies of one streamed request: the gap between each token's arrival and the previous
    token's (``token_times_s``: per new token, seconds from sending the request). The first token's time is the
    time to first token, not a per-token latency. These are per *token*, not per chunk (vLLM's inter-token latency
    "ITL" is per chunk): a chunk of k tokens gives k gaps, not one. Where a chunk carried several tokens the served
    client split its time evenly over them (its record's ``engine_notes`` says so), so the k gaps are each 1/k of
    the chunk's wait: their sum, and so the mean, is exact, but the percentiles are smoothed: a stall of g before
    a chunk of k tokens reads as k gaps of g / k, so p95/p99 understate the longest wait a reader sees, and the low
    percentiles overstate the near-zero gaps inside the chunk. Example: [0.5, 0.6, 0.6, 0.9] -> [0.1, 0.0, 0.3]
    (to float precision); [0.5] -> []; None -> [].
    """
    times = list(token_times_s or [])
    return [b - a for a, b in itertools.pairwise(times)]


def latency_percentiles(values: Sequence[float], percentiles: Sequence[float] = (50, 95, 99)) -> list[float]:
    """The ``percentiles`` of ``values`` with linear interpolation between order statistics (numpy's default
    ``linear`` method, as vLLM's benchmark_serving reports its p50/p99); NaN for each when there are no values.
    Example: [0.1, 0.2, 0.3, 0.4, 0.5], (50, 95, 99) -> [0.3, 0.48, 0.496]; [] -> [nan, nan, nan].
    """
    if not len(values):
        return [math.nan] * len(percentiles)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), list(percentiles))]


def tokens_per_user(per_token_latencies_s: Sequence[float]) -> float:
    """Interactivity of a load level: tokens/s per user = 1 / mean per-token latency (in seconds; 1000 / mean ITL
    in ms, as vllm-project/speculators' throughput-interactivity frontier plots it), the mean over every gap pooled
    over the level's requests (:func:`per_token_latencies`; exact even where a chunk's time was split). The first
    token's wait (TTFT) is not in it. NaN without a gap. Example: [0.05, 0.05, 0.1, 0.0] -> 1 / 0.05 = 20.0;
    [] -> nan."""
    if not len(per_token_latencies_s):
        return math.nan
    mean = float(np.mean(np.asarray(per_token_latencies_s, dtype=float)))
    return 1.0 / mean if mean > 0 else math.nan


def level_window(sent_s: Sequence[Number], finished_s: Sequence[Number]) -> float:
    """A load level's wall window in seconds: from its first request sent to its last one finished (``sent_s`` /
    ``finished_s``: per request, seconds from the level's start); 0.0 without a request.
    Example: sent [0.0, 0.5], finished [2.0, 3.0] -> 3.0."""
    return float(max(finished_s) - min(sent_s)) if len(sent_s) else 0.0


def level_throughput(new_tokens: Sequence[Number], sent_s: Sequence[Number], finished_s: Sequence[Number]) -> float:
    """Output tokens/s of a load level: Σ new tokens of its requests ÷ the level's wall window
    (:func:`level_window`), as vLLM's benchmark_serving divides by its benchmark duration. NaN without a request
    or a window.
    Example: tokens [10, 20], sent [0.0, 0.5], finished [2.0, 3.0] -> 30 / 3.0 = 10.0.
    """
    window = level_window(sent_s, finished_s)
    return float(sum(new_tokens)) / window if len(new_tokens) and window > 0 else math.nan


def stops_paying(levels: Sequence[tuple[int, float, float, float]]) -> tuple[int, bool] | None:
    """Where speculation stops paying under load: ``levels`` are (concurrency, speed-up, CI lo, CI hi), the
    speed-up of a speculative entry over the same engine without speculation at each concurrency. The answer is
    the lowest concurrency whose speed-up is below 1.0, and whether its CI lies wholly below 1.0 (False also when
    the level has no CI: too few requests); None when it pays (speed-up >= 1.0) at every level.
    Example: [(1, 2.0, 1.8, 2.2), (4, 1.3, 1.1, 1.5), (16, 0.9, 0.85, 0.95)] -> (16, True);
    [(1, 1.2, nan, nan), (4, 0.98, 0.9, 1.05)] -> (4, False); [(1, 1.5, 1.4, 1.6)] -> None.
    """
    for concurrency, speedup, _, hi in sorted(levels):
        if speedup < 1.0:
            return concurrency, bool(hi < 1.0)
    return None
