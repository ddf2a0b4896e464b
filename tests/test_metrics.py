"""Every metric on literal inputs with hand-computed expected values."""

import math

import pandas as pd
import pytest

from harness.measure import acceptance as ACC
from harness.measure import headroom as HR
from harness.measure import metrics as M


def test_tokens_per_second_pools_turns():
    # (100 + 50) / (2.0 + 0.5) = 60; a mean of per-turn rates would give (50 + 100) / 2 = 75
    assert M.tokens_per_second([100, 50], [2.0, 0.5]) == pytest.approx(60.0)
    assert M.tokens_per_second(30, 1.5) == pytest.approx(20.0)


def test_tokens_per_second_missing_and_zero_time():
    # an unmeasured turn is skipped, not read as zero time; no time at all gives NaN rather than a division error
    assert M.tokens_per_second([100, 7], [2.0, None]) == pytest.approx(50.0)
    assert math.isnan(M.tokens_per_second([5], [0.0]))
    with pytest.raises(ValueError, match="wall_time_s has 1"):
        M.tokens_per_second([1, 2], [1.0])


def test_tau_pooled_per_step_and_vanilla_is_one():
    # (1+3+2 + 1+4) / (3 + 2) = 11 / 5; a mean of per-turn ratios would be (2 + 2.5) / 2 = 2.25
    assert ACC.tau([[1, 3, 2], [1, 4]]) == pytest.approx(2.2)
    # vanilla appends one token per forward, prefill included: exactly 1
    assert ACC.tau([[1, 1, 1, 1], [1, 1]]) == 1.0
    assert math.isnan(ACC.tau([]))


def test_speedup_ratio_of_means_pairs_questions():
    # question "c" has no baseline and "d" has no method value: both dropped; (30+10)/2 / ((10+10)/2) = 2
    method = {"a": 30.0, "b": 10.0, "c": 99.0}
    base = {"a": 10.0, "b": 10.0, "d": 1.0}
    assert M.speedup_ratio_of_means(method, base) == pytest.approx(2.0)
    # a pandas Series keyed by question id works the same
    assert M.speedup_ratio_of_means(pd.Series(method), pd.Series(base)) == pytest.approx(2.0)
    assert math.isnan(M.speedup_ratio_of_means({"a": 1.0}, {"b": 1.0}))


def test_speedup_geomean_point_estimate_and_ci():
    # ratios 2 and 8 -> geometric mean 4 (the ratio of means would be (20+80)/(10+10) = 5)
    method, base = {"a": 20.0, "b": 80.0, "x": 5.0}, {"a": 10.0, "b": 10.0}
    g, lo, hi = M.speedup_geomean(method, base, n_boot=500, seed=0)
    assert g == pytest.approx(4.0)
    # resamples are {2,2}, {2,8}, {8,8}: gmeans 2, 4, 8; the CI must cover the estimate and stay in [2, 8]
    assert 2.0 - 1e-9 <= lo <= g <= hi <= 8.0 + 1e-9
    assert lo < hi
    # seeded: the same call gives the same interval, bit for bit
    assert M.speedup_geomean(method, base, n_boot=500, seed=0) == (g, lo, hi)


def test_speedup_geomean_single_question_and_none():
    # one question: every resample is that question, so the CI collapses onto it
    assert M.speedup_geomean({"q": 3.0}, {"q": 1.5}) == pytest.approx((2.0, 2.0, 2.0))
    assert all(math.isnan(x) for x in M.speedup_geomean({}, {"q": 1.0}))


def test_acceptance_per_position():
    # steps: (accepted, depth) = (2, 3), (0, 3) in turn 1 and (1, 1) in turn 2
    # i=1: accepted>=1 in 2 of the 3 steps with depth>=1; i=2: 1 of the 2 steps with depth>=2; i=3: 0 of 2
    rates = ACC.acceptance_per_position([[2, 0], [1]], [[3, 3], [1]])
    assert rates == pytest.approx([2 / 3, 0.5, 0.0])
    # max_pos pads with NaN where no step drafted that deep
    padded = ACC.acceptance_per_position([[2, 0], [1]], [[3, 3], [1]], max_pos=4)
    assert padded[:3] == pytest.approx([2 / 3, 0.5, 0.0]) and math.isnan(padded[3])


def test_conditional_acceptance_per_position():
    # i=2 conditions on accepted>=1 and depth>=2: only the (2, 3) step qualifies, and it accepted position 2
    rates = ACC.conditional_acceptance_per_position([[2, 0], [1]], [[3, 3], [1]])
    assert rates == pytest.approx([2 / 3, 1.0, 0.0])


def test_acceptance_rejects_inconsistent_counters():
    # more accepted than drafted is a bug in the method's counters, not a rate above 1
    with pytest.raises(ValueError, match="between 0 and"):
        ACC.acceptance_per_position([[4]], [[3]])
    with pytest.raises(ValueError, match="turn 0"):
        ACC.acceptance_per_position([[1, 1]], [[3]])


def test_accept_length_histogram_excludes_prefill():
    # the leading 1 of each list is the prefill and must not be counted
    assert ACC.accept_length_histogram([[1, 3, 1], [1, 3]]) == {1: 1, 3: 2}
    assert ACC.accept_length_histogram([[1]]) == {}


def test_energy_per_token():
    # the turn without a reading is dropped from both sums: 10 J / 100 tokens
    assert HR.energy_per_token([10.0, None], [100, 50]) == pytest.approx(0.1)
    assert HR.energy_per_token([None, None], [1, 2]) is None
    assert HR.energy_per_token(None, 5) is None


def test_peak_memory_prefers_cuda_when_present():
    # on CPU only RSS exists; on GPU the device's peak allocated memory is the headline (reserved would depend on
    # the allocator cache that earlier methods left behind)
    assert M.peak_memory([5, 7], [None, None]) == 7
    assert M.peak_memory([5, 7], [3, None]) == 3
    assert M.peak_memory([None], [None]) is None


def test_quality_ignores_unscored():
    assert M.quality([1.0, None, 0.0, 1.0, float("nan")]) == pytest.approx(2 / 3)
    assert M.quality([None]) is None


def test_lossless_share():
    base = [
        {"suite": "s", "question_id": 1, "turn": 0, "temperature": 0.0, "seed": 0, "output_ids": [5, 6, 7]},
        {"suite": "s", "question_id": 2, "turn": 0, "temperature": 0.0, "seed": 0, "output_ids": [1, 2]},
        {"suite": "s", "question_id": 3, "turn": 0, "temperature": 0.0, "seed": 0, "output_ids": [9]},
    ]
    method = [
        # question id given as a string matches the baseline's integer id (ids are compared as strings)
        {"suite": "s", "question_id": "1", "turn": 0, "temperature": 0, "seed": 0, "output_ids": [5, 6, 7]},
        {"suite": "s", "question_id": "2", "turn": 0, "temperature": 0.0, "seed": 0, "output_ids": [1, 3]},
        {"suite": "s", "question_id": "3", "turn": 0, "temperature": 0.0, "seed": 0, "output_ids": [9]},
        # no baseline turn for this one (different seed): skipped, not counted as a mismatch
        {"suite": "s", "question_id": "3", "turn": 0, "temperature": 0.0, "seed": 1, "output_ids": [8]},
    ]
    assert M.lossless_share(method, base) == pytest.approx(2 / 3)
    assert math.isnan(M.lossless_share(method, []))
    with pytest.raises(KeyError, match="seed"):
        M.lossless_share([{"suite": "s", "question_id": 1, "turn": 0, "temperature": 0.0}], base)


def test_mean_tokens_per_second_skips_unmeasured():
    # a question that errored has NaN tokens/s and must not drag the mean towards zero
    assert M.mean_tokens_per_second({"a": 30.0, "b": 10.0, "c": float("nan")}) == pytest.approx(20.0)
    assert math.isnan(M.mean_tokens_per_second([]))


def test_suite_mean_is_equal_weight():
    assert M.suite_mean([2.0, 3.0, float("nan"), None]) == pytest.approx(2.5)
    assert math.isnan(M.suite_mean([None]))


# the worked example shared by the tau-convention docstrings: question a has one turn, b has two
CONVENTION_EXAMPLE = {"a": [[1, 3, 2, 4]], "b": [[1, 2, 2], [1, 1, 3]]}


def test_tau_conventions_on_one_set_of_records():
    """Each published convention recomputed from the same records (S = Σ accept_lengths[1:], K = len − 1 per turn):
    a wrong denominator (loop index vs steps vs forwards) or pooling vs per-question averaging changes these."""
    # EAGLE/Jakiro scripts: per question Σ S / Σ (K − 1): a 9 / 2 = 4.5, b (4 + 4) / (1 + 1) = 4.0 -> mean 4.25
    assert ACC.tau_eagle_script(CONVENTION_EXAMPLE) == pytest.approx(4.25)
    # unbiased per-question step mean: a 9 / 3 = 3.0, b 8 / 4 = 2.0 -> 2.5
    assert ACC.tau_eagle_step(CONVENTION_EXAMPLE) == pytest.approx(2.5)
    # Spec-Bench #MAT: pooled over all verification steps, prefill left out: 17 / 7
    assert ACC.tau_spec_bench(CONVENTION_EXAMPLE) == pytest.approx(17 / 7)
    # draftbench: prefill counted as a step: 20 tokens / 10 forwards
    assert ACC.tau_draftbench(CONVENTION_EXAMPLE) == pytest.approx(2.0)
    assert {c: ACC.tau_in_convention(c, CONVENTION_EXAMPLE) for c in ACC.TAU_CONVENTIONS} == pytest.approx(
        {"draftbench": 2.0, "eagle_script": 4.25, "eagle_step": 2.5, "spec_bench": 17 / 7})


def test_tau_conventions_on_vanilla_and_edge_cases():
    """Vanilla is 1.0 in every convention except the scripts' (K/(K−1) > 1, the documented bias); a question with a
    single verification step has no loop index and is skipped rather than dividing by zero; names are checked."""
    vanilla = {"q": [[1, 1, 1, 1, 1]]}  # prefill + 4 steps of one token
    assert ACC.tau_spec_bench(vanilla) == ACC.tau_eagle_step(vanilla) == ACC.tau_draftbench(vanilla) == 1.0
    assert ACC.tau_eagle_script(vanilla) == pytest.approx(4 / 3)
    assert ACC.tau_eagle_script({"one_step": [[1, 5]], "ok": [[1, 2, 4]]}) == pytest.approx(6.0)
    assert math.isnan(ACC.tau_eagle_script({"one_step": [[1, 5]]}))
    with pytest.raises(ValueError, match="unknown tau convention 'mat'"):
        ACC.tau_in_convention("mat", vanilla)


def test_speedup_ratio_ci_one_group_and_suite_mean():
    """The reported speed-up (ratio of means) with a paired bootstrap CI; several groups average with equal weight
    and resample within each group. A CI not covering the estimate or mixing groups' questions would fail here."""
    est, lo, hi = M.speedup_ratio_ci([({"a": 20.0, "b": 40.0}, {"a": 10.0, "b": 10.0})], n_boot=500, seed=0)
    assert est == pytest.approx(3.0)            # (20 + 40) / 2 / 10
    assert 2.0 - 1e-9 <= lo <= est <= hi <= 4.0 + 1e-9 and lo < hi
    # two suites: 3.0 and 1.0 -> 2.0 (a pooled ratio over the four questions would be (60 + 10) / (20 + 10))
    est2, lo2, hi2 = M.speedup_ratio_ci([({"a": 20.0, "b": 40.0}, {"a": 10.0, "b": 10.0}),
                                         ({"c": 5.0}, {"c": 5.0})], n_boot=500, seed=0)
    assert est2 == pytest.approx(2.0) and 1.5 - 1e-9 <= lo2 <= 2.0 <= hi2 <= 2.5 + 1e-9
    assert all(math.isnan(x) for x in M.speedup_ratio_ci([({"a": 1.0}, {"b": 1.0})]))


def test_measured_vs_reported():
    """delta = measured − reported, ratio = measured / reported; missing numbers give NaN, never 0."""
    assert M.measured_vs_reported(2.5, 3.62) == pytest.approx((-1.12, 2.5 / 3.62))
    assert all(math.isnan(x) for x in M.measured_vs_reported(None, 3.0))
    assert all(math.isnan(x) for x in M.measured_vs_reported(2.0, float("nan")))
    assert M.measured_vs_reported(1.0, 0.0)[0] == 1.0 and math.isnan(M.measured_vs_reported(1.0, 0.0)[1])


def test_tau_ci_pools_and_resamples_questions():
    # tau is the pooled (4 + 2) / 4 = 1.5 (a mean of per-question taus would also be 1.5 here, but not below);
    # resamples can only be 1.0, 1.5 or 2.0; equal questions leave no spread
    tau, lo, hi = ACC.tau_ci([[[1, 3]], [[1, 1]]], n_boot=500, seed=1)
    assert tau == pytest.approx(1.5) and 1.0 <= lo <= 1.5 <= hi <= 2.0
    assert ACC.tau_ci([[[1, 3]], [[1, 3]]]) == pytest.approx((2.0, 2.0, 2.0))
    # pooled over turns of unequal length: (1+3+2+1+4) / 5 = 2.2, not mean(2.0, 2.5) = 2.25
    assert ACC.tau_ci([[[1, 3, 2], [1, 4]]])[0] == pytest.approx(2.2)
    assert all(math.isnan(v) for v in ACC.tau_ci([]))


def test_speedup_ratio_ci_pairs_questions():
    # the point estimate is the paper's ratio of means on shared questions (c dropped): mean(30, 10) / 10 = 2.0;
    # resampling keeps pairs, so the band lies within the per-question ratios 1.0 and 3.0
    s, lo, hi = M.speedup_ratio_ci([({"a": 30.0, "b": 10.0, "c": 99.0}, {"a": 10.0, "b": 10.0})], n_boot=500)
    assert s == pytest.approx(2.0) and 1.0 <= lo <= 2.0 <= hi <= 3.0
    assert M.speedup_ratio_ci([({"a": 4.0}, {"a": 2.0})]) == pytest.approx((2.0, 2.0, 2.0))
    assert all(math.isnan(v) for v in M.speedup_ratio_ci([({"a": 1.0}, {"b": 1.0})]))


def test_per_verification_step_excludes_the_prefill():
    # 9 draft forwards over 3 + 1 verification steps = 2.25; counting the prefill would give 9 / 6 = 1.5
    assert ACC.per_verification_step([6, 3], [[1, 2, 3, 1], [1, 4]]) == pytest.approx(2.25)
    assert ACC.per_verification_step([6, None], [[1, 2, 3, 1], [1, 4]]) == pytest.approx(2.0)
    assert math.isnan(ACC.per_verification_step([1], [[1]]))
    with pytest.raises(ValueError, match="2 totals but 1 turns"):
        ACC.per_verification_step([1, 2], [[1, 2]])


def test_first_difference():
    assert M.first_difference([5, 6, 7], [5, 6, 9, 1]) == 2
    assert M.first_difference([5, 6], [5, 6, 7]) == 2
    assert M.first_difference("ab", "ab") is None
    assert M.first_difference("Once upOn", "Once upon") == 7


def test_acceptance_per_position_ci_matches_the_pooled_rate():
    # the rate is the pooled acceptance_per_position of all steps; the band comes from resampling questions
    out = ACC.acceptance_per_position_ci([[[2]], [[0]]], [[[3]], [[3]]], max_pos=3, n_boot=500)
    assert out[0][0] == pytest.approx(0.5) and 0.0 <= out[0][1] <= 0.5 <= out[0][2] <= 1.0
    assert out[2] == pytest.approx((0.0, 0.0, 0.0))
    acc, depths = [[[2, 0], [1]], [[3]]], [[[3, 3], [1]], [[4]]]
    pooled = ACC.acceptance_per_position([a for q in acc for a in q], [d for q in depths for d in q], max_pos=4)
    got = [r for r, _, _ in ACC.acceptance_per_position_ci(acc, depths, max_pos=4, n_boot=10)]
    assert got == pytest.approx(pooled)


def test_free_draft_throughput_removes_only_the_draft_time():
    """(30 + 10) / ((2.0 − 0.5) + (1.0 − 0.5)) = 20 tokens/s. A bound that removed more than the draft time would be
    higher; one that averaged per-turn rates would give (30/1.5 + 10/0.9) / 2 = 15.6 in the second case, not the
    pooled 40 / 2.4 = 16.7."""
    assert HR.free_draft_tokens_per_second([30, 10], [2.0, 1.0], [0.5, 0.5]) == pytest.approx(20.0)
    assert HR.free_draft_tokens_per_second([30, 10], [2.0, 1.0], [0.5, 0.1]) == pytest.approx(40 / 2.4)
    # a turn without a (synchronised) draft time is not measured: n/a, never a draft time of 0
    assert math.isnan(HR.free_draft_tokens_per_second([30, 10], [2.0, 1.0], [0.5, None]))
    with pytest.raises(ValueError, match="2 new_tokens, 2 wall times and 1 draft times"):
        HR.free_draft_tokens_per_second([1, 2], [1.0, 1.0], [0.1])


def test_oracle_bound_is_the_ratio_of_means_with_its_bootstrap_ci():
    """Oracle {a: 40, b: 60} over baseline {a: 10, b: 10}: 50 / 10 = 5.0; the resamples {a,a}, {a,b}, {b,b} give 4, 5,
    6, so the CI lies within [4, 6]. A per-question mean of ratios would give the same here, so a question only one
    side has (c) must be dropped: with it the estimate would move."""
    s, lo, hi = HR.oracle_bound({"a": 40.0, "b": 60.0, "c": 500.0}, {"a": 10.0, "b": 10.0})
    assert s == pytest.approx(5.0) and 4.0 <= lo <= 5.0 <= hi <= 6.0


def test_time_breakdown_shares_of_the_wall_time():
    """The docstring example: wall 10 = prefill 1 + draft 2 + verify 6 + overhead 0.5 + other 0.5; pooled over turns
    (Σ part / Σ wall), and a turn without a split makes every share n/a (NaN), never 0."""
    assert HR.time_breakdown([10.0], [1.0], [2.0], [6.0], [0.5]) == pytest.approx(
        {"prefill": 0.1, "draft": 0.2, "verify": 0.6, "overhead": 0.05, "other": 0.05})
    pooled = HR.time_breakdown([4.0, 6.0], [0.5, 0.5], [1.0, 1.0], [2.0, 4.0], [0.25, 0.25])
    assert pooled["verify"] == pytest.approx(0.6) and pooled["other"] == pytest.approx(0.05)
    assert all(math.isnan(v) for v in HR.time_breakdown([10.0], [1.0], [None], [6.0], [0.5]).values())
    assert list(HR.time_breakdown([], [], [], [], [])) == list(HR.TIME_PARTS)


def test_rejected_verification_share_counts_every_slot_of_the_forward():
    """(tree_tokens, Σ accepted, steps) = (12, 5, 3) and (0, 0, 2): slots 15 + 2 = 17, accepted 8 + 2 = 10 ->
    7 / 17. Counting draft slots only would give 7 / 12; vanilla-like steps (one slot, always accepted) give 0."""
    assert HR.rejected_verification_share([12, 0], [5, 0], [3, 2]) == pytest.approx(7 / 17)
    assert HR.rejected_verification_share([0], [0], [5]) == 0.0
    assert math.isnan(HR.rejected_verification_share([None], [5], [3]))


def test_energy_per_accepted_token_and_cost_per_million_tokens():
    """6 J over 3 accepted drafts (the turn without energy is skipped) = 2 J; no accepted draft (vanilla) is n/a.
    3.60 per hour at 100 tokens/s: 360,000 tokens an hour -> 10.0 per million; no price -> n/a, never a default."""
    assert HR.energy_per_accepted_token([6.0, None], [3, 4]) == pytest.approx(2.0)
    assert math.isnan(HR.energy_per_accepted_token([6.0], [0]))
    assert HR.cost_per_million_tokens(3.6, 100.0) == pytest.approx(10.0)
    assert math.isnan(HR.cost_per_million_tokens(None, 100.0))
    assert math.isnan(HR.cost_per_million_tokens(3.6, float("nan")))
