"""Acceptance as engines report it (issue #24): the draft acceptance rate, drafted tokens per step, vLLM's / AIPerf's
mean acceptance length, terminal steps counted explicitly, and the AIPerf / vLLM exports read back by ``compare``.

Three literal turns pin the terminal-step conventions (hand-computed):

* EOS mid-tree: accept_lengths [1, 4, 2], accepted_drafts [3, 3], draft_depths [4, 5]: the second step's verifier
  accepted 3 drafts of a depth-5 tree, EOS was the second emitted token, so 2 drafts reached the output.
* budget: accept_lengths [1, 3, 2], accepted [2, 3], depths [3, 3]: the budget (6 tokens) left room for 2 of the
  second step's 3 accepted drafts.
* nothing drafted (a lookup that never matched): accept_lengths [1, 1, 1], accepted [0, 0], depths [0, 0].
"""

import json
import math

import pytest

from harness.backends.contract import acceptance_source
from harness.cli import main
from harness.gate.baseline import export_run, load_side
from harness.gate.compare import compare_sides
from harness.gate.formats import format_text
from harness.measure import acceptance as ACC
from harness.report.exports import read_export
from harness.report.markdown import acceptance_markdown
from harness.report.report import write_report
from harness.report.tables import HARNESS_ACCEPTANCE, summary_table, turns_table

EOS = {"accept_lengths": [1, 4, 2], "accepted_drafts": [3, 3], "draft_depths": [4, 5], "stop_reason": "eos"}
BUDGET = {"accept_lengths": [1, 3, 2], "accepted_drafts": [2, 3], "draft_depths": [3, 3],
          "stop_reason": "max_new_tokens"}
NONE = {"accept_lengths": [1, 1, 1], "accepted_drafts": [0, 0], "draft_depths": [0, 0],
        "stop_reason": "max_new_tokens"}
MANIFEST = {"run_id": "acc", "created": "2026-01-01T00:00:00+00:00", "command": "draftbench run --preset x",
            "git_hash": "0123456", "git_dirty": False, "versions": {"torch": "2.13.0", "transformers": "5.24.0"},
            "device": {"device": "cpu", "device_type": "cpu"}, "config": {"baseline": "vanilla"},
            "config_digest": "d1", "target": {"name": "tiny", "dtype": "float32"}}


def record(label, q, turn, wall, lengths, accepted=(), depths=(), stop="max_new_tokens", engine_counters=None):
    out = [100 * int(q) + 10 * turn + i for i in range(sum(lengths))]
    rec = {"run_id": "acc", "status": "ok", "method": label, "label": label, "lossless": True, "suite": "s1",
           "question_id": q, "turn": turn, "question_turns": 1, "target": "tiny", "dtype": "float32",
           "device": "cpu", "temperature": 0.0, "top_p": 1.0, "seed": 0, "repeat": 0, "new_tokens": len(out),
           "steps": len(lengths), "accept_lengths": list(lengths), "accepted_drafts": list(accepted),
           "draft_depths": list(depths), "wall_time_s": wall, "prefill_time_s": 0.01, "stop_reason": stop,
           "output_ids": out, "output_text": "x", "score": None}
    if engine_counters is not None:
        rec["engine_counters"] = engine_counters
    return rec


def spec(label, q, case, wall=0.5):
    return record(label, q, 0, wall, case["accept_lengths"], case["accepted_drafts"], case["draft_depths"],
                  case["stop_reason"])


def write_run(root):
    """Questions 1-3: the EOS, budget and nothing-drafted turns for "tree", vanilla's same number of tokens."""
    run = root / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(MANIFEST))
    recs = []
    for q, case in (("1", EOS), ("2", BUDGET), ("3", NONE)):
        n = sum(case["accept_lengths"])
        recs += [record("vanilla", q, 0, 1.0, [1] * n), spec("tree", q, case)]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def test_terminal_steps_say_how_many_drafts_they_accepted_before_the_cut():
    """Wrong if a cut step reported its verdict (3) or the tokens it emitted including the bonus."""
    assert ACC.drafts_before_cut(EOS["accept_lengths"], EOS["accepted_drafts"]) == [3, 2]
    assert ACC.drafts_before_cut(BUDGET["accept_lengths"], BUDGET["accepted_drafts"]) == [2, 2]
    assert ACC.drafts_before_cut(NONE["accept_lengths"], NONE["accepted_drafts"]) == [0, 0]
    assert ACC.drafts_before_cut([1, 3], [2, 1]) == [2, 0]  # an engine step the budget left no token for


def test_each_metric_takes_its_stated_convention_on_terminal_steps():
    """The rates and vLLM's mean acceptance length count the verdict before the cut (6 accepted of 9 drafted in the
    EOS turn, not 5); τ counts what was emitted (7 tokens in 3 forwards). A turn that drafted nothing has no rate
    (NaN, never 0) and does not dilute the pooled ones."""
    counts = [ACC.draft_counts(c["accepted_drafts"], c["draft_depths"]) for c in (EOS, BUDGET, NONE)]
    assert counts == [(6, 9, 2), (5, 6, 2), (0, 0, 0)]
    acc, drafted, steps = zip(*counts)
    assert ACC.draft_acceptance_rate([6], [9]) == pytest.approx(2 / 3)
    assert ACC.drafted_per_step([9], [2]) == pytest.approx(4.5)
    assert ACC.mean_acceptance_length([6], [2]) == pytest.approx(4.0)
    assert ACC.tau([EOS["accept_lengths"]]) == pytest.approx(7 / 3)
    assert math.isnan(ACC.draft_acceptance_rate([0], [0])) and math.isnan(ACC.drafted_per_step([0], [0]))
    assert math.isnan(ACC.mean_acceptance_length([0], [0]))
    assert ACC.draft_acceptance_rate(acc, drafted) == pytest.approx(11 / 15)
    assert ACC.drafted_per_step(drafted, steps) == pytest.approx(15 / 4)
    assert ACC.mean_acceptance_length(acc, steps) == pytest.approx(1 + 11 / 4)
    assert ACC.draft_acceptance_rate([None, 5], [None, 6]) == pytest.approx(5 / 6)  # not measured: skipped


def test_engine_records_count_with_their_own_counters():
    """An engine's counters win over the per-step lists; a counter it lacks falls back to the lists; a turn with
    neither (vanilla) has no count, so it cannot read as zero acceptance."""
    assert ACC.draft_counts([2, 1], [3, 3], {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 7}) == (7, 12, 4)
    assert ACC.draft_counts([2, 1], [3, 3], {"drafts": None, "draft_tokens": None, "accepted_tokens": 7}) == (7, 6, 2)
    assert ACC.draft_counts([], [], None) == (None, None, None)


def test_summary_and_turns_tables_carry_the_acceptance_columns():
    recs = [spec("tree", q, c) for q, c in (("1", EOS), ("2", BUDGET), ("3", NONE))]
    recs.append(record("vanilla", "1", 0, 1.0, [1] * 7))
    turns = turns_table(recs)
    assert turns["draft_acceptance_rate_turn"].tolist()[:2] == pytest.approx([2 / 3, 5 / 6])
    assert math.isnan(turns["draft_acceptance_rate_turn"].iloc[2]) and math.isnan(turns["drafted_per_step_turn"][3])
    row = summary_table(turns).set_index("label").loc["tree"]
    assert row["draft_acceptance_rate"] == pytest.approx(11 / 15) and row["drafted_per_step"] == pytest.approx(3.75)
    assert row["mean_acceptance_length"] == pytest.approx(3.75) and row["drafts_cut"] == 2.0
    assert math.isnan(summary_table(turns).set_index("label").loc["vanilla", "draft_acceptance_rate"])


def test_exports_use_the_engines_field_names_and_read_back_into_compare(tmp_path):
    """AIPerf's SpecDecodeAcceptanceRecord and vLLM's metrics.speculative_decoding, on the EOS turn by hand; each
    export read back compares with its own run as unchanged (same τ, rate, speed-up; outputs by hash)."""
    run = write_run(tmp_path)
    aiperf, vllm = export_run(run, "aiperf"), export_run(run, "vllm", tmp_path / "v.jsonl")
    assert aiperf == run / "exports" / "aiperf.jsonl"
    lines = [json.loads(x) for x in aiperf.read_text().splitlines()]
    assert lines[0]["spec_decode_acceptance"] is None  # vanilla: no speculation, no object
    assert lines[1]["spec_decode_acceptance"] == {
        "engine": "draftbench", "mean_acceptance_length": 4.0, "draft_acceptance_rate": pytest.approx(2 / 3),
        "acceptance_histogram": {"3": 2}, "num_accepted_draft_tokens": 6, "num_draft_tokens": 9,
        "num_spec_steps": 2, "num_spec_tokens": None, "completion_tokens": 7, "per_step_accepted": [3, 3],
        "per_step_drafted": [4, 5]}
    assert lines[1]["request"]["terminal_drafts_before_cut"] == 2
    none = lines[5]["spec_decode_acceptance"]  # the engines' zero-step payload
    assert (none["num_spec_steps"], none["mean_acceptance_length"], none["draft_acceptance_rate"]) == (0, 1.0, 0.0)
    v = json.loads(vllm.read_text().splitlines()[1])
    assert v["usage"] == {"completion_tokens": 7}
    assert v["metrics"]["speculative_decoding"]["acceptance_histogram"] == [0, 0, 0, 2]
    assert v["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 6

    for path in (aiperf, vllm):
        cmp = compare_sides(load_side(run), load_side(path))
        assert cmp.exit_code == 0, format_text(cmp)
        tree = next(r for r in cmp.rows if r["label"] == "tree")
        assert (tree["tau_base"], tree["draft_acceptance_rate_base"]) == pytest.approx(
            (tree["tau_new"], tree["draft_acceptance_rate_new"]))
        assert tree["draft_acceptance_rate_new"] == pytest.approx(11 / 15) and tree["turns_compared"] == 3
        assert cmp.warnings == []  # an export carries no configuration: nothing to say differs
        back = compare_sides(load_side(path), load_side(run))
        assert back.exit_code == 0, format_text(back)


def test_an_engine_export_without_draftbench_lists_reads_its_per_step_arrays(tmp_path):
    """A vLLM line whose request lacks the per-step lists takes them (and the counts) from the engine's arrays."""
    run = write_run(tmp_path)
    line = json.loads(export_run(run, "vllm").read_text().splitlines()[1])
    for key in ("accepted_drafts", "draft_depths"):
        del line["request"][key]
    path = tmp_path / "engine.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (rec,), provenance = read_export(path)
    assert (rec["accepted_drafts"], rec["draft_depths"]) == ([3, 3], [4, 5])
    assert rec["engine_counters"]["accepted_tokens"] == 6 and provenance["target"] == {"name": "tiny",
                                                                                       "dtype": "float32"}
    del line["request"]["wall_time_s"]
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"engine.jsonl:1: request lacks field\(s\) \['wall_time_s'\]"):
        read_export(path)


def test_export_command_writes_the_file(tmp_path, capsys):
    run = write_run(tmp_path)
    assert main(["export", str(run), "--format", "vllm"]) == 0
    assert capsys.readouterr().out.strip() == f"export: {run / 'exports' / 'vllm.jsonl'}"


def test_the_report_shows_the_acceptance_table(tmp_path):
    """summary.md gains one row per drafting method (vanilla, which never drafts, has none); τ counts the emitted
    tokens (16 in 9 forwards), the rest the verdicts before the cut."""
    paths = write_report(write_run(tmp_path))
    md = paths["summary_md"].read_text()
    assert "| tree | harness | s1 | 0 | 1.78 | 3.75 | 0.733 | 3.75 | 2 |" in md
    assert "| vanilla | harness | s1 |" not in md
    assert f"- harness: {HARNESS_ACCEPTANCE}" in md  # what the harness's counts count, said once under the table
    assert paths["plot_accept_hist"].exists()


def test_each_engine_says_what_its_acceptance_counts():
    """The summary names each label's engine and what its acceptance counts (vLLM: drafting steps only; SGLang:
    every verification forward), so two engines' 'mean acceptance length' are not read as one convention: were the
    phrase lost, an SGLang row and a vLLM row would look alike; were a vLLM vanilla row given the harness's phrase,
    a row that never drafted would claim a counting rule."""
    vllm_src, sglang_src = acceptance_source("vllm", None), acceptance_source("openai", "sglang")
    assert vllm_src.startswith("vLLM's spec-decode counters") and "drafting steps only" in vllm_src
    assert "every verification forward" in sglang_src
    assert acceptance_source("openai", "trtllm-serve").endswith("per position n/a")  # the server kind's own name
    assert acceptance_source("openai", None) == "the server's own counters (server kind unknown)"
    recs = [spec("tree", "1", EOS), record("vanilla", "1", 0, 1.0, [1] * 6)]
    for label, engine, source in (("vllm-vanilla", "vllm", None), ("vllm-eagle3", "vllm", vllm_src),
                                  ("sgl-eagle3", "openai", sglang_src)):
        rec = spec(label, "1", EOS) if source else record(label, "1", 0, 1.0, [1] * 6)
        recs.append({**rec, "engine": engine, "engine_acceptance": source})
    summary = summary_table(turns_table(recs)).set_index("label")
    assert summary["engine"].to_dict() == {"tree": "harness", "vanilla": "harness", "vllm-vanilla": "vllm",
                                           "vllm-eagle3": "vllm", "sgl-eagle3": "openai"}
    assert summary["acceptance_from"].dropna().to_dict() == {"tree": HARNESS_ACCEPTANCE, "vanilla": HARNESS_ACCEPTANCE,
                                                             "vllm-eagle3": vllm_src, "sgl-eagle3": sglang_src}
    md = acceptance_markdown(summary.reset_index())
    assert "| vllm-eagle3 | vllm | s1 | 0 |" in md and "| sgl-eagle3 | openai | s1 | 0 |" in md
    assert f"- vllm: {vllm_src}" in md and f"- openai: {sglang_src}" in md and "vllm-vanilla" not in md
