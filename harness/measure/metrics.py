"""Every reported metric, defined once, with its formula in its docstring.

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
  verdict before the cut in the acceptance rates (:func:`drafts_before_cut` says which metric takes which).
* A speed-up compares a method with the baseline on the same questions only (paired on question ids).
* Missing measurements are ``None`` / NaN and are skipped, never read as zero.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

Number = int | float
PerQuestion = Mapping[Any, float] | pd.Series

# a turn is compared with the baseline's turn that has the same values of these record fields
LOSSLESS_KEY = ("suite", "question_id", "turn", "temperature", "seed")


def _as_list(x: Number | Sequence[Number] | None) -> list:
    """A scalar becomes a one-element list; a sequence / array / Series becomes a plain list."""
    if x is None or isinstance(x, (int, float, np.integer, np.floating)):
        return [x]
    return list(x)


def _missing(x: Any) -> bool:
    """True for None and NaN (how a record says "not measured")."""
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def tokens_per_second(new_tokens: Number | Sequence[Number], wall_time_s: Number | Sequence[Number]) -> float:
    """Throughput = Σ new_tokens / Σ wall_time_s (a pooled ratio, not a mean of per-turn ratios), prefill included
    (:func:`decode_tokens_per_second` is the rate without it).

    Called with one turn's numbers it gives that turn's rate; called with the turns of one question it gives the
    question's rate, which is what the papers average over questions. NaN when there is no time to divide by.
    Example: turns with (new, wall) = (100, 2.0) and (50, 0.5) -> 150 / 2.5 = 60.0 tokens/s.
    """
    tokens, times = _as_list(new_tokens), _as_list(wall_time_s)
    if len(tokens) != len(times):
        raise ValueError(f"tokens_per_second: new_tokens has {len(tokens)} values but wall_time_s has {len(times)}")
    pairs = [(n, t) for n, t in zip(tokens, times) if not _missing(n) and not _missing(t)]
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
    tokens, times, prefills = _as_list(new_tokens), _as_list(wall_time_s), _as_list(prefill_time_s)
    if not len(tokens) == len(times) == len(prefills):
        raise ValueError(f"decode_tokens_per_second: {len(tokens)} new_tokens, {len(times)} wall times and "
                         f"{len(prefills)} prefill times")
    rows = [(n - 1, t - p) for n, t, p in zip(tokens, times, prefills)
            if not (_missing(n) or _missing(t) or _missing(p)) and n >= 1]
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
    measured = sorted((b, s) for b, s in zip(buckets, speedups) if not _missing(s))
    crossing = None
    for bucket, speedup in reversed(measured):
        if speedup >= 1.0:
            break
        crossing = bucket
    return crossing


def tau(accept_lengths_lists: Iterable[Sequence[int]]) -> float:
    """Mean accepted length τ = Σ new tokens / Σ steps, pooled over every step of every turn given.

    ``steps`` are target forwards including the prefill (``len(accept_lengths)``) and every step's count includes
    the bonus token, so vanilla (all ones) is exactly 1.0. Close to, but not the same as, Spec-Bench's pooled
    per-step mean, which leaves the prefill out (:func:`tau_spec_bench`; other conventions in :data:`TAU_CONVENTIONS`).
    A terminal step cut at EOS or the budget counts the tokens it emitted (every τ convention does;
    :func:`drafts_before_cut`). Example: [[1, 3, 2], [1, 4]] -> (6 + 5) / (3 + 2) = 2.2.
    """
    lists = [list(a) for a in accept_lengths_lists]
    steps = sum(len(a) for a in lists)
    return sum(sum(a) for a in lists) / steps if steps else math.nan


PerQuestionTurns = Mapping[Any, Sequence[Sequence[int]]]


def _verification_steps(turns: Sequence[Sequence[int]]) -> tuple[int, int]:
    """``(S, K)`` of one question's turns: tokens appended by verification steps (prefill left out) and their count."""
    lists = [list(a) for a in turns]
    return sum(sum(a[1:]) for a in lists), sum(max(len(a) - 1, 0) for a in lists)


def tau_eagle_script(per_question: PerQuestionTurns) -> float:
    """τ as Jakiro's evaluation prints it ("mean accepted tokens", arXiv:2502.06282): the formula is in Jakiro's fork
    of EAGLE (``evaluation/speed_accept_len.py``); EAGLE's own ``evaluation/speed.py`` computes speed-ups only. The
    name ``eagle_script`` (kept: stored runs and tables use it) is the convention the shipped EAGLE-1/2 tables
    (arXiv:2401.15077, arXiv:2406.16858) read their τ cells in:

        τ_script = mean over questions q of  Σ_turns new_token / Σ_turns idx

    with, per turn, ``new_token`` = S = tokens committed by the verification steps (the prefill's token is not
    counted: it becomes the first step's root) and ``idx`` = K − 1, the loop index at exit (K verification steps).
    From a record: S = Σ accept_lengths[1:] (a terminal step's tokens after any cut at EOS / the budget),
    K = len(accept_lengths) − 1. Dividing by K − 1 instead of K overstates
    τ (by about τ/K). Questions whose Σ idx is 0 (a single verification step per turn) have no value and are
    skipped (the scripts would divide by zero). Input: question id -> that question's turns' accept_lengths.
    Example: {"a": [[1, 3, 2, 4]], "b": [[1, 2, 2], [1, 1, 3]]} -> a: 9 / 2 = 4.5, b: (4 + 4) / (1 + 1) = 4.0
    -> mean 4.25 (τ_step: 2.5, Spec-Bench #MAT: 17/7 = 2.43, draftbench τ: 20/10 = 2.0).
    """
    values = []
    for turns in per_question.values():
        s, k = _verification_steps(turns)
        idx = k - sum(1 for a in turns if len(list(a)) > 1)  # each turn's loop index = its K - 1
        if idx > 0:
            values.append(s / idx)
    return sum(values) / len(values) if values else math.nan


def tau_eagle_step(per_question: PerQuestionTurns) -> float:
    """τ_step: Jakiro's ``speed_accept_len.py`` per-question average with the unbiased denominator (idx + 1 = K):

        τ_step = mean over questions q of  Σ_turns S / Σ_turns K

    (S = Σ accept_lengths[1:], K = len(accept_lengths) − 1 per turn, terminal steps after the cut, as in
    :func:`tau_eagle_script`). This is the
    third number of the Jakiro A40 cells recomputed from its committed outputs (github.com/haiduo/Jakiro,
    jakiro/outputs/A40). Example: {"a": [[1, 3, 2, 4]], "b": [[1, 2, 2], [1, 1, 3]]} -> (9/3 + 8/4) / 2 = 2.5.
    """
    values = []
    for turns in per_question.values():
        s, k = _verification_steps(turns)
        if k > 0:
            values.append(s / k)
    return sum(values) / len(values) if values else math.nan


def tau_spec_bench(per_question: PerQuestionTurns) -> float:
    """Spec-Bench's "#Mean Accepted Tokens" (#MAT, arXiv:2401.07851; its ``evaluation/speed.py``): the mean of
    the tokens appended per verification step (accepted drafts + 1), pooled over every step of every turn of every
    question (the prefill is not a step):

        #MAT = Σ_q Σ_turns S / Σ_q Σ_turns K,   S = Σ accept_lengths[1:], K = len(accept_lengths) − 1

    Vanilla is 1.0; a terminal step counts the tokens it emitted (after any cut at EOS / the budget).
    Example: {"a": [[1, 3, 2, 4]], "b": [[1, 2, 2], [1, 1, 3]]} -> (9 + 8) / (3 + 4) = 17/7 = 2.43.
    """
    s = k = 0
    for turns in per_question.values():
        ds, dk = _verification_steps(turns)
        s, k = s + ds, k + dk
    return s / k if k else math.nan


def tau_draftbench(per_question: PerQuestionTurns) -> float:
    """draftbench's :func:`tau` (prefill counted as a step) over every turn of every question, in the per-question
    signature of :data:`TAU_CONVENTIONS`. Example: {"a": [[1, 3, 2, 4]], "b": [[1, 2, 2], [1, 1, 3]]} -> 20/10 = 2.0."""
    return tau([a for turns in per_question.values() for a in turns])


# name -> function(question id -> turns' accept_lengths) -> τ; a published table names one of these for its τ cells
TAU_CONVENTIONS = {
    "draftbench": tau_draftbench,
    "eagle_script": tau_eagle_script,
    "eagle_step": tau_eagle_step,
    "spec_bench": tau_spec_bench,
}


def tau_in_convention(convention: str, per_question: PerQuestionTurns) -> float:
    """τ of the same records in a named convention (:data:`TAU_CONVENTIONS`); an unknown name raises ValueError."""
    if convention not in TAU_CONVENTIONS:
        raise ValueError(f"unknown tau convention {convention!r}; known: {', '.join(TAU_CONVENTIONS)}")
    return TAU_CONVENTIONS[convention](per_question)


def _paired(method_tps: PerQuestion, baseline_tps: PerQuestion) -> tuple[np.ndarray, np.ndarray]:
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
    present = [float(v) for v in values if not _missing(v)]
    return sum(present) / len(present) if present else math.nan


def suite_mean(values: Iterable[float | None]) -> float:
    """Equal-weight mean over suites (the "mean" column of the paper table), NaN / None skipped.

    Every suite weighs the same whatever its number of questions, as the EAGLE/Jakiro scripts average their six
    datasets. Example: speed-ups [2.0, 3.0, NaN] -> 2.5.
    """
    present = [float(v) for v in values if not _missing(v)]
    return sum(present) / len(present) if present else math.nan


def speedup_ratio_of_means(method_tps: PerQuestion, baseline_tps: PerQuestion) -> float:
    """Speed-up as the papers report it: mean tokens/s of the method ÷ mean tokens/s of the baseline.

    Both means run over the SAME questions: the inputs map question id -> that question's tokens/s, and a
    question missing (or not measured) on either side is dropped from both. NaN when no question is shared.
    Example: method {a: 30, b: 10, c: 99}, baseline {a: 10, b: 10} -> c dropped -> mean(30, 10) / mean(10, 10) = 2.0.
    """
    m, b = _paired(method_tps, baseline_tps)
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
    m, b = _paired(method_tps, baseline_tps)
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
        m, b = _paired(method_tps, baseline_tps)
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
    if _missing(measured) or _missing(reported):
        return math.nan, math.nan
    delta = float(measured) - float(reported)
    return delta, float(measured) / float(reported) if float(reported) != 0 else math.nan


def _steps(accepted_drafts_lists: Iterable[Sequence[int]],
           draft_depths_lists: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Flatten per-turn lists into per-verification-step arrays ``accepted [S]`` and ``depth [S]``, checked."""
    acc_lists, depth_lists = [list(a) for a in accepted_drafts_lists], [list(d) for d in draft_depths_lists]
    if len(acc_lists) != len(depth_lists):
        raise ValueError(f"accepted_drafts has {len(acc_lists)} turns but draft_depths has {len(depth_lists)}")
    for i, (a, d) in enumerate(zip(acc_lists, depth_lists)):
        if len(a) != len(d):
            raise ValueError(f"turn {i}: accepted_drafts has {len(a)} steps but draft_depths has {len(d)}")
    acc = np.array([x for a in acc_lists for x in a], dtype=int)
    depth = np.array([x for d in depth_lists for x in d], dtype=int)
    if np.any(acc > depth) or np.any(acc < 0):
        raise ValueError("accepted_drafts must be between 0 and the step's draft_depths value")
    return acc, depth


def acceptance_per_position(accepted_drafts_lists: Iterable[Sequence[int]],
                            draft_depths_lists: Iterable[Sequence[int]], max_pos: int | None = None) -> list[float]:
    """Acceptance rate at draft position i = 1..max_pos, over verification steps:

        rate_i = #steps with accepted >= i / #steps whose draft depth >= i

    i.e. how often the i-th drafted token was accepted when there was one (vLLM's per-position rate). NaN where no
    step drafted that deep. A terminal step counts its verdict before any cut at EOS / the budget
    (:func:`drafts_before_cut`). ``max_pos`` defaults to the deepest draft seen.
    Example: accepted [2, 0, 1], depths [3, 3, 1] -> i=1: 2/3, i=2: 1/2, i=3: 0/2 -> [0.667, 0.5, 0.0].
    """
    accepted_at, drafted_at = acceptance_counts(accepted_drafts_lists, draft_depths_lists, max_pos)
    return acceptance_pooled([accepted_at], [drafted_at])


def acceptance_counts(accepted_drafts_lists: Iterable[Sequence[int]], draft_depths_lists: Iterable[Sequence[int]],
                      max_pos: int | None = None) -> tuple[list[int], list[int]]:
    """The counts behind :func:`acceptance_per_position` at positions i = 1..max_pos: ``(accepted_at [P],
    drafted_at [P])`` = (#steps with accepted >= i, #steps whose draft depth >= i). What a committed baseline keeps
    per question, so that the rate pools exactly over any subset of questions (:func:`acceptance_pooled`).
    ``max_pos`` defaults to the deepest draft seen. Example: accepted [2, 0, 1], depths [3, 3, 1] -> ([2, 1, 0],
    [3, 2, 2]).
    """
    acc, depth = _steps(accepted_drafts_lists, draft_depths_lists)
    top = max_pos if max_pos is not None else int(depth.max(initial=0))
    return ([int((acc >= i).sum()) for i in range(1, top + 1)], [int((depth >= i).sum()) for i in range(1, top + 1)])


def acceptance_pooled(accepted_at: Iterable[Sequence[Number] | None],
                      drafted_at: Iterable[Sequence[Number] | None]) -> list[float]:
    """Acceptance per position from per-question counts (:func:`acceptance_counts`): rate_i = Σ_q accepted_at[q][i]
    / Σ_q drafted_at[q][i], over as many positions as the longest list; NaN where nothing was drafted that deep.
    Questions whose counts are missing (None) are skipped. The same numbers as :func:`acceptance_per_position` over
    those questions' steps, as :func:`tau_pooled` is to :func:`tau`.
    Example: questions ([2, 1], [3, 2]) and ([1], [1]) -> [3/4, 1/2].
    """
    pairs = [(list(a), list(d)) for a, d in zip(accepted_at, drafted_at) if a is not None and d is not None]
    top = max((len(d) for _, d in pairs), default=0)
    out = []
    for i in range(top):
        n = sum(d[i] for _, d in pairs if i < len(d))
        out.append(sum(a[i] for a, _ in pairs if i < len(a)) / n if n else math.nan)
    return out


def conditional_acceptance_per_position(accepted_drafts_lists: Iterable[Sequence[int]],
                                        draft_depths_lists: Iterable[Sequence[int]],
                                        max_pos: int | None = None) -> list[float]:
    """Conditional acceptance at position i: P(accepted >= i | accepted >= i−1 and draft depth >= i).

        rate_i = #steps with accepted >= i / #steps with accepted >= i−1 and depth >= i

    The chance the i-th drafted token survives given that every token before it did; position 1 equals
    :func:`acceptance_per_position` (and, like it, counts a terminal step's verdict before the cut).
    Example: accepted [2, 0, 1], depths [3, 3, 1] -> i=1: 2/3, i=2: 1/1
    (only the first step reached position 2 with room for it), i=3: 0/1 -> [0.667, 1.0, 0.0].
    """
    acc, depth = _steps(accepted_drafts_lists, draft_depths_lists)
    top = max_pos if max_pos is not None else int(depth.max(initial=0))
    out = []
    for i in range(1, top + 1):
        n = int(((acc >= i - 1) & (depth >= i)).sum())
        out.append(int((acc >= i).sum()) / n if n else math.nan)
    return out


def drafts_before_cut(accept_lengths: Sequence[int], accepted_drafts: Sequence[int]) -> list[int]:
    """Per verification step j, the accepted drafts that reached the output: min(accepted_drafts[j],
    accept_lengths[j + 1]) (0 where the cut left no entry for the step).

    Terminal steps, counted explicitly: a step appends its accepted drafts and the bonus token, cut at EOS or the
    token budget (:func:`harness.engine.method.cut_at_stop`). ``accepted_drafts`` is the verifier's verdict, before
    the cut; ``accept_lengths`` after it. Only a turn's last step can differ: it says here how many drafts it
    accepted before the cut. Which count each metric takes: τ in every convention (:data:`TAU_CONVENTIONS`) and the
    accepted-length histogram count what the step emitted (after the cut); per-position acceptance
    (:func:`acceptance_per_position`), :func:`draft_acceptance_rate` and :func:`mean_acceptance_length` take the
    verdict (before it), as vLLM's scheduler counts a step before its stop check, so that a turn's end does not read
    as a rejection (vllm-project/vllm#56137 is a mean acceptance length that was wrong on terminal steps).
    Example: accept_lengths [1, 3, 2], accepted [2, 3] (the second step verified 3 drafts, EOS was the second of
    them) -> [2, 2]; a budget cut to [1, 3, 1] -> [2, 1].
    """
    emitted = list(accept_lengths)[1:]
    return [min(int(a), int(emitted[j])) if j < len(emitted) else 0 for j, a in enumerate(accepted_drafts)]


def draft_counts(accepted_drafts: Sequence[int] | None, draft_depths: Sequence[int] | None,
                 engine_counters: Mapping[str, Any] | None = None) -> tuple[int | None, int | None, int | None]:
    """One turn's ``(accepted, drafted, drafting steps)``: the inputs of :func:`draft_acceptance_rate`,
    :func:`drafted_per_step` and :func:`mean_acceptance_length`.

    From a draftbench record: accepted = Σ accepted_drafts (the verifier's verdict, before any cut at EOS / the
    budget: :func:`drafts_before_cut`), drafted = Σ draft_depths and drafting steps = #steps with depth > 0 (a
    step that drafted nothing, e.g. a lookup without a match, is not a speculative step, as in vLLM and AIPerf's
    ``num_spec_steps``). Drafted tokens of a step are its draft depth: for a chain exactly the tokens drafted
    (vLLM's ``num_draft_tokens``, AIPerf's ``per_step_drafted``); for a tree the depth of the drafted tree, the
    most drafts the step could accept along one path (its other branches are scored by the target but not
    counted as drafted here: the tree's node count per turn is ``counters.tree_tokens``). From an engine record
    (``engine_counters``, :mod:`harness.backends.contract`): the engine's own ``accepted_tokens``,
    ``draft_tokens`` and ``drafts`` where it reports them, else the per-step lists. A count that is neither
    reported nor derivable is None. Example: accepted [2, 0, 3], depths [3, 0, 3] -> (5, 6, 2); engine counters
    {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 7} -> (7, 12, 4).
    """
    acc, depth = list(accepted_drafts or []), list(draft_depths or [])
    counters = engine_counters or {}
    own = (sum(acc), sum(depth), sum(1 for d in depth if d > 0)) if depth else (None, None, None)
    keys = ("accepted_tokens", "draft_tokens", "drafts")
    out = tuple(int(counters[k]) if not _missing(counters.get(k)) else own[i] for i, k in enumerate(keys))
    return out[0], out[1], out[2]


def _pooled(numerator: Sequence[Number | None], denominator: Sequence[Number | None]) -> tuple[float, float]:
    """Σ numerator and Σ denominator over the turns where both are measured."""
    pairs = [(n, d) for n, d in zip(numerator, denominator) if not _missing(n) and not _missing(d)]
    return float(sum(n for n, _ in pairs)), float(sum(d for _, d in pairs))


def draft_acceptance_rate(accepted: Sequence[Number | None], drafted: Sequence[Number | None]) -> float:
    """Draft acceptance rate = Σ accepted drafts / Σ drafted tokens, pooled over turns (:func:`draft_counts` per
    turn; one turn's pair gives that turn's rate): vLLM's ``draft_acceptance_rate`` and AIPerf's
    (``num_accepted_draft_tokens / num_draft_tokens``). Bonus tokens are not counted; terminal steps count their
    verdict before the cut (:func:`drafts_before_cut`). NaN when nothing was drafted. Example: turns (5, 8) and
    (0, 0) -> 0.625; (None, None) skipped.
    """
    acc, drafted_total = _pooled(accepted, drafted)
    return acc / drafted_total if drafted_total else math.nan


def drafted_per_step(drafted: Sequence[Number | None], steps: Sequence[Number | None]) -> float:
    """Drafted tokens per drafting step = Σ drafted / Σ drafting steps, pooled over turns (:func:`draft_counts`):
    vLLM's ``num_draft_tokens / num_spec_steps`` (k for a chain of k; the draft depth for a tree). NaN when no
    step drafted. Example: turns (8, 2) and (3, 1) -> 11 / 3 = 3.667.
    """
    drafted_total, n = _pooled(drafted, steps)
    return drafted_total / n if n else math.nan


def mean_acceptance_length(accepted: Sequence[Number | None], steps: Sequence[Number | None]) -> float:
    """Mean acceptance length as vLLM and AIPerf report it: 1 + Σ accepted drafts / Σ drafting steps, pooled
    over turns (:func:`draft_counts`). Unlike τ (:func:`tau`) the prefill and the steps that drafted nothing are
    not steps, and a terminal step counts its verdict before the cut (:func:`drafts_before_cut`), so a turn cut
    at EOS or the budget reads the same as its uncut steps. NaN when no step drafted (the engines' zero-step
    payload says 1.0). Example: turns (5, 2) and (1, 1) -> 1 + 6 / 3 = 3.0.
    """
    acc, n = _pooled(accepted, steps)
    return 1.0 + acc / n if n else math.nan


def accept_length_histogram(accept_lengths_lists: Iterable[Sequence[int]]) -> dict[int, int]:
    """Counts of tokens appended per verification step ``{length: steps}``, sorted by length.

    Element 0 of every list (the prefill, always 1) is excluded: only verification steps are counted; a terminal
    step cut at EOS or the budget counts the tokens it emitted (:func:`drafts_before_cut`).
    Example: [[1, 3, 1], [1, 3]] -> {1: 1, 3: 2}.
    """
    counts = Counter(int(x) for a in accept_lengths_lists for x in list(a)[1:])
    return dict(sorted(counts.items()))


def energy_per_token(energy_j: Number | Sequence[Number | None] | None,
                     new_tokens: Number | Sequence[Number]) -> float | None:
    """Energy per generated token in joules = Σ energy_j / Σ new_tokens over the turns that have an energy reading.

    None when no turn has one (CPU runs, or no NVML). Example: energy [10.0, None], tokens [100, 50] -> 0.1.
    """
    energies, tokens = _as_list(energy_j), _as_list(new_tokens)
    if len(energies) != len(tokens):
        raise ValueError(f"energy_per_token: energy_j has {len(energies)} values but new_tokens has {len(tokens)}")
    pairs = [(e, n) for e, n in zip(energies, tokens) if not _missing(e) and not _missing(n)]
    total_n = sum(n for _, n in pairs)
    return sum(e for e, _ in pairs) / total_n if pairs and total_n > 0 else None


# ---- headroom: what a method could gain, and where its time goes (arXiv:2601.11580: verification takes 42-95% of a
# step on vLLM; an oracle drafter bounds the speed-up) -------------------------------------------------------------

def free_draft_tokens_per_second(new_tokens: Sequence[Number | None], wall_time_s: Sequence[Number | None],
                                 draft_s: Sequence[Number | None]) -> float:
    """Throughput of the same turns with drafting at zero cost = Σ new_tokens / Σ (wall_time_s − draft_s), pooled
    over the turns given (one question's turns give that question's rate, as :func:`tokens_per_second`).

    ``draft_s`` is the engine's synchronised drafting time of a turn (``timings.draft_s``: the method's ``begin``,
    ``propose``, ``accept`` and ``observe``); every other part of the turn (prefill, verification forwards, host
    overhead) stays as measured, and so do the accepted lengths. The **free-draft bound** of a method is the speed-up
    these rates give over the baseline (:func:`speedup_ratio_ci`): what the same acceptance would buy with a drafter
    that costs nothing. NaN when any turn has no draft time (a turn without a synchronised split is not measured,
    never read as 0) or no time is left. Example: turns (new, wall, draft) = (30, 2.0, 0.5) and (10, 1.0, 0.5) ->
    40 / (1.5 + 0.5) = 20.0 tokens/s; (30, 2.0, None) -> NaN.
    """
    tokens, times, drafts = _as_list(new_tokens), _as_list(wall_time_s), _as_list(draft_s)
    if not len(tokens) == len(times) == len(drafts):
        raise ValueError(f"free_draft_tokens_per_second: {len(tokens)} new_tokens, {len(times)} wall times and "
                         f"{len(drafts)} draft times")
    if not tokens or any(_missing(x) for x in (*tokens, *times, *drafts)):
        return math.nan
    left = sum(t - d for t, d in zip(times, drafts))
    return sum(tokens) / left if left > 0 else math.nan


def oracle_bound(oracle_tps: PerQuestion, baseline_tps: PerQuestion, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """The **oracle bound** S* with its 95% CI: ``(S*, lo, hi)`` = :func:`speedup_ratio_ci` of the ``oracle``
    method's measured tokens/s over the baseline's on the same questions (question id -> tokens/s).

    The ``oracle`` method (``methods/oracle.py``, not deployable) drafts the target's own greedy continuation, known
    from an untimed greedy pass of the same turn, as a chain of ``k`` tokens padded to ``slots`` verified slots (the
    compared method's tree budget): every step accepts its whole chain, so S* is the speed-up of a perfect drafter
    that costs nothing to run, at that budget, on this machine, measured rather than simulated. Temperature 0 only
    (at T > 0 the greedy continuation is not what the target samples). Example: oracle {a: 40, b: 60}, baseline
    {a: 10, b: 10} -> S* = 50 / 10 = 5.0, the CI within [4.0, 6.0].
    """
    return speedup_ratio_ci([(oracle_tps, baseline_tps)], n_boot=n_boot, seed=seed)


# the parts of a turn's wall time (:func:`time_breakdown`); ``other`` is what no engine mark covers
TIME_PARTS = ("prefill", "draft", "verify", "overhead", "other")


def time_breakdown(wall_time_s: Sequence[Number | None], prefill_s: Sequence[Number | None],
                   draft_s: Sequence[Number | None], verify_s: Sequence[Number | None],
                   overhead_s: Sequence[Number | None]) -> dict[str, float]:
    """Where a group's time goes: the share of Σ wall_time_s spent in each part of :data:`TIME_PARTS`, pooled over
    the turns given.

    The parts are the engine's synchronised marks of each turn (``harness.engine.speculative``): ``prefill`` (the
    prompt's forward, ``prefill_time_s``), ``draft`` (``timings.draft_s``), ``verify`` (``timings.verify_s``: the
    verification forwards and the acceptance walk), ``overhead`` (``timings.overhead_s``: host work between them,
    masks, cache compaction, bookkeeping) and ``other`` = wall − the four (what lies outside the step loop: cache
    allocation, the tracker's synchronisation). Nothing is timed twice: these are the turn's own marks. All NaN
    when any turn lacks a part (a turn without a synchronised split: n/a, never 0) or no time was measured.
    Example: one turn, wall 10, prefill 1, draft 2, verify 6, overhead 0.5 -> {prefill: 0.1, draft: 0.2,
    verify: 0.6, overhead: 0.05, other: 0.05}.
    """
    columns = [_as_list(c) for c in (wall_time_s, prefill_s, draft_s, verify_s, overhead_s)]
    if len({len(c) for c in columns}) != 1:
        raise ValueError(f"time_breakdown: columns of {[len(c) for c in columns]} turns")
    wall = sum(columns[0]) if not any(_missing(x) for c in columns for x in c) else math.nan
    if not columns[0] or _missing(wall) or wall <= 0:
        return dict.fromkeys(TIME_PARTS, math.nan)
    parts = [sum(c) for c in columns[1:]]
    return dict(zip(TIME_PARTS, [p / wall for p in parts] + [(wall - sum(parts)) / wall]))


def rejected_verification_share(tree_tokens: Sequence[Number | None], accepted_drafts: Sequence[Number | None],
                                verification_steps: Sequence[Number | None]) -> float:
    """Share of the verification work spent on slots that were rejected = (verified slots − accepted tokens) /
    verified slots, pooled over turns, where per turn verified slots = Σ_steps (N + 1) = ``counters.tree_tokens`` +
    verification steps (every forward scores its N draft slots and the pending root) and accepted tokens =
    Σ accepted drafts + verification steps (each step's accepted drafts and its bonus token, the verdict before any
    cut at EOS or the budget: :func:`drafts_before_cut`). Verification steps are ``len(accept_lengths) − 1``.
    Side-branch slots (Lookahead's Jacobi window) are not in ``tree_tokens`` and are not counted. A turn without the
    counter is skipped; NaN when no turn has one (another engine, or a record made before the counter). Vanilla's
    share is 0 (one slot a step, always accepted). Example: turns (tree_tokens, Σ accepted, steps) = (12, 5, 3) and
    (0, 0, 2) -> (17 − 10) / 17 = 0.412.
    """
    rows = [(n, a, s) for n, a, s in zip(_as_list(tree_tokens), _as_list(accepted_drafts),
                                         _as_list(verification_steps))
            if not (_missing(n) or _missing(a) or _missing(s))]
    slots = sum(n + s for n, _, s in rows)
    return (slots - sum(a + s for _, a, s in rows)) / slots if slots else math.nan


def energy_per_accepted_token(energy_j: Sequence[Number | None], accepted_drafts: Sequence[Number | None]) -> float:
    """Energy per accepted draft token in joules = Σ energy_j / Σ accepted drafts, over the turns that have an
    energy reading: what each token the drafter won cost (:func:`energy_per_token` is per generated token). NaN
    without an energy reading or when no draft was accepted (vanilla). Example: energy [6.0, None], accepted
    [3, 4] -> 2.0."""
    pairs = [(e, a) for e, a in zip(_as_list(energy_j), _as_list(accepted_drafts))
             if not _missing(e) and not _missing(a)]
    accepted = sum(a for _, a in pairs)
    return sum(e for e, _ in pairs) / accepted if accepted > 0 else math.nan


def cost_per_million_tokens(cost_per_hour: Number | None, tokens_per_s: Number | None) -> float:
    """Cost of a million generated tokens at the user's price of the machine = cost_per_hour × 10^6 /
    (3600 × tokens_per_s), one request at a time (batch 1, as the tokens/s are measured). The price is the user's
    (``draftbench report --cost-per-hour``), never assumed: NaN without it or without a throughput.
    Example: 3.60 $/hour at 100 tokens/s -> 10.0 $ per million tokens."""
    if _missing(cost_per_hour) or _missing(tokens_per_s) or tokens_per_s <= 0:
        return math.nan
    return float(cost_per_hour) * 1e6 / (3600.0 * float(tokens_per_s))



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
        present = [v for v in _as_list(values) if not _missing(v)] if values is not None else []
        if present:
            return int(max(present))
    return None


def peak_reserved(cuda_peak_reserved_bytes: Sequence[Number | None] | None) -> int | None:
    """Max CUDA peak *reserved* memory (allocated + the allocator's cache) over turns; None when not measured.
    Example: [3, None, 8] -> 8."""
    present = [v for v in _as_list(cuda_peak_reserved_bytes) if not _missing(v)] if cuda_peak_reserved_bytes else []
    return int(max(present)) if present else None


def quality(scores: Iterable[Number | None]) -> float | None:
    """Mean quality score over the scored turns (None / NaN ignored); None when nothing was scored.

    Example: [1.0, None, 0.0, 1.0] -> 2/3.
    """
    present = [float(s) for s in scores if not _missing(s)]
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


def tau_pooled(accepted_tokens: Sequence[Number], steps: Sequence[Number]) -> float:
    """τ from per-question totals: Σ accepted_tokens / Σ steps, where a question's ``accepted_tokens`` is the sum
    of its turns' ``accept_lengths`` and ``steps`` their total length; the same number as :func:`tau` over those
    turns (a committed baseline keeps only these two totals per question). NaN when there is no step.
    Example: questions (6, 3) and (5, 2) -> 11 / 5 = 2.2, as tau([[1, 3, 2], [1, 4]]).
    """
    tokens, counts = _as_list(accepted_tokens), _as_list(steps)
    if len(tokens) != len(counts):
        raise ValueError(f"tau_pooled: accepted_tokens has {len(tokens)} values but steps has {len(counts)}")
    pairs = [(a, s) for a, s in zip(tokens, counts) if not _missing(a) and not _missing(s)]
    total = sum(s for _, s in pairs)
    return sum(a for a, _ in pairs) / total if pairs and total > 0 else math.nan


def relative_change(new: float | None, base: float | None) -> float:
    """Relative change of a figure between two runs: new / base − 1 (so −0.05 is a 5% drop).

    NaN when either value is missing or base is 0. Example: τ 2.0 -> 1.9 gives −0.05.
    """
    if _missing(new) or _missing(base) or base == 0:
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
        if values is None or isinstance(values, float) or k >= len(values) or _missing(values[k]):
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


def _bootstrap_rows(n: int, n_boot: int, seed: int) -> np.ndarray:
    """Question indices ``[n_boot, n]`` drawn with replacement (numpy generator seeded with ``seed``)."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def tau_ci(per_question_accept_lengths: Sequence[Iterable[Sequence[int]]], n_boot: int = 2000,
           seed: int = 0) -> tuple[float, float, float]:
    """:func:`tau` with a percentile-bootstrap 95% CI over questions: ``(tau, lo, hi)``.

    Input: one entry per question, each the ``accept_lengths`` lists of that question's turns. tau is pooled over
    every step of every question (exactly :func:`tau`); the CI resamples questions with replacement ``n_boot``
    times, recomputes the pooled ratio Σ tokens / Σ steps of the resample, and takes its 2.5th and 97.5th
    percentiles. Questions, not steps, are resampled because the steps of one answer are not independent.
    Example: questions [[[1, 3]], [[1, 1]]] -> tau (4 + 2) / 4 = 1.5; a resample gives 2.0 (first question twice),
    1.0 (second twice) or 1.5, so lo >= 1.0 and hi <= 2.0. NaN triple when no question has a step.
    """
    questions = [[list(a) for a in q] for q in per_question_accept_lengths]
    tokens = np.array([sum(sum(a) for a in q) for q in questions], dtype=float)   # [Q]
    steps = np.array([sum(len(a) for a in q) for q in questions], dtype=float)    # [Q]
    keep = steps > 0
    tokens, steps = tokens[keep], steps[keep]
    if not len(steps):
        return math.nan, math.nan, math.nan
    idx = _bootstrap_rows(len(steps), n_boot, seed)
    boot = tokens[idx].sum(axis=1) / steps[idx].sum(axis=1)                            # [n_boot]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(tokens.sum() / steps.sum()), float(lo), float(hi)


def per_verification_step(totals: Sequence[Number | None], accept_lengths_lists: Iterable[Sequence[int]]) -> float:
    """A per-turn total spread over verification steps: Σ totals / Σ (len(accept_lengths) − 1), pooled over turns.

    Used for draft forwards per step (``counters.draft_forwards``) and draft / verify milliseconds per step
    (``timings.draft_s`` / ``timings.verify_s`` x 1000): the prefill is not a verification step. Turns whose
    total is missing are skipped on both sides. NaN when no step remains.
    Example: draft forwards [6, 3] over accept_lengths [[1, 2, 3, 1], [1, 4]] -> 9 / (3 + 1) = 2.25.
    """
    lists = [list(a) for a in accept_lengths_lists]
    values = list(totals)
    if len(values) != len(lists):
        raise ValueError(f"per_verification_step: {len(values)} totals but {len(lists)} turns")
    pairs = [(v, max(len(a) - 1, 0)) for v, a in zip(values, lists) if not _missing(v)]
    steps = sum(s for _, s in pairs)
    return sum(v for v, _ in pairs) / steps if steps else math.nan


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


def acceptance_per_position_ci(per_question_accepted: Sequence[Iterable[Sequence[int]]],
                               per_question_depths: Sequence[Iterable[Sequence[int]]], max_pos: int,
                               n_boot: int = 2000, seed: int = 0) -> list[tuple[float, float, float]]:
    """:func:`acceptance_per_position` at positions 1..max_pos with a percentile-bootstrap 95% CI over questions:
    ``[(rate, lo, hi)]``.

    Input: one entry per question, each the ``accepted_drafts`` (resp. ``draft_depths``) lists of its turns. The rate
    pools every step (exactly :func:`acceptance_per_position`); the CI resamples questions with replacement and
    recomputes #steps with accepted >= i / #steps with depth >= i of the resample (resamples where no step drafted
    that deep are left out). Example: questions with accepted [[2]] and [[0]], depths [[3]] and [[3]] -> position 1:
    rate 1/2, resamples 0, 1/2 or 1 -> (0.5, lo >= 0, hi <= 1); position 3: (0.0, 0.0, 0.0).
    """
    if len(per_question_accepted) != len(per_question_depths):
        raise ValueError(f"{len(per_question_accepted)} questions of accepted_drafts but "
                         f"{len(per_question_depths)} of draft_depths")
    num = np.zeros((len(per_question_accepted), max_pos))                 # [Q, P] steps with accepted >= i
    den = np.zeros((len(per_question_accepted), max_pos))                 # [Q, P] steps with depth >= i
    for q, (acc_lists, depth_lists) in enumerate(zip(per_question_accepted, per_question_depths)):
        acc, depth = _steps(acc_lists, depth_lists)
        for i in range(1, max_pos + 1):
            num[q, i - 1], den[q, i - 1] = (acc >= i).sum(), (depth >= i).sum()
    if not len(num):
        return [(math.nan, math.nan, math.nan)] * max_pos
    idx = _bootstrap_rows(len(num), n_boot, seed)
    b_num, b_den = num[idx].sum(axis=1), den[idx].sum(axis=1)             # [n_boot, P]
    out = []
    for i in range(max_pos):
        total = den[:, i].sum()
        if not total:
            out.append((math.nan, math.nan, math.nan))
            continue
        ok = b_den[:, i] > 0
        lo, hi = np.percentile(b_num[ok, i] / b_den[ok, i], [2.5, 97.5])
        out.append((float(num[:, i].sum() / total), float(lo), float(hi)))
    return out


def paired_rate_difference_ci(hits_a: Sequence[Sequence[float]], totals_a: Sequence[Sequence[float]],
                              hits_b: Sequence[Sequence[float]], totals_b: Sequence[Sequence[float]],
                              n_boot: int = 10000, seed: int = 0) -> list[tuple[float, float, float]]:
    """Difference of two pooled rates, B minus A, per column with a paired percentile-bootstrap 95% CI over rows:
    ``[(diff, lo, hi)]``, one per column.

    Input: per row (a unit such as a held-out conversation) and column (such as a draft position), the hits and
    the totals of A and of B, all ``[R, P]``. Each rate pools its rows (Σ hits / Σ totals); diff = rate_B - rate_A.
    The CI resamples rows with replacement ``n_boot`` times, the same rows for A and B (paired), recomputes the
    difference and takes its 2.5th and 97.5th percentiles; rows, not the hits inside them, are resampled because
    the hits of one row are correlated (resamples where a side counts nothing in that column are left out). NaN
    triple for a column where a side counts nothing. Example: A hits [[1], [0]] of [[2], [2]] (rate 1/4), B hits
    [[2], [1]] of the same totals (3/4) -> diff 0.5; a resample of row 1 twice gives 1/2, of row 2 twice 1/2, of
    both 1/2 -> (0.5, 0.5, 0.5). The same A and B give (0.0, 0.0, 0.0).
    """
    ha, na, hb, nb = (np.asarray(x, dtype=float).reshape(len(x), -1)                      # [R, P] each
                      for x in (hits_a, totals_a, hits_b, totals_b))
    if not ha.shape == na.shape == hb.shape == nb.shape:
        raise ValueError(f"paired_rate_difference_ci: shapes differ: {ha.shape}, {na.shape}, {hb.shape}, {nb.shape}")
    idx = _bootstrap_rows(len(ha), n_boot, seed)                                            # [n_boot, R]
    b_ha, b_na, b_hb, b_nb = (x[idx].sum(axis=1) for x in (ha, na, hb, nb))                 # [n_boot, P]
    out = []
    for j in range(ha.shape[1]):
        if not (na[:, j].sum() and nb[:, j].sum()):
            out.append((math.nan, math.nan, math.nan))
            continue
        ok = (b_na[:, j] > 0) & (b_nb[:, j] > 0)
        boot = b_hb[ok, j] / b_nb[ok, j] - b_ha[ok, j] / b_na[ok, j]                       # [n_ok]
        lo, hi = np.percentile(boot, [2.5, 97.5])
        out.append((float(hb[:, j].sum() / nb[:, j].sum() - ha[:, j].sum() / na[:, j].sum()), float(lo), float(hi)))
    return out


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


def level_throughput(new_tokens: Sequence[Number], sent_s: Sequence[Number], finished_s: Sequence[Number]) -> float:
    """Output tokens/s of a load level: Σ new tokens of its requests ÷ the level's wall window, from the first
    request sent to the last one finished (``sent_s`` / ``finished_s``: per request, seconds from the level's
    start), as vLLM's benchmark_serving divides by its benchmark duration. NaN without a request or a window.
    Example: tokens [10, 20], sent [0.0, 0.5], finished [2.0, 3.0] -> 30 / 3.0 = 10.0.
    """
    if not len(new_tokens):
        return math.nan
    window = max(finished_s) - min(sent_s)
    return float(sum(new_tokens)) / window if window > 0 else math.nan


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


# ---- run-to-run noise: a tolerance fitted on repeats of one commit -----------------------------------------------
# A band that a rerun of the same commit leaves with probability 1 - PREDICTION_LEVEL (two-sided; a one-sided floor
# is left with half of that).
PREDICTION_LEVEL = 0.99
MIN_FIT_REPEATS = 5  # fewer repeats fit no tolerance: t_{0.995, n-1} is 5.84 at n = 4 and 63.7 at n = 2


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz; Press et al.,
    Numerical Recipes, 3rd ed., section 6.4), on the side of x where the fraction converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: 1 − ½ I_{df/(df+t²)}(df/2, ½) for t >= 0, by
    symmetry below. Example: student_t_cdf(0, 4) = 0.5; student_t_cdf(4.604, 4) ≈ 0.995."""
    if df < 1:
        raise ValueError(f"student_t_cdf: df must be >= 1, got {df}")
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`student_t_cdf` to 1e-10).
    Example: student_t_quantile(0.995, 4) ≈ 4.6041; (0.995, 5) ≈ 4.0321; (0.975, 9) ≈ 2.2622."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def prediction_band(values: Sequence[Number | None], m: int = 1,
                    level: float = PREDICTION_LEVEL) -> tuple[float, float, int]:
    """The normal-theory prediction interval for the mean of ``m`` new observations of a figure measured once per
    repeat of the same commit: ``(mean, half-width, n)`` with half-width = t_{(1+level)/2, n−1} · s · √(1/n + 1/m),
    where mean and s (sample standard deviation) are over the n non-missing ``values``. A rerun of the same commit
    (m repeats) lands outside mean ± half-width with probability 1 − ``level`` when the per-repeat figure is normal
    (each is a mean over many questions and steps), and the interval accounts for s being estimated from n values
    (hence t, not z). (NaN, NaN, n) when n < 2. Example: values [2.00, 2.02, 1.98, 2.01, 1.99] (s = 0.0158), m = 1:
    4.604 · 0.0158 · √1.2 = 0.0797, so (2.00, 0.0797, 5).
    """
    xs = [float(v) for v in values if not _missing(v)]
    n = len(xs)
    if n < 2 or m < 1:
        return math.nan, math.nan, n
    mean = sum(xs) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, student_t_quantile((1.0 + level) / 2.0, n - 1) * s * math.sqrt(1.0 / n + 1.0 / m), n


# ---- acceptance collapse: speculation that accepts (almost) nothing -----------------------------------------------
# A drafting label whose first draft position is accepted less often than this has collapsed: a draft from the same
# family as its target is accepted far above it, while a broken one sits near 0 and makes speculation slower than
# none. Seen in the wild: a 4-bit draft accepting nothing (mean acceptance length exactly 1.00) and running slower
# than no speculation (SGLang issue #39087); an FP8-quantised MTP head accepting nothing (llm-compressor issue #1843).
COLLAPSE_ACC1 = 0.05
# Compared with a baseline: a draft acceptance rate under this share of the baseline's is a collapse, not a drift
# (a tolerance fitted on noise is a few percent; a quarter is far beyond any noise and far above a broken draft's 0).
COLLAPSE_SHARE = 0.25
COLLAPSE_CAUSES = ("precision (a quantised or low-precision draft or target)", "head/target mismatch (a head trained "
                   "for another target or revision)", "chat template (the prompt format the head was trained on)")


def acceptance_collapsed(acc1: float | None, drafted_per_step: float | None) -> bool:
    """True when a label proposed drafts (``drafted_per_step`` > 0) and accepted its first draft position less
    often than :data:`COLLAPSE_ACC1`. Example: (0.01, 3.0) -> True; (0.01, None) -> False (it never drafted);
    (0.40, 3.0) -> False."""
    return (not _missing(drafted_per_step) and float(drafted_per_step) > 0 and not _missing(acc1)
            and float(acc1) < COLLAPSE_ACC1)


def rate_collapsed(rate_new: float | None, rate_base: float | None) -> bool:
    """True when the draft acceptance rate fell below :data:`COLLAPSE_SHARE` of the baseline's (which drafted).
    Example: (0.10, 0.60) -> True (0.10 < 0.15); (0.50, 0.60) -> False; (0.0, None) -> False."""
    return (not _missing(rate_base) and float(rate_base) > 0 and not _missing(rate_new)
            and float(rate_new) < COLLAPSE_SHARE * float(rate_base))
