"""The drift sentinel's gate (issue #49): tolerances fitted on a baseline's repeats, and acceptance collapse.

Literal synthetic runs (no model), built from tests/test_compare.py's records: vanilla and eagle2 on suite "s1",
questions "1".."8", 12 tokens each. eagle2 drafts chains of depth 3; per question it takes either

* FIVE:  accept lengths [1, 4, 3, 3, 1], accepted drafts [3, 2, 2, 0]    (τ 12/5, 7 of 12 drafts accepted), or
* SIX:   accept lengths [1, 3, 3, 3, 1, 1], accepted drafts [2, 2, 2, 0, 0]  (τ 12/6, 6 of 15 accepted),

so a repeat in which k of the 8 questions take SIX has τ = 96 / (40 + k).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.cli.report import report_ending
from harness.engine.method import build_options
from harness.gate import compare
from harness.gate.baseline import Side, load_side, repeat_table, save_baseline
from harness.gate.compare import Thresholds, compare_sides
from harness.gate.formats import format_text
from harness.measure import acceptance as ACC
from harness.measure import noise as NOISE
from harness.registry import get_method
from harness.report.markdown import collapse_warnings
from harness.run.config import config_from_dict, load_preset_dict
from tests.test_compare import MANIFEST, QUESTIONS, rec

FIVE = ([1, 4, 3, 3, 1], [3, 2, 2, 0])
SIX = ([1, 3, 3, 3, 1, 1], [2, 2, 2, 0, 0])
REPO = Path(__file__).resolve().parent.parent
NOTHING = ([1] * 12, [0] * 11)  # 12 drafting steps, every draft rejected
ENGINE = {"config": {**MANIFEST["config"], "methods": [{"name": "eagle2", "engine": "vllm"}]}}


def write_repeats(root, name, sixes, eagle_wall=None, manifest=None, eagle_steps=None):
    """A run directory of len(sixes) repeats: in repeat r the first sixes[r] questions of eagle2 take SIX, the rest
    FIVE (or ``eagle_steps`` for all); vanilla 1.2 s per question, eagle2 ``eagle_wall[r]`` s (0.6 by default)."""
    run = root / name
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({**MANIFEST, "run_id": name, **(manifest or {})}))
    lines = []
    for r, k in enumerate(sixes):
        for i, q in enumerate(QUESTIONS):
            lengths, accepted = eagle_steps or (SIX if i < k else FIVE)
            eagle = rec("eagle2", q, eagle_wall[r] if eagle_wall else 0.6, list(lengths))
            eagle.update(accepted_drafts=list(accepted), draft_depths=[3] * len(accepted), steps=len(lengths))
            vanilla = rec("vanilla", q, 1.2, [1] * 12)
            vanilla["steps"] = 12
            for one in (vanilla, eagle):
                one["repeat"] = r
                lines.append(json.dumps(one))
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    return run


def by_rule(cmp):
    return sorted((f.cell, f.rule) for f in cmp.failures)


def eagle_row(cmp):
    return next(r for r in cmp.rows if r["label"] == "eagle2")


# ---- the statistics -------------------------------------------------------------------------------------------------
def test_student_t_quantiles_and_the_prediction_band_hand_computed():
    """The band's multiplier must be Student's t (tables: t_{0.995,4} = 4.6041, t_{0.995,5} = 4.0321, t_{0.975,9} =
    2.2622, t_{0.995,1} = 63.6567); a normal quantile (2.576) would make a 5-repeat band 44% too narrow and cry wolf."""
    for p, df, t in ((0.995, 4, 4.6041), (0.995, 5, 4.0321), (0.975, 9, 2.2622), (0.995, 1, 63.6567),
                     (0.005, 4, -4.6041)):
        assert NOISE.student_t_quantile(p, df) == pytest.approx(t, abs=2e-4)
    assert NOISE.student_t_cdf(0.0, 7) == 0.5
    # the docstring's example: s = 0.0158, 4.604 × 0.0158 × √1.2 = 0.0797
    mean, hw, n = NOISE.prediction_band([2.00, 2.02, 1.98, 2.01, 1.99])
    assert (mean, n) == (pytest.approx(2.0), 5) and hw == pytest.approx(0.07975, abs=1e-4)
    # the mean of m = 5 new repeats is predicted more tightly: √(1/5 + 1/5) instead of √(1/5 + 1)
    assert NOISE.prediction_band([2.00, 2.02, 1.98, 2.01, 1.99], m=5)[1] == pytest.approx(hw * math.sqrt(0.4 / 1.2))
    assert math.isnan(NOISE.prediction_band([2.0, None])[1])
    with pytest.raises(ValueError, match="p must be in"):
        NOISE.student_t_quantile(1.0, 3)


def test_repeat_table_has_each_repeats_own_figures(tmp_path):
    """Each repeat's τ, rate and acc@i must come from that repeat's turns alone: pooling them would leave no spread to
    fit. Repeat 0 (k = 0): τ 96/40 = 2.4, rate 56/96, acc [24/32, 24/32, 8/32]; repeat 1 (k = 1): τ 96/41, rate
    55/99, acc [24/33, 24/33, 7/33]; speed-up 2 (eagle2's 0.6 s against vanilla's 1.2 s)."""
    side = load_side(write_repeats(tmp_path, "run", [0, 1]))
    eagle = side.spread(("eagle2", "s1", 0.0))
    assert eagle["repeat"].tolist() == [0, 1]
    assert eagle["tau"].tolist() == pytest.approx([2.4, 96 / 41])
    assert eagle["draft_acceptance_rate"].tolist() == pytest.approx([56 / 96, 55 / 99])
    assert eagle["acc_at"].tolist()[1] == pytest.approx([24 / 33, 24 / 33, 7 / 33])
    assert eagle["speedup"].tolist() == pytest.approx([2.0, 2.0])
    assert side.spread(("vanilla", "s1", 0.0))["acc_at"].tolist() == [[], []]
    assert side.n_repeats == 2
    assert repeat_table(pd.DataFrame(), "vanilla").empty


# ---- fitted tolerances ----------------------------------------------------------------------------------------------
# BASE: 6 repeats with k = 0, 1, 0, 1, 0, 1 -> τ 2.4 and 2.34146 alternating: mean 2.370732, s = 0.032062,
# band ± 4.032143 × 0.032062 × √(1/6 + 1) = ± 0.13964 -> [2.23110, 2.51037]
BASE_SIXES = [0, 1, 0, 1, 0, 1]


def test_an_engine_cell_is_gated_by_the_spread_its_baseline_measured(tmp_path):
    """An engine's cell against a calibrated baseline (6 repeats): τ 96/43 = 2.2326 (k = 3, −5.8%) is inside the
    fitted band and passes, where the fixed 5% would have failed it; τ 96/44 = 2.1818 (k = 4) is outside and fails.
    A gate that ignored the repeats, or printed no source for its tolerance, would fail the first case or hide why;
    6 repeats against 1 must not be reported as a configuration difference (the bands account for both counts)."""
    saved = save_baseline(write_repeats(tmp_path, "base", BASE_SIXES, manifest=ENGINE), out=tmp_path / "saved")
    doc = json.loads((saved / "baseline.json").read_text())
    assert len(doc["repeats"]) == 2 * 6
    base = Side.from_baseline(saved)
    within = load_side(write_repeats(tmp_path, "within", [3], manifest=ENGINE))
    cmp = compare_sides(base, within, Thresholds(gate_speed=False))
    assert by_rule(cmp) == [] and eagle_row(cmp)["tolerance"] == "fitted: 6 repeats"
    assert compare._config_differences({"repeats": 6, "limit": 4}, {"repeats": 1, "limit": 8}) == ["limit"]
    band = eagle_row(cmp)["bands"]["τ"]
    assert (band["base"], band["halfwidth"], band["n"], band["m"]) == (
        pytest.approx(2.370732, abs=1e-6), pytest.approx(0.13964, abs=1e-5), 6, 1)
    assert band["new"] == pytest.approx(96 / 43)
    note = next(f.message for f in cmp.findings if f.rule == "tolerance")
    assert note.startswith("fitted: 6 repeats (99% prediction band of one rerun): τ 2.371 ± 0.140 (n 6)")

    outside = compare_sides(base, load_side(write_repeats(tmp_path, "outside", [4], manifest=ENGINE)),
                            Thresholds(gate_speed=False))
    assert ("eagle2 / s1 / T=0", "acceptance") in by_rule(outside)
    assert "τ 2.371 -> 2.182 outside its fitted tolerance ±0.140 (6 repeats)" in [f.message for f in outside.failures]

    # the same NEW against the baseline without its repeats: the fixed 5% (vLLM's) fails it on τ and on the
    # positions (acc@1 24/35 = 0.686 under 144/195 × 0.95 = 0.702), and the cell says where its tolerance came from
    doc.pop("repeats")
    (saved / "baseline.json").write_text(json.dumps(doc))
    fixed = compare_sides(Side.from_baseline(saved), within, Thresholds(gate_speed=False))
    assert {rule for _, rule in by_rule(fixed)} == {"acceptance", "position"}
    assert eagle_row(fixed)["tolerance"] == "default ±5% acceptance: baseline without repeats"
    # --no-fit ignores the repeats; another device or dtype is a shift the repeats did not measure
    assert eagle_row(compare_sides(base, within, Thresholds(gate_speed=False, fit=False)))["tolerance"] == (
        "default ±5% acceptance: --no-fit")
    assert compare.fit_source(base, within, ("eagle2", "s1", 0.0), Thresholds()) == (6, None)


def test_a_band_fails_outside_and_where_new_has_no_value():
    """The band's own rule, hand-computed: a floor fails only below base − half-width, a two-sided band (τ) on a
    rise too, and a figure NEW never measured (a draft position it did not reach) fails rather than passes."""
    tau = compare.Band("τ", 2.0, 2.11, 0.1, 6, 1, floor=False)
    assert tau.fails and not compare.Band("τ", 2.0, 2.09, 0.1, 6, 1, floor=False).fails
    assert not compare.Band("acc@1", 0.5, 0.9, 0.1, 6, 1).fails  # a floor: a rise passes
    assert compare.Band("acc@1", 0.5, 0.39, 0.1, 6, 1).fails and not compare.Band("acc@1", 0.5, 0.4, 0.1, 6, 1).fails
    assert compare.Band("acc@3", 0.2, math.nan, 0.05, 6, 1).fails
    assert compare.Band("τ", 2.0, 2.0, 0.0, 6, 1, floor=False).fails is False  # a zero band: equal passes
    assert tau.describe() == "τ 2.000 ± 0.100 (n 6), NEW 2.110 (m 1)"


def test_a_deterministic_spread_fits_a_zero_band(tmp_path):
    """At T = 1 on the harness (a sampled cell: no exact τ rule) six identical repeats (s = 0) fit a zero-width band:
    τ 2.4 -> 96/41 = 2.34 (−2.4%) fails, though the fixed 5% would have passed it; a rerun equal to BASE passes. The
    vanilla cell's τ (1.0 in every repeat) is gated the same way and passes."""
    t1 = {"temperature": 1.0}

    def sampled(name, sixes):
        run = write_repeats(tmp_path, name, sixes)
        text = (run / "records.jsonl").read_text().splitlines()
        (run / "records.jsonl").write_text("\n".join(json.dumps({**json.loads(x), **t1}) for x in text) + "\n")
        return load_side(run)

    base = sampled("base", [0] * 6)
    assert by_rule(compare_sides(base, sampled("same", [0]), Thresholds(gate_speed=False))) == []
    cmp = compare_sides(base, sampled("lower", [1]), Thresholds(gate_speed=False))
    assert ("eagle2 / s1 / T=1", "acceptance") in by_rule(cmp)
    assert all(cell == "eagle2 / s1 / T=1" for cell, _ in by_rule(cmp))
    assert eagle_row(cmp)["bands"]["τ"]["halfwidth"] == 0.0


def test_the_speed_rule_uses_the_fitted_spread_of_the_speed_up(tmp_path):
    """At T = 0 on the same device outputs and τ stay exact, and the speed-up is gated by its own fitted band:
    BASE's eagle2 walls 0.60, 0.612, 0.588, 0.606, 0.594, 0.60 s give speed-ups 2/f (mean 2.0003, s 0.0283, band
    −0.1232); NEW at 0.62 s (1.935×) passes and at 0.69 s (1.739×, a 13% slowdown) fails on speed, naming its
    source; with --no-speed nothing about speed fails."""
    walls = [0.600, 0.612, 0.588, 0.606, 0.594, 0.600]
    base = load_side(write_repeats(tmp_path, "base", [0] * 6, eagle_wall=walls))
    ok = compare_sides(base, load_side(write_repeats(tmp_path, "ok", [0], eagle_wall=[0.62])))
    assert by_rule(ok) == []
    # vanilla's speed-up is 1 by definition and its τ and outputs are exact: it is gated as before, and says so
    vanilla = next(r for r in ok.rows if r["label"] == "vanilla")
    assert vanilla["tolerance"] == "exact outputs, τ −1%: nothing here to fit"
    band = eagle_row(ok)["bands"]["speed-up"]
    assert band["halfwidth"] == pytest.approx(0.1232, abs=1e-4) and set(eagle_row(ok)["bands"]) == {"speed-up"}
    slow = load_side(write_repeats(tmp_path, "slow", [0], eagle_wall=[0.69]))
    cmp = compare_sides(base, slow)
    assert by_rule(cmp) == [("eagle2 / s1 / T=0", "speed")]
    assert "outside its fitted tolerance −0.123 (6 repeats)" in cmp.failures[0].message
    assert by_rule(compare_sides(base, slow, Thresholds(gate_speed=False))) == []
    assert "fitted: 6 repeats" in format_text(cmp)


def test_baseline_save_says_whether_compare_will_fit(tmp_path, capsys):
    """Whoever saves a baseline must learn whether it is calibrated: 6 repeats fit, 1 keeps the defaults."""
    assert main(["baseline", "save", str(write_repeats(tmp_path, "six", [0] * 6)), "--out", str(tmp_path / "a")]) == 0
    assert "repeats: 6 per cell: compare fits each tolerance on their spread" in capsys.readouterr().out
    assert main(["baseline", "save", str(write_repeats(tmp_path, "one", [0])), "--out", str(tmp_path / "b")]) == 0
    assert "repeats: 1 per cell: compare keeps the fixed default tolerances" in capsys.readouterr().out
    assert "repeats" not in json.loads((tmp_path / "b" / "baseline.json").read_text())


# ---- acceptance collapse --------------------------------------------------------------------------------------------
def test_a_collapsed_acceptance_rate_fails_compare_naming_the_causes(tmp_path):
    """A draft acceptance rate that falls from 7/12 to 0 (under a quarter of BASE's) must fail as a collapse, with
    the label and the likely causes named, whatever tolerance applies."""
    base = load_side(write_repeats(tmp_path, "base", [0]))
    dead = load_side(write_repeats(tmp_path, "dead", [0], eagle_steps=NOTHING))
    cmp = compare_sides(base, dead, Thresholds(gate_speed=False))
    (collapse,) = [f for f in cmp.failures if f.rule == "collapse"]
    assert collapse.cell == "eagle2 / s1 / T=0"
    assert collapse.message.startswith("acceptance collapse: eagle2's draft acceptance rate fell 0.583 -> 0.000")
    assert "precision" in collapse.message and "chat template" in collapse.message
    assert not ACC.rate_collapsed(0.15, 0.583) and ACC.rate_collapsed(0.14, 0.583)


def test_a_run_summary_warns_of_a_collapse_in_text_markdown_and_html(tmp_path):
    """A label that drafts and accepts (almost) nothing must be named at the end of the run, in summary.md and in
    report.html; a label that never drafts (vanilla) or drafts well must not be: literal summary rows first, then a
    run directory written by the report."""
    summary = pd.DataFrame([
        {"label": "vanilla", "suite": "s1", "temperature": 0.0, "acc@1": math.nan, "drafted_per_step": math.nan},
        {"label": "eagle2", "suite": "s1", "temperature": 0.0, "acc@1": 0.04, "drafted_per_step": 3.0},
        {"label": "medusa", "suite": "s1", "temperature": 0.0, "acc@1": 0.05, "drafted_per_step": 3.0},
    ])
    (line,) = collapse_warnings(summary)
    assert line.startswith("warning: acceptance collapse: eagle2 (s1, T=0) accepted its first draft token in 4.0% "
                           "of drafting steps (floor 5%)")
    assert "head/target mismatch" in line

    from harness.report.report import write_report

    run = write_repeats(tmp_path, "dead", [0], eagle_steps=NOTHING)
    paths = write_report(run)
    summary_md = paths["summary_md"].read_text()
    assert "**Warning: acceptance collapse**" in summary_md and "eagle2 (s1, T=0) accepted its first" in summary_md
    assert "Warning: acceptance collapse" in paths["report_html"].read_text()
    ending = report_ending(pd.read_parquet(paths["summary_parquet"]), run, paths["report_html"])
    assert "warning: acceptance collapse: eagle2 (s1, T=0)" in ending
    healthy = write_report(write_repeats(tmp_path, "healthy", [0]))
    assert "acceptance collapse" not in healthy["summary_md"].read_text()
    assert "acceptance collapse" not in healthy["report_html"].read_text()


# ---- the nightly sentinel: its preset and its bisection -------------------------------------------------------------
def test_the_sentinel_preset_is_valid():
    """The sentinel runs only at night: a typo in its preset (an unknown method or option) must fail here. It must
    sample (T = 1), or no cell of it would be gated by the fitted bands."""
    cfg = config_from_dict(load_preset_dict("sentinel"))
    assert cfg.device == "cpu" and cfg.temperatures == [0.0, 1.0] and cfg.repeats == 1
    for spec in cfg.methods:
        build_options(get_method(spec.name).Options, spec.options, f"sentinel: {spec.label}")


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def planted_repo(tmp_path, n=8, bad=5, broken=()):
    """A git repository of ``n`` commits; from commit ``bad`` on, the file ``value`` says 2 instead of 1 (the planted
    regression); the commits in ``broken`` also carry a file ``broken`` (their check cannot run)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for key, value in (("user.email", "t@example.com"), ("user.name", "t"), ("commit.gpgsign", "false")):
        git(repo, "config", key, value)
    shas = []
    for i in range(1, n + 1):
        (repo / "value").write_text("2\n" if i >= bad else "1\n")
        (repo / "n").write_text(f"{i}\n")
        (repo / "broken").unlink(missing_ok=True)
        if i in broken:
            (repo / "broken").write_text("x\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


# exit 0 when value is 1, 1 when it is not, 2 (cannot test) where the file `broken` exists
CHECK = ["sh", "-c", 'test -e broken && exit 2; test "$(cat value)" = 1']


def run_bisect(repo, *args):
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    return subprocess.run([str(REPO / ".ci" / "bisect"), *args], cwd=repo, capture_output=True, text=True,
                          timeout=120, env=env)


def test_bisect_names_the_planted_regression_and_leaves_the_checkout_alone(tmp_path):
    """The sentinel's bisect step must name the commit that introduced the regression (commit 5 of 8), skip a
    commit whose check cannot run (commit 3, exit 2) instead of calling it bad, and leave the calling checkout on
    its branch with no bisect in progress and no extra worktree."""
    repo, shas = planted_repo(tmp_path, broken=(3,))
    done = run_bisect(repo, shas[0], shas[-1], "--", *CHECK)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"first bad commit: {shas[4]} commit 5"
    assert git(repo, "rev-parse", "HEAD") == shas[-1] and git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode != 0


def test_bisect_says_why_it_cannot_name_a_commit(tmp_path):
    """A regression next to an untestable commit cannot be pinned to one commit: the script must say so and exit 1
    rather than name the wrong one; a GOOD that is not an ancestor of BAD and a bad usage are one clear line."""
    repo, shas = planted_repo(tmp_path, n=6, bad=4, broken=(4,))
    done = run_bisect(repo, shas[0], shas[-1], "--", *CHECK)
    assert done.returncode == 1 and done.stdout == ""
    assert "no single first bad commit" in done.stderr
    reverse = run_bisect(repo, shas[-1], shas[0], "--", *CHECK)
    assert reverse.returncode == 1 and "is not an ancestor of BAD" in reverse.stderr
    assert run_bisect(repo, shas[0]).returncode == 2
    assert "is not a commit" in run_bisect(repo, "nope", shas[-1], "--", "true").stderr
