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
* A speed-up compares a method with the baseline on the same questions only (paired on question ids).
* Missing measurements are ``None`` / NaN and are skipped, never read as zero.
"""

from __future__ import annotations

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
    """Throughput = Σ new_tokens / Σ wall_time_s (a pooled ratio, not a mean of per-turn ratios).

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


def tau(accept_lengths_lists: Iterable[Sequence[int]]) -> float:
    """Mean accepted length τ = Σ new tokens / Σ steps, pooled over every step of every turn given.

    ``steps`` are target forwards including the prefill (``len(accept_lengths)``) and every step's count includes
    the bonus token, so vanilla (all ones) is exactly 1.0. This equals Spec-Bench's pooled per-step mean.
    Example: [[1, 3, 2], [1, 4]] -> (6 + 5) / (3 + 2) = 2.2.
    """
    lists = [list(a) for a in accept_lengths_lists]
    steps = sum(len(a) for a in lists)
    return sum(sum(a) for a in lists) / steps if steps else math.nan


def tau_script(accept_lengths_lists: Iterable[Sequence[int]]) -> float:
    """The EAGLE/Jakiro scripts' τ variant: Σ new tokens / Σ (steps − 1), pooled.

    Those scripts divide by the verification-loop index at exit, one step fewer than the steps taken, so each turn
    loses one step from the denominator and the value is larger than :func:`tau` (by +0.1 to +0.4 on their
    published outputs; their ``evaluation/speed_accept_len.py``). Reported in its own column only so that numbers can be compared
    with the papers'. Note: the scripts also average per question (a mean of ratios) and count tokens after the
    prefill differently; this column reproduces the denominator convention, not every quirk.
    Example: [[1, 3, 2], [1, 4]] -> (6 + 5) / (2 + 1) = 3.667; vanilla [[1, 1, 1, 1]] -> 4 / 3.
    """
    lists = [list(a) for a in accept_lengths_lists]
    steps = sum(max(len(a) - 1, 0) for a in lists)
    return sum(sum(a) for a in lists) / steps if steps else math.nan


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
    step drafted that deep. ``max_pos`` defaults to the deepest draft seen.
    Example: accepted [2, 0, 1], depths [3, 3, 1] -> i=1: 2/3, i=2: 1/2, i=3: 0/2 -> [0.667, 0.5, 0.0].
    """
    acc, depth = _steps(accepted_drafts_lists, draft_depths_lists)
    top = max_pos if max_pos is not None else int(depth.max(initial=0))
    out = []
    for i in range(1, top + 1):
        n = int((depth >= i).sum())
        out.append(int((acc >= i).sum()) / n if n else math.nan)
    return out


def conditional_acceptance_per_position(accepted_drafts_lists: Iterable[Sequence[int]],
                                        draft_depths_lists: Iterable[Sequence[int]],
                                        max_pos: int | None = None) -> list[float]:
    """Conditional acceptance at position i: P(accepted >= i | accepted >= i−1 and draft depth >= i).

        rate_i = #steps with accepted >= i / #steps with accepted >= i−1 and depth >= i

    The chance the i-th drafted token survives given that every token before it did; position 1 equals
    :func:`acceptance_per_position`. Example: accepted [2, 0, 1], depths [3, 3, 1] -> i=1: 2/3, i=2: 1/1
    (only the first step reached position 2 with room for it), i=3: 0/1 -> [0.667, 1.0, 0.0].
    """
    acc, depth = _steps(accepted_drafts_lists, draft_depths_lists)
    top = max_pos if max_pos is not None else int(depth.max(initial=0))
    out = []
    for i in range(1, top + 1):
        n = int(((acc >= i - 1) & (depth >= i)).sum())
        out.append(int((acc >= i).sum()) / n if n else math.nan)
    return out


def accept_length_histogram(accept_lengths_lists: Iterable[Sequence[int]]) -> dict[int, int]:
    """Counts of tokens appended per verification step ``{length: steps}``, sorted by length.

    Element 0 of every list (the prefill, always 1) is excluded: only verification steps are counted.
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


def peak_memory(peak_rss_bytes: Sequence[Number | None] | None = None,
                cuda_peak_reserved_bytes: Sequence[Number | None] | None = None) -> int | None:
    """Peak memory in bytes: the max of CUDA reserved memory if any turn has it, else the max of process RSS.

    On a GPU the device memory is what limits a method (host RSS is mostly the Python process); on CPU RSS is all
    there is. None when neither was measured. Example: rss [5, 7], cuda [None, None] -> 7; rss [5, 7], cuda [3] -> 3.
    """
    for values in (cuda_peak_reserved_bytes, peak_rss_bytes):
        present = [v for v in _as_list(values) if not _missing(v)] if values is not None else []
        if present:
            return int(max(present))
    return None


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


def speedup_ratio_ci(method_tps: PerQuestion, baseline_tps: PerQuestion, n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """:func:`speedup_ratio_of_means` with a paired percentile-bootstrap 95% CI: ``(speedup, lo, hi)``.

    Over the shared questions (as :func:`speedup_ratio_of_means`), resample questions with replacement ``n_boot``
    times, keeping each question's method and baseline values together, and take the 2.5th and 97.5th percentiles
    of mean(method) / mean(baseline) of the resamples. This is the band of the ablation plots, around the same
    number the paper table shows. Example: method {a: 30, b: 10}, baseline {a: 10, b: 10} -> 2.0, resamples give
    1.0 (b, b), 2.0 or 3.0 (a, a), so lo >= 1.0 and hi <= 3.0. NaN triple when no question is shared.
    """
    m, b = _paired(method_tps, baseline_tps)
    if not len(m):
        return math.nan, math.nan, math.nan
    idx = _bootstrap_rows(len(m), n_boot, seed)
    boot = m[idx].mean(axis=1) / b[idx].mean(axis=1)                                   # [n_boot]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(m.mean() / b.mean()), float(lo), float(hi)


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
