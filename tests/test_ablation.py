"""Ablation knobs, tables and plots on the literal run of tests/support/ablation_run.py (numbers worked out there)."""

import pandas as pd
import pytest

from harness.report import ablation as A
from harness.report import report as R
from harness.report import tables as T
from tests.support.ablation_run import MANIFEST, RECORDS, write_run


@pytest.fixture(scope="module")
def turns():
    return T.turns_table(RECORDS)


def test_knobs_come_from_the_records_options(turns):
    """The labels are opaque ("A".."D"); knobs must still be mode and total_tokens, and depth / top_k (equal on
    every entry) must not be knobs. Parsing labels would find nothing; counting every option would add depth."""
    assert A.knob_names(turns) == ["opt.mode", "opt.total_tokens"]
    summary = A.with_knobs(T.summary_table(turns), turns)
    cols = list(summary.columns)
    assert cols[cols.index("method") + 1: cols.index("method") + 3] == ["opt.mode", "opt.total_tokens"]
    by_label = summary.set_index("label")
    assert by_label.loc["C", "opt.mode"] == "ar" and by_label.loc["B", "opt.total_tokens"] == 16
    assert pd.isna(by_label.loc["vanilla", "opt.mode"])
    assert A.with_knobs(T.summary_table(T.turns_table(RECORDS[:3])), T.turns_table(RECORDS[:3])).equals(
        T.summary_table(T.turns_table(RECORDS[:3])))  # no knob -> the table is unchanged


def test_ablation_table_numbers(turns):
    """Hand-computed per-entry numbers: a wrong step count (prefill counted as a verification step), a speed-up
    without pairing, or swapped timings would change them."""
    t = A.ablation_table(turns).set_index("label")
    assert list(t.index) == ["A", "B", "C", "D"]  # vanilla does not draft
    assert t.loc["A", "tau"] == pytest.approx(13 / 7)
    assert t.loc["C", "tau"] == pytest.approx(13 / 9)
    assert t.loc["D", "tau"] == pytest.approx(13 / 6)
    assert t.loc["A", "speedup"] == pytest.approx(13 / 6)
    assert t.loc["B", "speedup"] == pytest.approx(7 / 3)
    assert t.loc["C", "speedup"] == pytest.approx(7 / 6)
    assert t.loc["D", "speedup"] == pytest.approx(17 / 6)
    assert t.loc["A", "draft_forwards_per_step"] == pytest.approx(3.0)
    assert t.loc["C", "draft_forwards_per_step"] == pytest.approx(4.0)
    assert t.loc["A", "draft_ms_per_step"] == pytest.approx(10.0)
    assert t.loc["A", "verify_ms_per_step"] == pytest.approx(20.0)
    assert [t.loc["A", f"acc@{i}"] for i in (1, 2, 3, 4)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert [t.loc["D", f"acc@{i}"] for i in (1, 2, 3, 4)] == pytest.approx([1.0, 2 / 3, 1 / 3, 1 / 3])
    assert (t.loc["C", "opt.mode"], t.loc["C", "opt.total_tokens"]) == ("ar", 8)
    for col in ("tau", "speedup"):  # the point estimate lies inside its band
        assert (t[f"{col}_ci_lo"] <= t[col] + 1e-12).all() and (t[col] <= t[f"{col}_ci_hi"] + 1e-12).all()


PAPER_LAYOUT = pd.DataFrame([
    # label, head, num_experts, experts_per_tok, mode, contrastive
    ("n1", "h1", 1, 1, "hybrid", "on"), ("n2", "h2", 2, 2, "hybrid", "on"), ("n3", "h3", 3, 2, "hybrid", "on"),
    ("n4", "h4", 4, 2, "hybrid", "on"), ("n2_ar", "h2", 2, 2, "ar", "on"), ("n2_off", "h2", 2, 2, "hybrid", "off"),
    ("both", "h2c0", 2, 2, "ar", "on"),
], columns=["label", "opt.head", "opt.num_experts", "opt.experts_per_tok", "opt.mode", "opt.contrastive"])
KNOBS = ["opt.head", "opt.num_experts", "opt.experts_per_tok", "opt.mode", "opt.contrastive"]


def test_plot_axes_and_slices_in_the_paper_layout():
    """Against num_experts the plot must show the four alike-trained hybrid heads (not the ar, contrastive-off or
    contrast_weight=0 entries); against mode it must compare modes on the most used head; head and experts_per_tok
    (explained by other knobs) are no axis. Another rule would mix entries that differ in two knobs."""
    assert A.x_knobs(PAPER_LAYOUT, KNOBS) == ["opt.num_experts", "opt.mode", "opt.contrastive"]
    assert list(A.plot_slice(PAPER_LAYOUT, KNOBS, "opt.num_experts")["label"]) == ["n1", "n2", "n3", "n4"]
    assert list(A.plot_slice(PAPER_LAYOUT, KNOBS, "opt.num_experts", "opt.mode")["label"]) == [
        "n1", "n2", "n3", "n4", "n2_ar"]
    assert list(A.plot_slice(PAPER_LAYOUT, KNOBS, "opt.mode")["label"]) == ["n2", "n2_ar"]
    assert list(A.plot_slice(PAPER_LAYOUT, KNOBS, "opt.contrastive")["label"]) == ["n2", "n2_off"]


def test_pivots_put_one_knob_on_rows_and_the_other_on_columns(turns):
    """total_tokens rows x mode columns with "tau / speed-up" cells; a wrong pivot would put A's numbers elsewhere."""
    pivots = dict(A.ablation_pivots(A.ablation_table(turns)))
    pivot = pivots["jakiro, mt, T=0: tau / speedup against mode"]
    assert pivot.loc["hybrid", "total_tokens=8"] == "1.86 / 2.17"
    assert pivot.loc["ar", "total_tokens=16"] == "2.17 / 2.83"
    by_tokens = pivots["jakiro, mt, T=0: tau / speedup against total_tokens"]
    assert by_tokens.loc["8", "mode=ar"] == "1.44 / 1.17"


def test_write_report_adds_knob_columns_ablation_table_and_plots(tmp_path):
    """write_report must write the knob columns into summary.csv / questions.csv, tables/ablation.csv and one set of
    ablation plots per knob; a run without knobs gets none of them."""
    run = write_run(tmp_path)
    paths = R.write_report(run)
    summary = pd.read_csv(run / "tables" / "summary.csv")
    assert {"opt.mode", "opt.total_tokens"} <= set(summary.columns)
    assert "opt.mode" in pd.read_csv(run / "tables" / "questions.csv").columns
    assert len(pd.read_csv(paths["ablation_csv"])) == 4
    md = paths["summary_md"].read_text()
    assert "| C | ar | 8 | 1.44 [" in md and "| 1.17 [" in md  # C's tau and speed-up with their knobs
    for knob in ("mode", "total_tokens"):
        for suffix in ("", "_acceptance", "_cost"):
            png = run / "plots" / f"ablation_jakiro_{knob}{suffix}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    plain = write_run(tmp_path / "plain", [r for r in RECORDS if r["label"] in ("vanilla", "A")])
    plain_paths = R.write_report(plain)
    assert "ablation_csv" not in plain_paths and not list((plain / "plots").glob("ablation_*"))


def test_only_swept_or_named_options_are_ablated(tmp_path):
    """A run whose entries merely differ in options (no sweep:, no ablate:) must get no ablation table or plots
    (the demo printed 21 ablation plots for a run that ablated nothing); naming one option ablates it and the knobs
    it determines within the method, and a sweep ablates its options."""
    assert A.ablated_options({}) == set()
    assert A.ablated_options(MANIFEST["config"] | {"ablate": ["lookup"]}) == {"mode", "total_tokens", "lookup"}
    turns = T.turns_table(RECORDS)
    assert A.knob_names(A.ablation_turns(turns, set())) == []
    assert A.knob_names(A.ablation_turns(turns, {"mode"})) == ["opt.mode"]  # total_tokens is not a function of mode
    unswept = write_run(tmp_path / "unswept", manifest={**MANIFEST, "config": {"baseline": "vanilla"}})
    paths = R.write_report(unswept)
    assert "ablation_csv" not in paths and not list((unswept / "plots").glob("ablation_*"))
    assert "opt.mode" in pd.read_csv(unswept / "tables" / "summary.csv").columns  # the tables keep the options
    named = write_run(tmp_path / "named", manifest={**MANIFEST, "config": {"baseline": "vanilla", "ablate": ["mode"]}})
    assert list(pd.read_csv(R.write_report(named)["ablation_csv"]).filter(like="opt.").columns) == ["opt.mode"]


def test_swept_engine_options_are_knobs():
    """A sweep over an engine option (vLLM's num_speculative_tokens for medusa) ablates that option: the records'
    engine_options read as opt.engine_options.* columns, which the sweep's option names; without them a sweep over
    the engine would give one table row per label and no knob."""
    recs = []
    for label, k in (("A", 1), ("B", 2)):
        for rec in (r for r in RECORDS if r["label"] == label):
            recs.append({**rec, "method": "medusa", "method_options": {}, "engine": "vllm",
                         "engine_options": {"speculative_config": {"num_speculative_tokens": k}}})
    turns = T.turns_table(recs)
    knob = "opt.engine_options.speculative_config.num_speculative_tokens"
    assert A.knob_names(turns) == [knob]
    swept = A.ablated_options({"sweep_spec": [{"v": {knob.removeprefix("opt."): [1, 2]}}]})
    assert A.knob_names(A.ablation_turns(turns, swept)) == [knob]
    assert list(A.label_options(turns)[knob]) == [1, 2]
