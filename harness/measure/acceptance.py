"""Acceptance, defined once with its formula in each docstring: τ (mean accepted length) and the papers' τ
conventions, acceptance per draft position, the draft acceptance rate, drafts per step, the histogram of accepted
lengths, their bootstrap CIs, and acceptance collapse.

The raw counters and the conventions (prefill counted as a step, terminal steps, missing values) are those stated in
:mod:`harness.measure.metrics`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from harness.measure.metrics import Number, as_list, bootstrap_rows, is_missing


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
    out = tuple(int(counters[k]) if not is_missing(counters.get(k)) else own[i] for i, k in enumerate(keys))
    return out[0], out[1], out[2]


def _pooled(numerator: Sequence[Number | None], denominator: Sequence[Number | None]) -> tuple[float, float]:
    """Σ numerator and Σ denominator over the turns where both are measured."""
    pairs = [(n, d) for n, d in zip(numerator, denominator) if not is_missing(n) and not is_missing(d)]
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


def tau_pooled(accepted_tokens: Sequence[Number], steps: Sequence[Number]) -> float:
    """τ from per-question totals: Σ accepted_tokens / Σ steps, where a question's ``accepted_tokens`` is the sum
    of its turns' ``accept_lengths`` and ``steps`` their total length; the same number as :func:`tau` over those
    turns (a committed baseline keeps only these two totals per question). NaN when there is no step.
    Example: questions (6, 3) and (5, 2) -> 11 / 5 = 2.2, as tau([[1, 3, 2], [1, 4]]).
    """
    tokens, counts = as_list(accepted_tokens), as_list(steps)
    if len(tokens) != len(counts):
        raise ValueError(f"tau_pooled: accepted_tokens has {len(tokens)} values but steps has {len(counts)}")
    pairs = [(a, s) for a, s in zip(tokens, counts) if not is_missing(a) and not is_missing(s)]
    total = sum(s for _, s in pairs)
    return sum(a for a, _ in pairs) / total if pairs and total > 0 else math.nan


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
    idx = bootstrap_rows(len(steps), n_boot, seed)
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
    pairs = [(v, max(len(a) - 1, 0)) for v, a in zip(values, lists) if not is_missing(v)]
    steps = sum(s for _, s in pairs)
    return sum(v for v, _ in pairs) / steps if steps else math.nan


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
    idx = bootstrap_rows(len(num), n_boot, seed)
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
    return (not is_missing(drafted_per_step) and float(drafted_per_step) > 0 and not is_missing(acc1)
            and float(acc1) < COLLAPSE_ACC1)


def rate_collapsed(rate_new: float | None, rate_base: float | None) -> bool:
    """True when the draft acceptance rate fell below :data:`COLLAPSE_SHARE` of the baseline's (which drafted).
    Example: (0.10, 0.60) -> True (0.10 < 0.15); (0.50, 0.60) -> False; (0.0, None) -> False."""
    return (not is_missing(rate_base) and float(rate_base) > 0 and not is_missing(rate_new)
            and float(rate_new) < COLLAPSE_SHARE * float(rate_base))
