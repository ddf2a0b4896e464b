"""The headroom ledger and where the time goes (issue #50): the report's table from literal records against
hand-computed numbers, the ``oracle`` method on a tiny target, and RAPL energy from a fake powercap folder.

The run (suite s, temperature 0, one turn per question):
  vanilla   a: 10 tokens / 2.0 s = 5 tok/s, b: 10 / 1.0 = 10 -> mean 7.5
  pld       a: 10 / 1.0 = 10 (draft 0.5, verify 0.3, overhead 0.1, prefill 0.05), b: 10 / 0.5 = 20 (draft 0.25,
            verify 0.15, overhead 0.05, prefill 0.05) -> S = 15 / 7.5 = 2.0; free-draft a: 10 / 0.5 = 20,
            b: 10 / 0.25 = 40 -> 30 / 7.5 = 4.0; shares of Σ wall 1.5: prefill 0.1 / 1.5, draft 0.75 / 1.5 = 0.5,
            verify 0.45 / 1.5 = 0.3, overhead 0.15 / 1.5 = 0.1, other 0.05 / 1.5; rejected: 2 steps a turn with 4 draft
            slots each (tree_tokens 8), accepted 3 and 4 -> slots 2 * (8 + 2) = 20, accepted 2 * (7 + 2) = 18 -> 0.1
  pld-async the same turns, timings not synchronised -> free-draft and shares n/a
  oracle    (deployable false, pair pld) a: 10 / 0.5 = 20, b: 10 / 0.25 = 40 -> S* = 30 / 7.5 = 4.0; energy 2 J + 1 J
            over 20 tokens = 0.15 J/token, over 16 accepted drafts = 0.1875 J
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
import torch

from harness.engine.sampling import SamplingParams
from harness.measure.trackers import Rapl, Tracker
from harness.registry import get_method
from harness.report import markdown as MD
from harness.report import report as R
from harness.report import tables as T
from methods.oracle import oracle_tree
from methods.vanilla import Vanilla
from tests.support.helpers import check_generation, tiny_target

GREEDY = SamplingParams()


def rec(label, method, qid, new, wall, lengths, accepted=(), depths=(), timings=None, synced=None, **extra):
    r = {"run_id": "run-1", "status": "ok", "error": None, "method": method, "label": label, "lossless": True,
         "method_options": {}, "suite": "s", "suite_version": "1", "question_id": qid, "category": "c", "turn": 0,
         "question_turns": 1, "target": "tiny", "dtype": "float32", "device": "cpu", "temperature": 0.0,
         "top_p": 1.0, "seed": 0, "repeat": 0, "prompt_tokens": 5, "new_tokens": new, "steps": len(lengths),
         "accept_lengths": list(lengths), "accepted_drafts": list(accepted), "draft_depths": list(depths),
         "wall_time_s": wall, "prefill_time_s": 0.05, "stop_reason": "eos", "output_text": "x",
         "output_ids": list(range(new)), "rss_bytes": 1, "peak_rss_bytes": 1, "cuda_peak_allocated_bytes": None,
         "cuda_peak_reserved_bytes": None, "nvml_used_bytes": None, "energy_j": None, "mean_power_w": None,
         "timings": timings or {}, "timings_synchronised": synced, "counters": {}, "score": None, "score_name": None,
         "timestamp": "2025-01-01T00:00:01"}
    r.update(extra)
    return r


def split(wall):
    """pld's timings for a turn of ``wall`` seconds: draft half of it, verify 0.3, overhead 0.1 of it."""
    return {"draft_s": wall / 2, "verify_s": 0.3 * wall, "overhead_s": 0.1 * wall}


SPEC = dict(lengths=[1, 4, 5], accepted=[3, 4], depths=[4, 4], counters={"tree_tokens": 8, "draft_forwards": 0})
ORACLE = dict(lengths=[1, 5, 4], accepted=[4, 4], depths=[4, 4], method_options={"k": 4, "slots": 0, "pair": "pld"},
              deployable=False, energy_source="rapl", counters={"tree_tokens": 8})
RECORDS = [
    rec("vanilla", "vanilla", "a", 10, 2.0, [1] * 10),
    rec("vanilla", "vanilla", "b", 10, 1.0, [1] * 10),
    rec("pld", "pld", "a", 10, 1.0, timings=split(1.0), synced=True, **SPEC),
    rec("pld", "pld", "b", 10, 0.5, timings=split(0.5), synced=True, **SPEC),
    rec("pld-async", "pld", "a", 10, 1.0, timings=split(1.0), synced=False, **SPEC),
    rec("pld-async", "pld", "b", 10, 0.5, timings=split(0.5), synced=False, **SPEC),
    rec("oracle", "oracle", "a", 10, 0.5, energy_j=2.0, **ORACLE),
    rec("oracle", "oracle", "b", 10, 0.25, energy_j=1.0, **ORACLE),
]


def headroom(records=RECORDS, **kw) -> pd.DataFrame:
    return T.headroom_table(T.turns_table(records), **kw).set_index("label")


def test_the_ledger_matches_the_hand_computation():
    """S, the free-draft bound and the oracle bound S* of pld (module docstring). A free-draft bound that removed
    more than the draft time, an S* not taken from the oracle paired with pld, or CIs that do not hold their
    estimate, fail here."""
    h = headroom().loc["pld"]
    assert h["speedup"] == pytest.approx(2.0) and h["free_draft_speedup"] == pytest.approx(4.0)
    assert h["oracle_label"] == "oracle" and h["oracle_speedup"] == pytest.approx(4.0)
    for est, lo, hi in (("speedup", "speedup_ci_lo", "speedup_ci_hi"),
                        ("free_draft_speedup", "free_draft_ci_lo", "free_draft_ci_hi"),
                        ("oracle_speedup", "oracle_ci_lo", "oracle_ci_hi")):
        assert h[lo] <= h[est] <= h[hi], est
    assert bool(h["deployable"]) and not bool(headroom().loc["oracle", "deployable"])


def test_an_oracle_paired_with_one_label_holds_no_other_labels_bound():
    """The oracle names pld in ``pair``: pld-async and the baseline get no S* (n/a), and the oracle's own row holds
    its own. At temperature > 0 there is no S* at all: the greedy continuation is not what the target samples."""
    h = headroom()
    assert pd.isna(h.loc["pld-async", "oracle_label"]) and math.isnan(h.loc["pld-async", "oracle_speedup"])
    assert pd.isna(h.loc["vanilla", "oracle_label"])
    assert h.loc["oracle", "oracle_speedup"] == pytest.approx(4.0)
    warm = headroom([{**r, "temperature": 0.7} for r in RECORDS])
    assert warm["oracle_speedup"].isna().all() and warm["oracle_label"].isna().all()


def test_under_another_runtime_the_pair_names_that_runtimes_entry():
    """The same run compiled: labels end in "@compiled" while the oracle's option still says pair "pld"; the oracle
    bound of pld@compiled is oracle@compiled's (a pairing by the literal option would find no pld and give n/a)."""
    compiled = [{**r, "label": f"{r['label']}@compiled", "runtime": "compiled"} for r in RECORDS]
    h = headroom(compiled)
    assert h.loc["pld@compiled", "oracle_label"] == "oracle@compiled"
    assert h.loc["pld@compiled", "oracle_speedup"] == pytest.approx(4.0)


def test_where_the_time_goes_and_the_rejected_share():
    """pld's shares of its wall time and the share of verified slots not accepted (module docstring). A share taken
    from an unsynchronised split (pld-async) would be a number; it must be n/a with the reason, never 0."""
    h = headroom()
    pld = h.loc["pld"]
    assert [pld[f"share_{p}"] for p in ("prefill", "draft", "verify", "overhead", "other")] == pytest.approx(
        [0.1 / 1.5, 0.5, 0.3, 0.1, 0.05 / 1.5])
    assert pld["rejected_verify_share"] == pytest.approx(0.1) and pd.isna(pld["timing_note"])
    unsynced = h.loc["pld-async"]
    assert all(math.isnan(unsynced[f"share_{p}"]) for p in ("prefill", "draft", "verify", "overhead", "other"))
    assert math.isnan(unsynced["free_draft_speedup"]) and unsynced["timing_note"] == T.NO_SPLIT
    assert unsynced["rejected_verify_share"] == pytest.approx(0.1)  # counts, not timings: known either way


def test_energy_and_cost_per_million_tokens():
    """The oracle's 3 J over 20 tokens and over 16 accepted drafts; the cost of a million tokens at 3.6 per hour
    for pld's mean 15 tokens/s is 3.6e6 / (3600 * 15); no price given: n/a, never a default."""
    h = headroom(cost_per_hour=3.6)
    assert h.loc["oracle", "energy_per_token_j"] == pytest.approx(0.15)
    assert h.loc["oracle", "energy_per_accepted_token_j"] == pytest.approx(0.1875)
    assert h.loc["oracle", "energy_source"] == "rapl" and h.loc["pld", "energy_source"] == "n/a: not recorded"
    assert h.loc["pld", "cost_per_million_tokens"] == pytest.approx(3.6e6 / (3600 * 15))
    assert headroom()["cost_per_million_tokens"].isna().all()


def test_the_report_has_the_ledger_its_plots_and_marks_the_oracle(tmp_path):
    """write_report writes tables/headroom.csv, both plots, a Headroom section in summary.md and report.html, and "‡"
    on the oracle wherever it is listed (paper table, acceptance table, ledger)."""
    run = tmp_path / "run-1"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "run-1", "config": {"baseline": "vanilla"}}))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    paths = R.write_report(run, cost_per_hour=2.0)
    table = pd.read_csv(paths["headroom_csv"]).set_index("label")
    assert table.loc["pld", "free_draft_speedup"] == pytest.approx(4.0)
    assert paths["headroom_plot"].stat().st_size > 0 and paths["time_breakdown_plot"].stat().st_size > 0
    md = paths["summary_md"].read_text()
    assert "**Headroom**" in md and "| oracle ‡ | 4.00× / 3.33 |" in md and "| oracle ‡ | harness |" in md
    assert "| pld | s | 0 | 2.00 [" in md and MD.NOT_DEPLOYABLE in md
    html = paths["report_html"].read_text()
    assert 'id="headroom"' in html and "headroom-table" in html


def test_report_cli_takes_the_price_per_hour(tmp_path, capsys):
    """`draftbench report RUN --cost-per-hour 3.6` puts the price and the cost of a million tokens in headroom.csv
    (pld's 15 tokens/s: 66.67); a flag that did not reach the table would leave them n/a. The printed speed-up CIs
    mark the oracle "‡" as every table does."""
    from harness.cli import main

    run = tmp_path / "run-1"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert main(["report", str(run), "--cost-per-hour", "3.6"]) == 0
    assert re.search(r"^  oracle ‡ +s 4\.00 \[", capsys.readouterr().out, re.M)  # the printed CIs mark the bound
    table = pd.read_csv(run / "tables" / "headroom.csv").set_index("label")
    assert table.loc["pld", "cost_per_hour"] == 3.6
    assert table.loc["pld", "cost_per_million_tokens"] == pytest.approx(3.6e6 / (3600 * 15))


# ---- the oracle method ----------------------------------------------------------------------------------------------
PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])
BUDGET = 20


def test_oracle_tree_pads_with_tokens_that_are_not_the_greedy_one():
    """The docstring example: the chain, then children of the root after the chain's first token (mod the
    vocabulary); a pad equal to the greedy token would be accepted instead of the chain."""
    tree = oracle_tree([7, 8], 4, 10)
    assert tree.tokens.tolist() == [7, 8, 8, 9] and tree.parents.tolist() == [-1, 0, -1, -1]
    assert len(oracle_tree([], 4, 10)) == 0
    with pytest.raises(ValueError, match="vocabulary has 3"):
        oracle_tree([1], 5, 3)


def test_bad_budgets_are_refused_naming_the_option():
    """A chain shorter than 1, padding below the chain, or more slots than a verification forward holds (127 beside
    the root) would fail later inside the engine, or silently verify another budget."""
    oracle = get_method("oracle")
    for options, message in (({"k": 0}, "k must be >= 1"), ({"k": 4, "slots": 2}, "slots must be 0"),
                             ({"k": 7, "slots": 128}, "at most 127")):
        with pytest.raises(ValueError, match=message):
            oracle.create(None, options)


def test_every_step_accepts_the_whole_chain_and_verifies_the_budget():
    """k = 3, slots = 6: every full step accepts 3 drafts (4 tokens), scores 6 draft slots, and the output is the
    target's greedy output. A step that accepted less, or a tree without its padding, fails."""
    target = tiny_target(eos=False)
    method = get_method("oracle").create(target, {"k": 3, "slots": 6})
    method.prepare_turn(PROMPT, BUDGET)
    gen = method.generate(PROMPT, BUDGET, GREEDY)
    assert gen.token_ids == Vanilla(target).generate(PROMPT, BUDGET, GREEDY).token_ids
    assert gen.accept_lengths == [1, 4, 4, 4, 4, 3] and gen.accepted_drafts == [3] * 5
    assert gen.counters["tree_tokens"] == 6 * 5 and gen.method_notes is None
    check_generation(gen, method, PROMPT.shape[1], BUDGET)
    assert method.describe()["deployable"] is False


def count_forwards(target, run) -> int:
    calls = []
    forward = target.model.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    target.model.forward = counted
    try:
        run()
    finally:
        del target.model.forward
    return len(calls)


def test_the_greedy_pass_is_outside_the_turn_when_the_runner_prepares_it():
    """After prepare_turn the turn itself runs only its own target forwards (steps); called without it, generate
    makes the greedy pass inside the call (BUDGET more forwards), which the runner's timing would include."""
    target = tiny_target(eos=False)
    method = get_method("oracle").create(target, {"k": 3})
    method.prepare_turn(PROMPT, BUDGET)
    prepared = count_forwards(target, lambda: method.generate(PROMPT, BUDGET, GREEDY))
    inline = count_forwards(target, lambda: method.generate(PROMPT, BUDGET, GREEDY))
    assert prepared == 6 and inline == 6 + BUDGET
    method.prepare_turn(PROMPT.clone(), BUDGET)  # prepared for another prompt: not used, the pass is made again
    assert count_forwards(target, lambda: method.generate(PROMPT, BUDGET, GREEDY)) == 6 + BUDGET


def test_a_continuation_that_departs_stops_the_drafts_and_says_where():
    """A prepared continuation whose fourth token is wrong: step 1 drafts the right tokens 1-3, so the next root is
    the target's true fourth token, not the continuation's; from that step on the oracle drafts nothing, says so in
    method_notes, and the output stays the target's greedy output (verification decides, not the oracle)."""
    target = tiny_target(eos=False)
    want = Vanilla(target).generate(PROMPT, BUDGET, GREEDY).token_ids
    method = get_method("oracle").create(target, {"k": 3})
    wrong = list(want)
    wrong[4] = (wrong[4] + 1) % 32
    method._prepared = (PROMPT, BUDGET, wrong)
    gen = method.generate(PROMPT, BUDGET, GREEDY)
    assert gen.token_ids == want
    assert gen.method_notes == {"lost_at_step": 2} and gen.draft_depths[1:] == [0] * (len(gen.draft_depths) - 1)


def test_a_run_records_the_oracle_as_not_deployable(tmp_path):
    """Through the runner: the oracle's records say deployable false (vanilla's carry no such field), the manifest
    says it, and the oracle reproduces vanilla's greedy tokens with 4 tokens per step."""
    from harness.measure.records import read_records
    from harness.run.config import MethodSpec, RunConfig
    from harness.run.runner import run

    suite = tmp_path / "q.jsonl"
    suite.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["hello there"]}) + "\n")
    cfg = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("oracle", options={"k": 3})], suites=[str(suite)],
                    max_new_tokens=12, warmup=0, output_dir=str(tmp_path / "results"), score=False)
    run_dir = run(cfg, target=tiny_target(eos=False), progress=False)
    recs = {r["label"]: r for r in read_records(run_dir)}
    assert recs["oracle"]["deployable"] is False and "deployable" not in recs["vanilla"]
    assert recs["oracle"]["output_ids"] == recs["vanilla"]["output_ids"]
    assert recs["oracle"]["accept_lengths"] == [1, 4, 4, 3]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["methods"]["oracle"]["deployable"] is False


# ---- RAPL energy on a CPU target -------------------------------------------------------------------------------------
def powercap(root, zones):
    """A fake powercap folder: zones name -> (energy_uj, max_energy_range_uj)."""
    for name, (energy, top) in zones.items():
        (root / name).mkdir()
        (root / name / "energy_uj").write_text(f"{energy}\n")
        (root / name / "max_energy_range_uj").write_text(f"{top}\n")


def test_rapl_sums_packages_unwraps_and_leaves_sub_zones_out(tmp_path):
    """Package 0 goes 900 -> 100 uJ with a 1000 uJ range (wrapped once: 200 uJ), package 1 goes 50 -> 350 (300 uJ);
    the sub-zone intel-rapl:0:0 (part of package 0) is not added again -> 500 uJ = 0.0005 J, and the tracker records
    it with its source. A wrap read as a negative difference, or a sub-zone counted twice, fails."""
    powercap(tmp_path, {"intel-rapl:0": (900, 1000), "intel-rapl:0:0": (10, 1000), "intel-rapl:1": (50, 10**6)})
    rapl = Rapl(tmp_path)
    assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"] and rapl.error is None
    with Tracker("cpu", rapl=rapl).track() as m:
        (tmp_path / "intel-rapl:0" / "energy_uj").write_text("100\n")
        (tmp_path / "intel-rapl:1" / "energy_uj").write_text("350\n")
        (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("999\n")
    assert m.energy_j == pytest.approx(0.0005) and m.energy_source == "rapl" and m.mean_power_w > 0


def test_unreadable_rapl_is_na_with_the_reason(tmp_path):
    """No powercap zone, or an energy_uj that cannot be read (root-only on kernels since 5.10; a folder here): the
    turn's energy is None and energy_source says why, never an energy of 0."""
    with Tracker("cpu", rapl=Rapl(tmp_path)).track() as m:
        pass
    assert m.energy_j is None and m.energy_source == f"n/a: FileNotFoundError: no RAPL package zone under {tmp_path}"
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir(parents=True)
    (tmp_path / "intel-rapl:0" / "max_energy_range_uj").write_text("1000\n")
    blocked = Rapl(tmp_path)
    assert blocked.read() is None and blocked.error.startswith("IsADirectoryError")
