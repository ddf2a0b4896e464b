"""Tables, Markdown pivot and plots from a literal run directory, checked against hand-computed numbers.

The run: vanilla (lossless) and "medusa-typical" (a medusa entry declared NOT lossless) on suites s1 (q1 with one
turn, q2 with two) and s2 (q3, two turns), temperature 0. Medusa's q2 has an ok first turn and an error second turn,
so the whole question must be left out of medusa's measurements and of the pairing with vanilla.

Hand-computed expectations:
  vanilla s1: q1 4 tok / 2.0 s = 2.0 tok/s, q2 (2+2) / (0.25+0.25) = 8.0 -> mean 5.0; tau 8/8 = 1;
              tau_script (EAGLE scripts: mean over questions of Σ S / Σ (K - 1)): q1 3 / 2 = 1.5, q2 has no
              second verification step in any turn (Σ (K - 1) = 0) and is skipped -> 1.5
  vanilla s2: q3 (3+3) / (1.0+2.0) = 2.0 tok/s
  medusa  s1: q1 4 / 0.5 = 8.0, q2 errored (dropped) -> speed-up on q1 only: 8 / 2 = 4.0 (unpaired: 8 / 5);
              tau 4 / 2 steps = 2.0 (with q2's ok turn it would be 6 / 4); tau_script: q1's one verification step
              gives Σ (K - 1) = 0 -> NaN;
              acc@1..3 from (accepted 2, depth 3) = 1, 1, 0
  medusa  s2: q3 6 / (0.5+0.5) = 6.0 -> speed-up 6 / 2 = 3.0; tau (3+3) / (2+3) = 1.2; tau_script (2 + 2) / (0 + 1) = 4;
              steps (1, 3), (0, 3), (0, 2): acc@1 = 1/3, acc@2 = 0/3, acc@3 = 0/2; lossless share: turn 0 differs,
              turn 1 equal -> 0.5
  paper table mean column for medusa: speed-up (4 + 3) / 2 = 3.5, tau (2.0 + 1.2) / 2 = 1.6
"""

import json
import math

import pandas as pd
import pytest

from harness.report import markdown as MD
from harness.report import report as R
from harness.report import tables as T

MANIFEST = {
    "run_id": "run-1",
    "created": "2025-01-01T00:00:00+00:00",
    "git_hash": "abc123",
    "git_dirty": False,
    "versions": {"python": "3.12.0", "torch": "2.13.0", "transformers": "5.24.0"},
    "device": {"device": "cpu", "device_type": "cpu", "device_name": "Test CPU"},
    # a config value named like a provenance field must not shadow the real one
    "config": {"baseline": "vanilla", "git_hash": "not-this-one"},
}


def rec(label, method, lossless, suite, qid, turn, new, wall, out, lengths, accepted=(), depths=(), **extra):
    r = {"run_id": "run-1", "status": "ok", "error": None, "method": method, "label": label, "lossless": lossless,
         "method_options": {}, "suite": suite, "suite_version": "1", "question_id": qid, "category": "c",
         "turn": turn, "target": "tiny", "dtype": "float32", "device": "cpu", "temperature": 0.0, "top_p": 1.0,
         "seed": 0, "repeat": 0, "prompt_tokens": 5, "new_tokens": new, "steps": len(lengths),
         "accept_lengths": list(lengths), "accepted_drafts": list(accepted), "draft_depths": list(depths),
         "wall_time_s": wall, "prefill_time_s": 0.1, "stop_reason": "eos", "output_text": "x", "output_ids": out,
         "rss_bytes": 900, "peak_rss_bytes": 1000, "cuda_peak_allocated_bytes": None,
         "cuda_peak_reserved_bytes": None, "nvml_used_bytes": None, "energy_j": None, "mean_power_w": None,
         "timings": {}, "counters": {}, "score": None, "score_name": None, "timestamp": "2025-01-01T00:00:01"}
    r.update(extra)
    return r


V = ("vanilla", "vanilla", True)
MT = ("medusa-typical", "medusa", False)
MEDUSA_OPTS = {"posterior_threshold": 0.09, "tree": {"depth": 3}}

RECORDS = [
    rec(*V, "s1", "q1", 0, 4, 2.0, [1, 2, 3, 4], [1, 1, 1, 1], peak_rss_bytes=1200),
    rec(*V, "s1", "q2", 0, 2, 0.25, [5, 6], [1, 1]),
    rec(*V, "s1", "q2", 1, 2, 0.25, [5, 7], [1, 1]),
    rec(*V, "s2", "q3", 0, 3, 1.0, [7, 8, 9], [1, 1, 1]),
    rec(*V, "s2", "q3", 1, 3, 2.0, [1, 1, 2], [1, 1, 1], score=1.0, score_name="exact"),
    rec(*MT, "s1", "q1", 0, 4, 0.5, [1, 2, 3, 4], [1, 3], [2], [3], method_options=MEDUSA_OPTS,
        energy_j=2.0, cuda_peak_allocated_bytes=5000, cuda_peak_reserved_bytes=6000, timings={"draft_s": 0.1}),
    rec(*MT, "s1", "q2", 0, 2, 0.1, [5, 6], [1, 1], [0], [3], method_options=MEDUSA_OPTS),
    {"run_id": "run-1", "status": "error", "error": {"type": "RuntimeError", "message": "boom"},
     "method": "medusa", "label": "medusa-typical", "lossless": False, "method_options": MEDUSA_OPTS,
     "suite": "s1", "suite_version": "1", "question_id": "q2", "turn": 1, "temperature": 0.0, "top_p": 1.0,
     "seed": 0, "repeat": 0},
    rec(*MT, "s2", "q3", 0, 3, 0.5, [7, 8, 0], [1, 2], [1], [3], method_options=MEDUSA_OPTS),
    rec(*MT, "s2", "q3", 1, 3, 0.5, [1, 1, 2], [1, 1, 1], [0, 0], [3, 2], method_options=MEDUSA_OPTS,
        score=0.0, score_name="exact"),
]


def write_run(tmp_path, records, manifest=MANIFEST):
    run = tmp_path / "run-1"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def row(summary, label, suite):
    r = summary[(summary["label"] == label) & (summary["suite"] == suite)]
    assert len(r) == 1, f"expected one summary row for {label}/{suite}, got {len(r)}"
    return r.iloc[0]


def test_turns_table_flattens_options_and_adds_provenance():
    turns = T.turns_table(RECORDS, MANIFEST)
    assert len(turns) == len(RECORDS)  # one row per turn, error included
    first = turns.iloc[5]
    # nested options become dotted columns; the method's own timings too
    assert first["opt.posterior_threshold"] == 0.09 and first["opt.tree.depth"] == 3
    assert first["timing.draft_s"] == 0.1
    # provenance from the manifest, not from the config section
    assert first["git_hash"] == "abc123" and first["device_name"] == "Test CPU"
    assert first["torch_version"] == "2.13.0" and first["transformers_version"] == "5.24.0"
    # derived per-turn numbers: 4 tokens / 0.5 s; tau 4 tokens / 2 forwards
    assert first["tokens_per_s"] == pytest.approx(8.0) and first["tau_turn"] == pytest.approx(2.0)
    err = turns.iloc[7]
    # the error record lacks measurements: NaN, not zero, and not an exception
    assert err["status"] == "error" and math.isnan(err["tokens_per_s"]) and math.isnan(err["tau_turn"])


def test_summary_numbers_match_hand_computation():
    s = T.summary_table(T.turns_table(RECORDS, MANIFEST))
    v1, m1, m2 = row(s, "vanilla", "s1"), row(s, "medusa-typical", "s1"), row(s, "medusa-typical", "s2")
    assert (v1["n_questions"], v1["n_turns"], v1["n_errors"]) == (2, 3, 0)
    assert v1["tokens_per_s"] == pytest.approx(5.0) and v1["tau"] == pytest.approx(1.0)
    assert v1["tau_script"] == pytest.approx(1.5) and v1["speedup"] == pytest.approx(1.0)
    # the errored question is dropped from medusa's measurements and from the pairing with vanilla
    assert (m1["n_questions"], m1["n_turns"], m1["n_errors"]) == (1, 1, 1)
    assert m1["tokens_per_s"] == pytest.approx(8.0) and m1["speedup"] == pytest.approx(4.0)
    assert (m1["speedup_gmean"], m1["speedup_ci_lo"], m1["speedup_ci_hi"]) == pytest.approx((4.0, 4.0, 4.0))
    assert m1["tau"] == pytest.approx(2.0) and math.isnan(m1["tau_script"])
    assert [m1["acc@1"], m1["acc@2"], m1["acc@3"]] == pytest.approx([1.0, 1.0, 0.0])
    assert m1["lossless_share"] == pytest.approx(1.0)
    assert m1["energy_per_token_j"] == pytest.approx(0.5)  # 2 J / 4 tokens
    assert m1["peak_memory_bytes"] == 5000  # CUDA peak allocated wins over RSS when present
    assert m1["peak_reserved_bytes"] == 6000  # reserved (allocator cache included) is reported beside it
    assert m2["speedup"] == pytest.approx(3.0) and m2["tau"] == pytest.approx(1.2)
    assert m2["tau_script"] == pytest.approx(4.0)
    assert [m2["acc@1"], m2["acc@2"], m2["acc@3"]] == pytest.approx([1 / 3, 0.0, 0.0])
    # conditional position 3 needs a step that accepted 2 and drafted 3: none here
    assert m2["acc_cond@2"] == pytest.approx(0.0) and math.isnan(m2["acc_cond@3"])
    assert m2["lossless_share"] == pytest.approx(0.5) and m2["quality"] == pytest.approx(0.0)
    assert not m2["lossless"] and row(s, "vanilla", "s2")["lossless"]
    # vanilla never drafts: per-position acceptance is undefined, not zero
    assert math.isnan(v1["acc@1"])
    assert v1["peak_memory_bytes"] == 1200 and math.isnan(v1["energy_per_token_j"])


def test_paper_table_cells_and_lossy_mark():
    md = MD.paper_table(T.summary_table(T.turns_table(RECORDS, MANIFEST)))
    assert "| method | s1 | s2 | mean |" in md
    assert "| vanilla | 1.00× / 1.00 | 1.00× / 1.00 | 1.00× / 1.00 |" in md
    # not lossless -> dagger on the row and a footnote explaining it
    assert "| medusa-typical † | 4.00× / 2.00 | 3.00× / 1.20 | 3.50× / 1.60 |" in md
    assert "\n† not lossless" in md
    # the baseline row comes first
    assert md.index("| vanilla |") < md.index("| medusa-typical")


def test_write_report_writes_every_file(tmp_path):
    run = write_run(tmp_path, RECORDS)
    paths = R.write_report(run)
    for key in ("turns_parquet", "turns_csv", "summary_parquet", "summary_csv", "summary_md", "plot_speedup",
                "plot_tau", "plot_tokens_per_s", "plot_accept_hist", "plot_acceptance"):
        assert paths[key].exists() and paths[key].stat().st_size > 0, key
    assert paths["plot_speedup"].parent == run / "plots"
    # CSV list columns are JSON text that round-trips
    csv = pd.read_csv(paths["turns_csv"])
    assert json.loads(csv.loc[5, "accept_lengths"]) == [1, 3]
    # parquet keeps one row per turn, including the error record
    assert len(pd.read_parquet(paths["turns_parquet"])) == len(RECORDS)
    md = paths["summary_md"].read_text()
    assert "abc123" in md and "torch 2.13.0" in md and "| medusa-typical † | 4.00× / 2.00 |" in md


def test_a_failed_validity_check_is_a_line_of_the_summary_and_the_page(tmp_path):
    """A run without warm-up, on a machine whose load average (3.5) exceeded its 2 CPUs, measured speeds that do not
    mean what they say: the summary and report.html must each carry a line per failed check, not hide them."""
    records = [{**r, "load_avg_1m": 3.5} for r in RECORDS]
    manifest = {**MANIFEST, "config": {**MANIFEST["config"], "warmup": 0, "interleave": True},
                "device": {**MANIFEST["device"], "cpu_count": 2}}
    paths = R.write_report(write_run(tmp_path, records, manifest))
    md = paths["summary_md"].read_text()
    assert "## Validity" in md and "- FAIL warmup: 0 untimed warm-up question(s) per entry" in md, md
    assert "- FAIL machine load: 1-min load average 3.50 to 3.50 on 2 logical CPUs (at most 2)" in md, md
    page = paths["report_html"].read_text()
    assert 'id="validity"' in page and "FAIL machine load" in page and "FAIL warmup" in page
    verdicts = pd.read_csv(paths["validity_csv"], keep_default_na=False)  # "n/a" is a verdict, not NaN
    assert dict(zip(verdicts["name"], verdicts["status"])) == {
        "warmup": "fail", "compile": "n/a", "machine load": "fail", "interleaving": "pass"}


def test_write_report_without_baseline_single_method(tmp_path):
    # only the medusa records: speed-ups cannot exist, everything else still does
    run = write_run(tmp_path, [r for r in RECORDS if r["label"] == "medusa-typical"])
    paths = R.write_report(run)
    summary = pd.read_csv(paths["summary_csv"])
    assert summary["speedup"].isna().all() and summary["speedup_gmean"].isna().all()
    assert summary["tau"].tolist() == pytest.approx([2.0, 1.2])
    assert "| medusa-typical † | n/a / 2.00 | n/a / 1.20 | n/a / 1.60 |" in paths["summary_md"].read_text()
    assert "plot_speedup" not in paths and paths["plot_tau"].exists()


def test_write_report_names_missing_records(tmp_path):
    with pytest.raises(FileNotFoundError, match="records.jsonl"):
        R.write_report(tmp_path)


def test_parquet_accepts_a_column_mixing_names_and_rank_paths(tmp_path):
    # option "tree" is a name for one method and explicit rank paths for another: the tables must still be written
    # (Arrow refuses such a column; the 80-question MT-bench run lost its report to this) and keep both values
    from harness.report.report import _write_table

    # (suffix's ``tree`` is a boolean in the same column: the every-method preset lost its report to that)
    df = pd.DataFrame({"label": ["eagle1", "medusa", "suffix", "vanilla"],
                       "opt.tree": ["eagle_mc_sim_7b_63", [[0], [0, 0], [1]], True, None],
                       "accept_lengths": [[1, 2], [3], [2], [1]]})
    files = _write_table(df, tmp_path / "turns")
    back = pd.read_parquet(files["turns_parquet"])
    assert back["opt.tree"].tolist()[:3] == ["eagle_mc_sim_7b_63", "[[0], [0, 0], [1]]", "true"]
    assert pd.isna(back["opt.tree"][3])
    assert list(back["accept_lengths"][0]) == [1, 2]


def test_a_pipe_in_a_label_does_not_break_summary_md_rows(tmp_path):
    """A label "medusa|typical" split its summary.md row into one column too many; every row of every table must
    keep its header's column count, and report.html must show the label whole."""
    records = [{**r, "label": "medusa|typical"} if r["label"] == "medusa-typical" else r for r in RECORDS]
    paths = R.write_report(write_run(tmp_path, records))
    md = paths["summary_md"].read_text()
    assert "| medusa\\|typical † | 4.00× / 2.00 |" in md
    from harness.report.formatting import markdown_cells

    tables: list[list[str]] = []
    for line in md.splitlines():
        if line.startswith("|"):
            if not tables or not tables[-1]:
                tables.append([])
            tables[-1].append(line)
        elif tables and tables[-1]:
            tables.append([])
    for rows in filter(None, tables):
        assert len({len(markdown_cells(r)) for r in rows}) == 1, rows
    assert "medusa|typical" in paths["report_html"].read_text()
