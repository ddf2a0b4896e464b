"""`draftbench compare` and `draftbench baseline` on literal synthetic runs (no model).

Every run has two labels on suite "s1" at temperature 0 and eight one-turn questions "1".."8":

* vanilla: 12 tokens per question, ids [10q, 10q + 1, ..., 10q + 11], accept lengths twelve 1s (τ = 1),
  wall 1.2 s × noise -> 10 tok/s × 1/noise;
* eagle2:  the same ids (lossless), accept lengths [1, 3, 3, 3, 2] (12 tokens / 5 steps, τ = 2.4),
  wall 0.6 s × noise × slowdown -> speed-up 2 × (vanilla noise / eagle2 noise) / slowdown.

BASE uses the noise factors NOISE_A (vanilla) and NOISE_B (eagle2). An "unchanged rerun" is a machine that is
20% slower on everything (×1.2) with other per-question noise (NOISE_C, NOISE_D; every factor within ±2%, so r_q below
spreads by about ±5%). The per-question
speed-up ratio NEW/BASE of eagle2 is then r_q = (C_q / D_q) / (A_q / B_q), and the gate's statistic is the
geometric mean of r_q with a bootstrap CI (metrics.paired_change): checked here against numpy on the same r_q.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from harness.cli import main
from harness.gate import compare
from harness.gate.baseline import (
    Side,
    device_slug,
    ids_sha256,
    load_side,
    preset_of,
    save_baseline,
    slugify,
)
from harness.gate.compare import Thresholds, compare_sides, text_context
from harness.gate.formats import format_markdown
from harness.measure import acceptance as ACC
from harness.measure import metrics as M
from harness.measure.metrics import first_difference

QUESTIONS = ["1", "2", "3", "4", "5", "6", "7", "8"]
NOISE_A = [1.000, 1.015, 0.985, 1.010, 0.990, 1.020, 0.980, 1.005]
NOISE_B = [0.990, 1.005, 1.020, 0.985, 1.015, 0.995, 1.010, 0.980]
NOISE_C = [1.010, 0.985, 1.005, 1.020, 0.995, 0.980, 1.015, 0.990]
NOISE_D = [1.005, 1.020, 0.990, 0.995, 0.980, 1.010, 0.985, 1.015]
EAGLE_LENGTHS = [1, 3, 3, 3, 2]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]

MANIFEST = {
    "run_id": "base", "created": "2026-01-01T00:00:00+00:00", "command": "draftbench run --preset ci_gate",
    "git_hash": "0123456789abcdef", "git_dirty": False,
    "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.24.0"},
    "device": {"device": "cpu", "device_type": "cpu", "device_name": "Test CPU"},
    "config": {"baseline": "vanilla", "max_new_tokens": 12, "output_dir": "results"},
    "config_digest": "e715da1e",
    "target": {"name": "tiny", "path": "/home/someone/cache/tiny", "dtype": "float32",
               "source": {"gguf": "/home/someone/pkgs/tiny.gguf", "package": "tiny_pkg"}},
    "suites": {"s1": {"version": "1", "source": "/home/someone/data/s1.jsonl", "sha256": "ab12", "questions": 6}},
}


def ids(q: str) -> list[int]:
    return [10 * int(q) + i for i in range(12)]


def rec(label, q, wall, lengths, out=None, text=None, score=None, status="ok", temperature=0.0):
    out = ids(q) if out is None else out
    return {"run_id": "r", "status": status, "error": None if status == "ok" else "RuntimeError: boom",
            "method": label, "label": label, "lossless": True, "method_options": {}, "suite": "s1",
            "suite_version": "1", "question_id": q, "category": "c", "turn": 0, "target": "tiny",
            "dtype": "float32", "device": "cpu", "temperature": temperature, "top_p": 1.0, "seed": 0, "repeat": 0,
            "prompt_tokens": 5, "new_tokens": len(out), "steps": len(lengths), "accept_lengths": lengths,
            "accepted_drafts": [], "draft_depths": [], "wall_time_s": wall, "prefill_time_s": 0.01,
            "stop_reason": "max_new_tokens", "output_ids": out,
            "output_text": text if text is not None else " ".join(WORDS[t % 12] for t in out),
            "rss_bytes": 100, "peak_rss_bytes": 2**20, "cuda_peak_allocated_bytes": None,
            "cuda_peak_reserved_bytes": None, "nvml_used_bytes": None, "energy_j": None, "mean_power_w": None,
            "timings": {}, "counters": {}, "score": score, "score_name": "exact" if score is not None else None}


def write_run(root, name, noise_v=NOISE_A, noise_e=NOISE_B, drift=1.0, slowdown=1.0, edit=None, manifest=None):
    """A run directory; ``edit(label, q, record)`` may change a record (or return None to drop it)."""
    run = root / name
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({**MANIFEST, "run_id": name, **(manifest or {})}))
    lines = []
    for i, q in enumerate(QUESTIONS):
        for r in (rec("vanilla", q, 1.2 * noise_v[i] * drift, [1] * 12),
                  rec("eagle2", q, 0.6 * noise_e[i] * drift * slowdown, list(EAGLE_LENGTHS))):
            r = edit(r["label"], q, r) if edit else r
            if r is not None:
                r["steps"] = len(r["accept_lengths"])  # one target forward per entry, as the runner writes it
                lines.append(json.dumps(r))
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    return run


@pytest.fixture
def base(tmp_path):
    return write_run(tmp_path, "base")


def run_compare(base, new, **kw):
    return compare_sides(load_side(base), load_side(new), Thresholds(**kw))


def failing(cmp):
    return sorted((f.cell, f.rule) for f in cmp.failures)


# ---- the gate ------------------------------------------------------------------------------------------------------
def test_an_unchanged_rerun_on_a_slower_noisy_machine_passes(tmp_path, base):
    """A gate that read machine drift (×1.2 on everything) or ±2% noise on every per-question time as a regression
    would cry wolf: the speed-up is a ratio within each run, so the drift cancels, and the CI of the paired change
    straddles 1."""
    new = write_run(tmp_path, "new", NOISE_C, NOISE_D, drift=1.2)
    cmp = run_compare(base, new)
    assert failing(cmp) == [] and cmp.exit_code == 0
    eagle = next(r for r in cmp.rows if r["label"] == "eagle2")
    r_q = (np.array(NOISE_C) / np.array(NOISE_D)) / (np.array(NOISE_A) / np.array(NOISE_B))
    assert eagle["speedup_change"] == pytest.approx(float(np.exp(np.log(r_q).mean())))
    assert eagle["speedup_change_lo"] < 1 < eagle["speedup_change_hi"]
    assert eagle["tokens_per_s_change"] == pytest.approx(1 / 1.2, rel=0.03)  # absolute tok/s drifted: not gated
    assert (eagle["tau_base"], eagle["tau_new"], eagle["turns_changed"]) == (2.4, 2.4, 0)


def test_a_ten_percent_slowdown_fails_naming_the_cell(tmp_path, base):
    """The 10% regressions a fixed-threshold tool misses on a noisy machine: eagle2 10% slower, same noise level as
    the unchanged rerun; the CI's upper end falls below 1 − 0.05 and only eagle2's cell fails, on speed."""
    new = write_run(tmp_path, "new", NOISE_C, NOISE_D, drift=1.2, slowdown=1.1)
    cmp = run_compare(base, new)
    assert failing(cmp) == [("eagle2 / s1 / T=0", "speed")] and cmp.exit_code == 1
    eagle = next(r for r in cmp.rows if r["label"] == "eagle2")
    r_q = (np.array(NOISE_C) / np.array(NOISE_D)) / (np.array(NOISE_A) / np.array(NOISE_B)) / 1.1
    assert eagle["speedup_change"] == pytest.approx(float(np.exp(np.log(r_q).mean())))
    assert eagle["speedup_change_hi"] < 0.95
    assert run_compare(base, new, gate_speed=False).exit_code == 0  # --no-speed: outputs and τ only


def test_compare_refuses_to_gate_speed_on_an_invalid_run_unless_told(tmp_path, base, capsys):
    """NEW ran without warm-up on a machine loaded past its CPUs (load average 3.5 on 2): its speed-ups are not a
    steady-state measurement. Gating them would read that machine as a regression or a win; compare must refuse
    (a failed `validity` finding per failed check, speed left out), pass with --no-speed (nothing to refuse), and
    gate speed with --allow-invalid (the 10% slowdown then fails on speed, the checks become warnings)."""
    invalid = {"config": {**MANIFEST["config"], "warmup": 0},
               "device": {**MANIFEST["device"], "cpu_count": 2}}
    new = write_run(tmp_path, "new", NOISE_C, NOISE_D, slowdown=1.1, manifest=invalid,
                    edit=lambda label, q, r: {**r, "load_avg_1m": 3.5})
    cmp = run_compare(base, new)
    assert failing(cmp) == [("run", "validity"), ("run", "validity")], failing(cmp)
    assert "NEW (new) failed the validity check machine load: 1-min load average 3.50 to 3.50 on 2" in " ".join(
        f.message for f in cmp.failures)
    assert not any(f.rule == "speed" for f in cmp.findings), "speed must not be gated on an invalid run"
    assert run_compare(base, new, gate_speed=False).exit_code == 0
    allowed = run_compare(base, new, allow_invalid=True)
    assert failing(allowed) == [("eagle2 / s1 / T=0", "speed")]
    assert any("failed the validity check warmup" in w and "--allow-invalid" in w for w in allowed.warnings)
    assert main(["compare", str(base), str(new)]) == 1
    assert "validity: NEW (new) failed the validity check warmup" in capsys.readouterr().out
    assert main(["compare", str(base), str(new), "--allow-invalid", "--labels", "vanilla"]) == 0
    # a baseline saved from the invalid run keeps its failed checks: the refusal survives the save
    saved = save_baseline(new, root=tmp_path / "baselines")
    assert [c["name"] for c in json.loads((saved / "baseline.json").read_text())["provenance"]["validity"]] == [
        "warmup", "machine load"]
    assert failing(run_compare(saved, base)) == [("run", "validity"), ("run", "validity")]


def test_a_changed_token_fails_and_shows_where(tmp_path, base):
    """Question 3's greedy output changes at token 5 for both labels (so the method stays lossless): both cells
    fail on outputs, the message gives the first differing token and the text around it, and a warning says the
    baseline label changed too (the target's numerics, not a method)."""
    def edit(label, q, r):
        if q == "3":
            r["output_ids"] = ids("3")[:5] + [999] + ids("3")[6:]
            r["output_text"] = " ".join(WORDS[t % 12] for t in r["output_ids"])
        return r

    cmp = run_compare(base, write_run(tmp_path, "new", edit=edit))
    assert failing(cmp) == [("eagle2 / s1 / T=0", "outputs"), ("vanilla / s1 / T=0", "outputs")]
    msg = next(f.message for f in cmp.failures if f.cell.startswith("eagle2"))
    # question 3: ids 30..41 -> words from 30 % 12 = 6 ("eta"); token 5 is id 35 -> "mu", new id 999 -> 999 % 12 = 3
    # ("delta"); "eta theta iota kappa lambda " is 28 characters
    assert msg.startswith("greedy output changed in 1 of 8 turns; first at question 3 turn 0, token 5 (character 28)")
    assert "'eta theta iota kappa lambda ⟨⟩mu alpha" in msg and "'eta theta iota kappa lambda ⟨⟩delta alpha" in msg
    assert any("baseline label (vanilla) produced other outputs" in w for w in cmp.warnings)


def test_a_tau_drop_fails(tmp_path, base):
    """eagle2 now accepts less: [1, 2, 2, 2, 2, 2, 1] = 12 tokens in 7 steps, τ 2.4 -> 1.714 (−28.6%); same
    outputs and times, so only τ fails."""
    def edit(label, q, r):
        if label == "eagle2":
            r["accept_lengths"] = [1, 2, 2, 2, 2, 2, 1]
        return r

    cmp = run_compare(base, write_run(tmp_path, "new", edit=edit))
    assert failing(cmp) == [("eagle2 / s1 / T=0", "tau")]
    assert cmp.failures[0].message == "τ dropped 2.400 -> 1.714 (-28.6%; allowed -1.0%)"


def test_a_tau_change_within_the_tolerance_passes_and_a_rise_is_only_noted(tmp_path, base):
    """eagle2's question 1 takes one step more ([1, 3, 3, 3, 1, 1]: 12 tokens in 6 steps): τ over the 8 questions
    96/40 = 2.4 -> 96/41 = 2.341 (−2.4%), which fails at rtol 0.01 and passes at 0.03. A rise (every question
    [1, 4, 4, 3]: 12 tokens in 4 steps, τ 3.0) is noted as improved and does not fail."""
    def worse(label, q, r):
        if label == "eagle2" and q == "1":
            r["accept_lengths"] = [1, 3, 3, 3, 1, 1]
        return r

    new = write_run(tmp_path, "new", edit=worse)
    assert failing(run_compare(base, new)) == [("eagle2 / s1 / T=0", "tau")]
    assert run_compare(base, new, tau_rtol=0.03).exit_code == 0

    def better(label, q, r):
        if label == "eagle2":
            r["accept_lengths"] = [1, 4, 4, 3]
        return r

    cmp = run_compare(base, write_run(tmp_path, "better", edit=better))
    assert cmp.exit_code == 0
    assert [(f.rule, f.fails) for f in cmp.findings] == [("tau", False)]
    assert next(r for r in cmp.rows if r["label"] == "eagle2")["status"] == "improved"


def test_a_lossless_share_below_one_fails(tmp_path, base):
    """NEW's eagle2 differs from NEW's own vanilla on question 2 (one of 8 turns): lossless share 0.875 for a method
    declared lossless; the output change against BASE is flagged as well."""
    def edit(label, q, r):
        if label == "eagle2" and q == "2":
            r["output_ids"] = ids("2")[:11] + [7]
        return r

    cmp = run_compare(base, write_run(tmp_path, "new", edit=edit))
    assert failing(cmp) == [("eagle2 / s1 / T=0", "lossless"), ("eagle2 / s1 / T=0", "outputs")]
    lossless = next(f for f in cmp.failures if f.rule == "lossless")
    assert lossless.message.startswith("lossless share 0.875 < 1 for a lossless method")


def test_a_quality_drop_fails(tmp_path):
    """Both runs score every question (1.0); NEW's eagle2 gets 0 on question 4: 1.000 -> 0.875 fails at tolerance 0
    and passes at 0.2."""
    base = write_run(tmp_path, "base", edit=lambda label, q, r: {**r, "score": 1.0, "score_name": "exact"})
    new = write_run(tmp_path, "new", edit=lambda label, q, r: {
        **r, "score": 0.0 if (label, q) == ("eagle2", "4") else 1.0, "score_name": "exact"})
    cmp = run_compare(base, new)
    assert failing(cmp) == [("eagle2 / s1 / T=0", "quality")]
    assert cmp.failures[0].message == "quality dropped 1.000 -> 0.875 over 8 scored question(s)"
    assert run_compare(base, new, quality_tol=0.2).exit_code == 0


def test_missing_questions_error_turns_and_missing_cells_fail(tmp_path, base):
    """A gate that compared fewer questions than the baseline without saying so would pass anything: NEW lacks
    eagle2's question 8, has an error on its question 7, and lacks the vanilla cell at T = 0 (it ran at T = 1)."""
    def edit(label, q, r):
        if label == "eagle2" and q == "8":
            return None
        if label == "eagle2" and q == "7":
            return {**r, "status": "error"}
        return {**r, "temperature": 1.0} if label == "vanilla" else r

    cmp = run_compare(base, write_run(tmp_path, "new", edit=edit))
    assert failing(cmp) == [("eagle2 / s1 / T=0", "errors"), ("eagle2 / s1 / T=0", "missing"),
                            ("vanilla / s1 / T=0", "missing")]
    msgs = {f.rule: f.message for f in cmp.failures if f.cell.startswith("eagle2")}
    assert msgs == {"errors": "NEW has error turns in question(s) ['7']",
                    "missing": "NEW lacks measured question(s) ['8'] of BASE"}
    assert [(f.cell, f.fails) for f in cmp.findings if f.rule == "new"] == [("vanilla / s1 / T=1", False)]


def test_configuration_and_device_differences_are_named(tmp_path, base):
    """Exact gating only holds on the same device, dtype and configuration; the warnings must say which differ."""
    new = write_run(tmp_path, "new", manifest={
        "device": {"device": "cuda:0", "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
        "config": {"baseline": "vanilla", "max_new_tokens": 64, "output_dir": "elsewhere"}})
    warnings = run_compare(base, new).warnings
    assert warnings == ["devices differ (BASE cpu, NEW nvidia-h100-80gb-hbm3): outputs and τ are reproducible only "
                        "on the same device and dtype", "run configurations differ in max_new_tokens"]


def test_another_target_or_dtype_is_an_error_unless_allowed(tmp_path, base):
    """Another target or dtype changes every output and τ by itself: a compare that passed with warnings read that
    as a measurement. It is refused in one line; --allow-mismatch (allow_mismatch=True) compares with warnings."""
    target = {"name": "tiny", "path": "/elsewhere/tiny", "dtype": "bfloat16", "sha256": None}
    new = write_run(tmp_path, "new", manifest={"target": target})
    with pytest.raises(ValueError, match=r"^compare: BASE and NEW differ in dtypes \(BASE float32, NEW bfloat16\); "
                                         r"their outputs and τ are not comparable \(--allow-mismatch compares them "
                                         r"anyway\)$"):
        run_compare(base, new)
    cmp = compare_sides(load_side(base), load_side(new), Thresholds(), allow_mismatch=True)
    assert "dtypes differ (BASE float32, NEW bfloat16)" in cmp.warnings


# ---- baselines ---------------------------------------------------------------------------------------------------
def test_a_saved_baseline_gates_like_its_run_and_keeps_no_text(tmp_path, base):
    """The committed baseline must give the same verdicts as the run it came from, without the texts: an unchanged
    rerun passes against it, a changed token fails and is located by hash only (and says so)."""
    out = save_baseline(base, root=tmp_path / "baselines")
    assert out == tmp_path / "baselines" / "cpu" / "ci_gate"
    doc = json.loads((out / "baseline.json").read_text())
    assert "output_text" not in json.dumps(doc) and "/home/someone" not in json.dumps(doc)
    assert doc["provenance"]["target"]["source"] == {"gguf": "tiny.gguf", "package": "tiny_pkg"}
    assert doc["provenance"]["suites"] == {"s1": {"version": "1", "source": "s1.jsonl", "sha256": "ab12",
                                                  "questions": 6}}
    assert doc["turns"][0]["sha256"] == hashlib.sha256(",".join(map(str, ids("1"))).encode()).hexdigest()
    assert [(q["label"], q["question_id"], q["accepted_tokens"], q["steps"]) for q in doc["questions"][:2]] == [
        ("vanilla", "1", 12, 12), ("eagle2", "1", 12, 5)]

    rerun = write_run(tmp_path, "rerun", NOISE_C, NOISE_D, drift=1.2)
    from_run, from_baseline = run_compare(base, rerun), run_compare(out, rerun)
    assert from_baseline.exit_code == 0
    for a, b in zip(from_run.rows, from_baseline.rows):
        for k in ("tau_base", "speedup_change", "speedup_change_lo", "speedup_change_hi", "tokens_per_s_base"):
            assert a[k] == pytest.approx(b[k], nan_ok=True), k

    def edit(label, q, r):
        return {**r, "output_ids": ids(q)[:-1] + [5]} if q == "6" else r

    cmp = run_compare(out, write_run(tmp_path, "changed", edit=edit))
    assert failing(cmp) == [("eagle2 / s1 / T=0", "outputs"), ("vanilla / s1 / T=0", "outputs")]
    assert "first at question 6 turn 0 (12 -> 12 tokens); BASE is a baseline, which keeps output hashes only" in \
        cmp.failures[0].message


def test_baseline_save_refuses_runs_with_errors_and_overwrites(tmp_path, base):
    """A baseline with a missing question would silently shrink the gate; a silent overwrite would lose the old one."""
    bad = write_run(tmp_path, "bad", edit=lambda label, q, r: {**r, "status": "error"} if q == "2" else r)
    with pytest.raises(ValueError, match="error record"):
        save_baseline(bad, out=tmp_path / "b1")
    save_baseline(base, out=tmp_path / "b2")
    with pytest.raises(FileExistsError, match="--force"):
        save_baseline(base, out=tmp_path / "b2")
    assert save_baseline(base, out=tmp_path / "b2", force=True) == tmp_path / "b2"


def test_a_baseline_from_a_newer_format_is_refused_in_one_line(tmp_path):
    """Reading a baseline of another format version would misread its fields."""
    (tmp_path / "baseline.json").write_text(json.dumps({"format": "draftbench-baseline", "version": 99}))
    with pytest.raises(ValueError, match="baseline format version 99; this draftbench reads version 1"):
        Side.from_baseline(tmp_path)


# ---- command line ----------------------------------------------------------------------------------------------------
def test_cli_exit_codes_and_formats(tmp_path, base, capsys):
    """Exit 0 pass, 1 regression, 2 error; --format markdown and json carry the verdict and the failing cell."""
    same = write_run(tmp_path, "same", NOISE_C, NOISE_D)
    slow = write_run(tmp_path, "slow", NOISE_C, NOISE_D, slowdown=1.25)
    assert main(["compare", str(base), str(same)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    md = tmp_path / "out" / "summary.md"
    assert main(["compare", str(base), str(slow), "--format", "json", "--markdown-out", str(md)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["verdict"], doc["exit_code"]) == ("fail", 1)
    assert [(f["cell"], f["rule"]) for f in doc["findings"]] == [("eagle2 / s1 / T=0", "speed")]
    text = md.read_text()
    assert text.startswith("### draftbench compare: FAIL: 1 regression")
    assert "| eagle2 / s1 / T=0 | eagle2 | 8 |" in text
    assert main(["compare", str(base), str(tmp_path / "nope")]) == 2
    assert "nope: no such run or baseline directory" in capsys.readouterr().err
    assert main(["compare", str(base), str(same), "--tau-rtol", "2"]) == 2
    assert "--tau-rtol must be in [0, 1), got 2.0" in capsys.readouterr().err


def test_cli_html_page_shows_the_verdict_the_cells_and_the_findings(tmp_path, base, capsys):
    """`--html-out` writes one self-contained page (the CI artifact a reviewer opens): without the verdict, the failing
    cell or the findings table it would hide the regression; with a network reference it would not open offline."""
    slow = write_run(tmp_path, "slow", NOISE_C, NOISE_D, slowdown=1.25)
    page = tmp_path / "out" / "compare.html"
    assert main(["compare", str(base), str(slow), "--html-out", str(page)]) == 1
    capsys.readouterr()
    html = page.read_text()
    assert "draftbench compare: FAIL" in html and "eagle2 / s1 / T=0" in html and ">Findings<" in html
    assert "http://" not in html and "https://" not in html


def test_cli_baseline_save_names_the_folder_from_the_preset(tmp_path, base, capsys):
    """`baseline save RUN` must put the baseline where `compare` and the workflows look: ROOT/<device>/<preset>."""
    assert main(["baseline", "save", str(base), "--root", str(tmp_path / "bl")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"baseline: {tmp_path / 'bl' / 'cpu' / 'ci_gate' / 'baseline.json'}")
    assert main(["baseline", "save", str(base), "--root", str(tmp_path / "bl")]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


def test_markdown_escapes_pipes(tmp_path, base):
    """A label with "|" would break the Markdown table of the step summary."""
    edit = lambda label, q, r: {**r, "label": "eagle|2"} if label == "eagle2" else r  # noqa: E731
    cmp = run_compare(write_run(tmp_path, "b", edit=edit), write_run(tmp_path, "n", edit=edit))
    assert "| eagle\\|2 / s1 / T=0 |" in format_markdown(cmp)


# ---- the small helpers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b, expected", [([1, 2, 3], [1, 5], 1), ([1, 2], [1, 2, 3], 2), ([4], [4], None),
                                            ([], [7], 0)])
def test_first_difference(a, b, expected):
    """A wrong position would send whoever reads a changed-output report to the wrong token; an output that stopped
    early (a prefix of the other) differs at the shorter length, not nowhere."""
    assert first_difference(a, b) == expected


def test_text_context():
    """The excerpt of a changed output must mark the first differing character, or the report shows text that
    looks the same on both sides."""
    assert text_context("the cat", "the cow") == (5, "the c⟨⟩at", "the c⟨⟩ow")
    assert text_context("x" * 40 + "A", "x" * 40 + "B", width=3) == (40, "…xxx⟨⟩A", "…xxx⟨⟩B")


def test_ids_sha256_slugs_and_presets():
    """Baseline folders and output hashes must be stable across machines and releases, or the gate looks for a
    baseline that is not there, or reports every output as changed."""
    assert ids_sha256([1, 22]) == hashlib.sha256(b"1,22").hexdigest()
    assert ids_sha256([1, 22]) != ids_sha256([12, 2])
    assert slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_slug({"device_type": "cuda", "device_name": "NVIDIA A100-SXM4-80GB"}) == "nvidia-a100-sxm4-80gb"
    assert device_slug({"device": "cpu", "device_type": "cpu", "device_name": "AMD EPYC"}) == "cpu"
    assert preset_of("draftbench run --preset ci_gate --device cuda") == "ci_gate"
    assert preset_of("cli.py run --config=my/gate.yaml") == "gate"
    assert preset_of("draftbench run --methods vanilla") is None


def test_compare_metrics():
    """The statistics the gate uses, on the examples of their docstrings (harness/measure/metrics.py and
    acceptance.py): a wrong one would gate τ or speed-up on a number other than the documented one."""
    assert ACC.tau_pooled([6, 5], [3, 2]) == pytest.approx(ACC.tau([[1, 3, 2], [1, 4]])) == pytest.approx(2.2)
    assert math.isnan(ACC.tau_pooled([], []))
    assert M.relative_change(1.9, 2.0) == pytest.approx(-0.05)
    assert math.isnan(M.relative_change(1.0, 0.0)) and math.isnan(M.relative_change(None, 1.0))
    assert M.per_question_speedups({"a": 30, "b": 10}, {"a": 10, "b": 20, "c": 5}).to_dict() == {"a": 3.0, "b": 0.5}
    g, lo, hi = M.paired_change({"a": 1.8, "b": 0.9}, {"a": 2.0, "b": 1.0})
    assert (g, lo, hi) == pytest.approx((0.9, 0.9, 0.9))


def test_a_half_finished_question_is_missing_not_measured(tmp_path, base):
    """A run killed between the two turns of eagle2's question 2 (the record says two turns, one is there): compare
    must report the question as missing and take τ over the complete questions only, and `baseline save` must not
    store it; a partial question never enters a mean (it used to count its one turn in τ, with no finding)."""
    def torn(label, q, r):
        if label == "eagle2" and q == "2":
            r["question_turns"] = 2
            r["accept_lengths"] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]  # would drag τ down if it were counted
        return r

    new = write_run(tmp_path, "new", edit=torn)
    cmp = run_compare(base, new)
    assert failing(cmp) == [("eagle2 / s1 / T=0", "missing")]
    assert "NEW lacks measured question(s) ['2'] of BASE" in cmp.failures[0].message
    eagle = next(r for r in cmp.rows if r["label"] == "eagle2")
    assert eagle["tau_new"] == pytest.approx(2.4)  # 7 complete questions of [1, 3, 3, 3, 2]: 12 tokens / 5 steps
    side = load_side(new)
    assert "2" not in set(side.questions[side.questions["label"] == "eagle2"]["question_id"])
    assert "2" not in set(side.turns[side.turns["label"] == "eagle2"]["question_id"])


# ---- tolerance gates (acceptance within rtol, per-position floors) -------------------------------------------------
def drafting(lengths, accepted):
    """An edit giving eagle2 chain-of-3 steps: ``accepted`` per step (depth 3 each) and the matching lengths."""
    def edit(label, q, r):
        if label == "eagle2":
            r.update(accept_lengths=list(lengths), accepted_drafts=list(accepted), draft_depths=[3] * len(accepted))
        return r
    return edit


# BASE: 12 tokens in 5 forwards (τ 2.4), accepted [3, 2, 2, 0] -> acc@1..3 = 3/4, 3/4, 1/4
BASE_STEPS = ([1, 4, 3, 3, 1], [3, 2, 2, 0])
# NEW: the same τ, accepted [3, 2, 1, 1] -> acc@1..3 = 4/4, 2/4, 1/4: position 2 below 0.75 × 0.95 = 0.7125
LOWER_SECOND = ([1, 4, 3, 2, 2], [3, 2, 1, 1])
GPU = {"device": {"device": "cuda:0", "device_type": "cuda", "device_name": "NVIDIA H200"}}


def test_acceptance_failures_hand_computed():
    """vLLM's CI rule (mean within rtol, each position >= expected × (1 − rtol)), on the docstring's example and on
    a rise: a wrong floor would pass a drafter that lost its deep positions, or fail on noise."""
    acc = [0.70, 0.50, 0.30]
    assert compare.acceptance_failures(2.0, 1.92, acc, acc, 0.05) == []
    assert compare.acceptance_failures(2.0, 2.0, acc, [0.70, 0.50, 0.28], 0.05) == [
        ("position", "acc@3 0.300 -> 0.280 below the floor 0.2850 (0.300 × (1 − 0.05))")]
    assert compare.acceptance_failures(2.0, 1.89, acc, acc, 0.05) == [
        ("acceptance", "τ 2.000 -> 1.890 (-5.5%) outside ±5.0%")]
    (rise,) = compare.acceptance_failures(2.0, 2.2, acc, acc, 0.05)
    assert rise[0] == "acceptance" and "a rise too fails" in rise[1]
    # a position NEW never drafted fails; one BASE never drafted (NaN) is not gated
    assert [r for r, _ in compare.acceptance_failures(2.0, 2.0, acc, [0.7, 0.5], 0.05)] == ["position"]
    assert compare.acceptance_failures(2.0, 2.0, [0.7, math.nan], [0.7], 0.05) == []
    assert ACC.acceptance_counts([[2, 0, 1]], [[3, 3, 1]]) == ([2, 1, 0], [3, 2, 2])
    assert ACC.acceptance_pooled([[2, 1], [1]], [[3, 2], [1]]) == pytest.approx([0.75, 0.5])
    with pytest.raises(ValueError, match="acceptance-rtol must be in"):
        Thresholds(acceptance_rtol=1.5)


def test_tolerance_gates_apply_where_exact_gating_does_not(tmp_path):
    """NEW on another device with the same τ but a lower acc@2: the exact τ rule (the default) passes it; with
    --acceptance-rtol 0.05 the cell is gated on acceptance and fails on position 2 alone. A saved baseline gates
    the same; one saved before the per-position counts leaves the floors ungated and says so."""
    base = write_run(tmp_path, "base", edit=drafting(*BASE_STEPS))
    new = write_run(tmp_path, "new", edit=drafting(*LOWER_SECOND), manifest=GPU)
    assert run_compare(base, new, gate_speed=False).exit_code == 0  # default: unchanged, τ is equal
    cmp = run_compare(base, new, gate_speed=False, acceptance_rtol=0.05)
    assert failing(cmp) == [("eagle2 / s1 / T=0", "position")]
    assert "acc@2 0.750 -> 0.500 below the floor 0.7125" in cmp.failures[0].message
    eagle = next(r for r in cmp.rows if r["label"] == "eagle2")
    assert eagle["gate"] == "tolerance" and eagle["acc_base"] == pytest.approx([0.75, 0.75, 0.25])
    assert eagle["acc_new"] == pytest.approx([1.0, 0.5, 0.25])
    notes = [f.message for f in cmp.findings if f.rule == "acceptance" and not f.fails]
    assert notes[0].startswith("gated with tolerance ±5.0% (devices differ)")

    saved = save_baseline(base, out=tmp_path / "saved")
    assert failing(run_compare(saved, new, gate_speed=False, acceptance_rtol=0.05)) == [
        ("eagle2 / s1 / T=0", "position")]
    doc = json.loads((saved / "baseline.json").read_text())
    for q in doc["questions"]:
        q.pop("accepted_at"), q.pop("drafted_at")
    (saved / "baseline.json").write_text(json.dumps(doc))
    old = run_compare(saved, new, gate_speed=False, acceptance_rtol=0.05)
    assert old.exit_code == 0 and any("per-position floors not gated" in f.message for f in old.findings)


def test_an_engine_cell_is_gated_with_tolerance_and_exact_outputs(tmp_path):
    """A label the run configuration puts on vLLM: no flag needed, τ within 5% (vLLM's CI) instead of the exact τ
    rule, outputs still exact at T = 0. A τ 2.4 -> 2.0 drop fails on acceptance; a changed token on outputs."""
    engine = {"config": {**MANIFEST["config"], "methods": [{"name": "eagle2", "engine": "vllm"}]}}
    base = write_run(tmp_path, "base", edit=drafting(*BASE_STEPS), manifest=engine)
    worse = drafting([1, 3, 3, 3, 1, 1], [2, 2, 2, 0, 0])

    def changed(label, q, r):
        r = worse(label, q, r)
        return {**r, "output_ids": ids(q)[:-1] + [5]} if label == "eagle2" and q == "3" else r

    cmp = run_compare(base, write_run(tmp_path, "new", edit=changed, manifest=engine), gate_speed=False)
    # accepted [2, 2, 2, 0, 0] also falls below every floor (3/5, 3/5, 0/5 against 3/4, 3/4, 1/4); the changed
    # token is also a lossless failure (NEW's own vanilla kept its output)
    assert {rule for _, rule in failing(cmp)} == {"acceptance", "position", "outputs", "lossless"}
    assert [f.message for f in cmp.failures if f.rule == "acceptance"] == ["τ 2.400 -> 2.000 (-16.7%) outside ±5.0%"]
    assert all(f.cell == "eagle2 / s1 / T=0" for f in cmp.failures)
    assert compare.inexact_reasons(load_side(base), load_side(base), "eagle2", 0.0) == ["engine vllm"]
    assert compare.inexact_reasons(load_side(base), load_side(base), "vanilla", 0.0) == []


def test_baseline_save_refuses_an_interrupted_run_saying_what_is_missing(tmp_path, capsys):
    """`baseline save` of an interrupted run (1 of 6 questions of each entry recorded) exited 0 and committed a gate
    of one question. It must refuse in one line saying what is missing and how to finish the run; --allow-partial
    saves it anyway."""
    manifest = {"methods": {"vanilla": {}, "eagle2": {}}, "config": {"baseline": "vanilla", "temperatures": [0.0]}}
    run = write_run(tmp_path, "cut", edit=lambda label, q, r: r if q == "1" else None, manifest=manifest)
    code = main(["baseline", "save", str(run), "--out", str(tmp_path / "bl")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"draftbench: error: {run}: a partial run (vanilla on s1: 1 of 6 questions; eagle2 "
                                 f"on s1: 1 of 6 questions complete); finish it with draftbench run --resume {run}, "
                                 "or pass --allow-partial to save what it has")
    assert not (tmp_path / "bl").exists()
    assert main(["baseline", "save", str(run), "--out", str(tmp_path / "bl"), "--allow-partial"]) == 0


def test_compare_against_a_run_whose_every_turn_failed_is_one_line(tmp_path, base, capsys):
    """A NEW run whose every turn failed ended in pandas' "You are trying to merge on float64 and object columns
    for key 'temperature'": it must say which side measured nothing and why."""
    failed = write_run(tmp_path, "failed", edit=lambda label, q, r: rec(label, q, 1.0, [], [], status="error"))
    assert main(["compare", str(base), str(failed)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"draftbench: error: {failed}: every turn of its 16 record(s) failed (first: RuntimeError: boom); "
                   "it measured nothing to compare")


def test_compare_reads_a_run_whose_texts_hold_a_lone_surrogate(tmp_path, base):
    """One record whose text held an escaped lone surrogate ("\\ud800") made `compare` refuse the whole run ("'utf-8'
    codec can't encode character"): the run must be read and compared like any other."""
    odd = write_run(tmp_path, "odd", edit=lambda label, q, r: {**r, "output_text": r["output_text"] + "\ud800"})
    cmp = run_compare(base, odd)
    assert cmp.exit_code == 0 and failing(cmp) == []
