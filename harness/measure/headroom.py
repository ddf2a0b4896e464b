"""Headroom, time and energy, defined once with the formula in each docstring: energy per token, the free-draft
bound, the oracle bound S*, where a turn's time goes, the share of verification spent on rejected tokens, energy per
accepted token and cost per million tokens (the conventions of :mod:`harness.measure.metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.measure.metrics import Number, PerQuestion, as_list, is_missing, speedup_ratio_ci


def energy_per_token(energy_j: Number | Sequence[Number | None] | None,
                     new_tokens: Number | Sequence[Number]) -> float | None:
    """Energy per generated token in joules = Σ energy_j / Σ new_tokens over the turns that have an energy reading.

    None when no turn has one (CPU runs, or no NVML). Example: energy [10.0, None], tokens [100, 50] -> 0.1.
    """
    energies, tokens = as_list(energy_j), as_list(new_tokens)
    if len(energies) != len(tokens):
        raise ValueError(f"energy_per_token: energy_j has {len(energies)} values but new_tokens has {len(tokens)}")
    pairs = [(e, n) for e, n in zip(energies, tokens) if not is_missing(e) and not is_missing(n)]
    total_n = sum(n for _, n in pairs)
    return sum(e for e, _ in pairs) / total_n if pairs and total_n > 0 else None


# ---- headroom: what a method could gain, and where its time goes (arXiv:2601.11580: verification takes 42-95% of a
# step on vLLM; an oracle drafter bounds the speed-up) -------------------------------------------------------------

def free_draft_tokens_per_second(new_tokens: Sequence[Number | None], wall_time_s: Sequence[Number | None],
                                 draft_s: Sequence[Number | None]) -> float:
    """Throughput of the same turns with drafting at zero cost = Σ new_tokens / Σ (wall_time_s − draft_s), pooled
    over the turns given (one question's turns give that question's rate, as
    :func:`harness.measure.metrics.tokens_per_second`).

    ``draft_s`` is the engine's synchronised drafting time of a turn (``timings.draft_s``: the method's ``begin``,
    ``propose``, ``accept`` and ``observe``); every other part of the turn (prefill, verification forwards, host
    overhead) stays as measured, and so do the accepted lengths. The **free-draft bound** of a method is the speed-up
    these rates give over the baseline (:func:`harness.measure.metrics.speedup_ratio_ci`): what the same acceptance
    would buy with a drafter that costs nothing. NaN when any turn has no draft time (a turn without a synchronised
    split is not measured, never read as 0) or no time is left. Example: turns (new, wall, draft) = (30, 2.0, 0.5)
    and (10, 1.0, 0.5) -> 40 / (1.5 + 0.5) = 20.0 tokens/s; (30, 2.0, None) -> NaN.
    """
    tokens, times, drafts = as_list(new_tokens), as_list(wall_time_s), as_list(draft_s)
    if not len(tokens) == len(times) == len(drafts):
        raise ValueError(f"free_draft_tokens_per_second: {len(tokens)} new_tokens, {len(times)} wall times and "
                         f"{len(drafts)} draft times")
    if not tokens or any(is_missing(x) for x in (*tokens, *times, *drafts)):
        return math.nan
    left = sum(t - d for t, d in zip(times, drafts))
    return sum(tokens) / left if left > 0 else math.nan


def oracle_bound(oracle_tps: PerQuestion, baseline_tps: PerQuestion, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """The **oracle bound** S* with its 95% CI: ``(S*, lo, hi)`` = :func:`harness.measure.metrics.speedup_ratio_ci`
    of the ``oracle`` method's measured tokens/s over the baseline's on the same questions (question id -> tokens/s).

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
    columns = [as_list(c) for c in (wall_time_s, prefill_s, draft_s, verify_s, overhead_s)]
    if len({len(c) for c in columns}) != 1:
        raise ValueError(f"time_breakdown: columns of {[len(c) for c in columns]} turns")
    wall = sum(columns[0]) if not any(is_missing(x) for c in columns for x in c) else math.nan
    if not columns[0] or is_missing(wall) or wall <= 0:
        return dict.fromkeys(TIME_PARTS, math.nan)
    parts = [sum(c) for c in columns[1:]]
    return dict(zip(TIME_PARTS, [p / wall for p in parts] + [(wall - sum(parts)) / wall]))


def rejected_verification_share(tree_tokens: Sequence[Number | None], accepted_drafts: Sequence[Number | None],
                                verification_steps: Sequence[Number | None]) -> float:
    """Share of the verification work spent on slots that were rejected = (verified slots − accepted tokens) /
    verified slots, pooled over turns, where per turn verified slots = Σ_steps (N + 1) = ``counters.tree_tokens`` +
    verification steps (every forward scores its N draft slots and the pending root) and accepted tokens =
    Σ accepted drafts + verification steps (each step's accepted drafts and its bonus token, the verdict before any
    cut at EOS or the budget: :func:`harness.measure.acceptance.drafts_before_cut`). Verification steps are
    ``len(accept_lengths) − 1``.
    Side-branch slots (Lookahead's Jacobi window) are not in ``tree_tokens`` and are not counted. A turn without the
    counter is skipped; NaN when no turn has one (another engine, or a record made before the counter). Vanilla's
    share is 0 (one slot a step, always accepted). Example: turns (tree_tokens, Σ accepted, steps) = (12, 5, 3) and
    (0, 0, 2) -> (17 − 10) / 17 = 0.412.
    """
    rows = [(n, a, s) for n, a, s in zip(as_list(tree_tokens), as_list(accepted_drafts),
                                         as_list(verification_steps))
            if not (is_missing(n) or is_missing(a) or is_missing(s))]
    slots = sum(n + s for n, _, s in rows)
    return (slots - sum(a + s for _, a, s in rows)) / slots if slots else math.nan


def energy_per_accepted_token(energy_j: Sequence[Number | None], accepted_drafts: Sequence[Number | None]) -> float:
    """Energy per accepted draft token in joules = Σ energy_j / Σ accepted drafts, over the turns that have an
    energy reading: what each token the drafter won cost (:func:`energy_per_token` is per generated token). NaN
    without an energy reading or when no draft was accepted (vanilla). Example: energy [6.0, None], accepted
    [3, 4] -> 2.0."""
    pairs = [(e, a) for e, a in zip(as_list(energy_j), as_list(accepted_drafts))
             if not is_missing(e) and not is_missing(a)]
    accepted = sum(a for _, a in pairs)
    return sum(e for e, _ in pairs) / accepted if accepted > 0 else math.nan


def cost_per_million_tokens(cost_per_hour: Number | None, tokens_per_s: Number | None) -> float:
    """Cost of a million generated tokens at the user's price of the machine = cost_per_hour × 10^6 /
    (3600 × tokens_per_s), one request at a time (batch 1, as the tokens/s are measured). The price is the user's
    (``draftbench report --cost-per-hour``), never assumed: NaN without it or without a throughput.
    Example: 3.60 $/hour at 100 tokens/s -> 10.0 $ per million tokens."""
    if is_missing(cost_per_hour) or is_missing(tokens_per_s) or tokens_per_s <= 0:
        return math.nan
    return float(cost_per_hour) * 1e6 / (3600.0 * float(tokens_per_s))
