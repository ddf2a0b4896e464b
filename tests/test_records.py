"""Reading records: a corrupt line is named and skipped (never hides what follows), one attempt per question,
records are strict JSON."""

import json
import math

import pandas as pd
import pytest

# attributes are looked up when a test runs, so that each test fails on its own where a name is missing
from harness.measure import records as R
from harness.measure.records import RecordStore, read_records


def turn(qid, turn, attempt, n_turns=2, label="vanilla", **extra):
    """The smallest valid measured turn (two tokens in two forwards, 0.5 s)."""
    return {"label": label, "suite": "s", "question_id": qid, "temperature": 0.0, "seed": 0, "repeat": 0,
            "turn": turn, "question_turns": n_turns, "attempt": attempt, "status": "ok", "new_tokens": 2,
            "steps": 2, "accept_lengths": [1, 1], "wall_time_s": 0.5, **extra}


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_corrupt_middle_line_is_named_and_the_lines_after_it_are_read(tmp_path):
    """A bad line in the middle must cost that line only: stopping there hid 12 of 16 turns from the report and
    made every resume re-run them. The warning must name file:line."""
    recs = [turn("1", 0, "a"), turn("1", 1, "a"), turn("2", 0, "b"), turn("2", 1, "b")]
    lines = [json.dumps(r).encode() for r in recs]
    path = write_lines(tmp_path / "records.jsonl", [lines[0], b'{"label": "vanilla", "suite": GARBAGE', *lines[1:]])
    with pytest.warns(R.CorruptRecordWarning, match=r"records\.jsonl:2: not valid JSON"):
        found = R.load_records(tmp_path)
    assert found.records == recs
    assert found.bad_lines == [f"{path}:2: not valid JSON (Expecting value at column 31)"]


def test_undecodable_and_non_object_lines_are_skipped_too(tmp_path):
    """Bytes that are not UTF-8 (a disk error) or a JSON value that is not an object are bad lines as well; the first
    used to raise UnicodeDecodeError and lose the whole run's records."""
    recs = [turn("1", 0, "a", n_turns=1), turn("2", 0, "b", n_turns=1)]
    write_lines(tmp_path / "records.jsonl", [json.dumps(recs[0]).encode(), b"\xff\xfe{}", b"[1, 2]",
                                             json.dumps(recs[1]).encode()])
    with pytest.warns(R.CorruptRecordWarning) as caught:
        found = R.load_records(tmp_path)
    assert found.records == recs
    assert [b.split(": ", 1)[1] for b in found.bad_lines] == ["not UTF-8 text", "a JSON list, not a record object"]
    assert len(caught) == 2


def test_torn_last_line_is_ignored_silently(tmp_path, recwarn):
    """The half-written last line of a killed run is expected, not corruption: no warning, no bad line."""
    rec = turn("1", 0, "a", n_turns=1)
    (tmp_path / "records.jsonl").write_text(json.dumps(rec) + "\n" + '{"label": "vani')
    found = R.load_records(tmp_path)
    assert found.records == [rec] and found.bad_lines == []
    assert not [w for w in recwarn if issubclass(w.category, R.CorruptRecordWarning)]


def test_a_whole_last_record_without_its_newline_is_kept_on_repair(tmp_path):
    """A kill just before the final newline leaves a whole record: repairing the tail must keep it (add the newline),
    not cut it off."""
    rec = turn("1", 0, "a", n_turns=1)
    (tmp_path / "records.jsonl").write_text(json.dumps(rec))
    store = RecordStore(tmp_path)
    assert store.path.read_text() == json.dumps(rec) + "\n"
    assert store.read() == [rec]


def test_latest_complete_attempt_wins_and_partial_attempts_are_superseded(tmp_path):
    """A question re-run after a partial attempt must be counted once: the complete attempt, not both."""
    partial = turn("1", 0, "old", timestamp="2025-01-01T00:00:01+00:00")
    full = [turn("1", 0, "new", timestamp="2025-01-01T00:01:00+00:00"),
            turn("1", 1, "new", timestamp="2025-01-01T00:01:01+00:00")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [partial, *full]))
    found = R.load_records(tmp_path)
    assert found.records == full and found.superseded == 1
    assert len(found.complete) == 1 and not found.incomplete


def test_attempts_split_across_rank_files_are_resolved(tmp_path):
    """Data-parallel runs: the partial attempt may be in records.rank1.jsonl and its re-run in records.rank0.jsonl
    (a resume with another process count); the complete one is kept whichever file it is in."""
    full = [turn("1", 0, "new"), turn("1", 1, "new")]
    (tmp_path / "records.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))
    (tmp_path / "records.rank1.jsonl").write_text(json.dumps(turn("1", 0, "old")) + "\n")
    assert read_records(tmp_path) == full


def test_incomplete_question_is_reported_and_expected_turns_override_the_records(tmp_path):
    """A question with a turn missing is incomplete (a resume must re-run it); the runner's turn counts from the
    suite win over the records' own, and old records without question_turns use the highest turn seen."""
    recs = [turn("1", 0, "a"), {k: v for k, v in turn("2", 0, None, label="x").items() if k != "question_turns"},
            turn("2", 1, None, label="y"), turn("2", 0, None, label="y")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    found = R.load_records(tmp_path)
    key = ("vanilla", "s", "1", 0.0, 0, 0)
    assert found.incomplete == {key, ("x", "s", "2", 0.0, 0, 0)}
    assert found.complete == {("y", "s", "2", 0.0, 0, 0)}
    assert key in R.load_records(tmp_path, {("s", "1"): 1}).complete
    assert RecordStore(tmp_path).done_keys() == {("y", "s", "2", 0.0, 0, 0)}


def test_non_finite_numbers_are_written_as_null(tmp_path):
    """Records must be strict JSON: NaN / Infinity are not JSON and other tools refuse the file."""
    store = RecordStore(tmp_path)
    store.append([{"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": float("-inf")}}])

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    assert json.loads(store.path.read_text(), parse_constant=refuse) == {"a": None, "b": [1.5, None],
                                                                         "c": {"d": None}}


# what the report makes of them

def measured(qid, turn, n_turns, new=4, wall=1.0, **extra):
    """A full ok turn record of label vanilla on suite s at temperature 0 (tokens/s = new / wall)."""
    return {"run_id": "r", "status": "ok", "error": None, "attempt": f"a{qid}", "method": "vanilla",
            "label": "vanilla", "lossless": True, "method_options": {}, "suite": "s", "suite_version": "1",
            "question_id": qid, "category": None, "turn": turn, "question_turns": n_turns, "target": "tiny",
            "dtype": "float32", "device": "cpu", "temperature": 0.0, "top_p": 1.0, "seed": 0, "repeat": 0,
            "prompt_tokens": 3, "new_tokens": new, "steps": new, "accept_lengths": [1] * new, "accepted_drafts": [],
            "draft_depths": [], "wall_time_s": wall, "prefill_time_s": 0.1, "stop_reason": "eos",
            "output_text": "x", "output_ids": [5] * new, "rss_bytes": 1, "peak_rss_bytes": 1,
            "cuda_peak_allocated_bytes": None, "cuda_peak_reserved_bytes": None, "nvml_used_bytes": None,
            "energy_j": None, "mean_power_w": None, "timings": {}, "counters": {}, "score": None,
            "score_name": None, "score_error": None, "timestamp": "2025-01-01T00:00:00+00:00", **extra}


def test_report_counts_every_question_after_a_corrupt_line_and_names_the_line(tmp_path):
    """Four one-turn questions with a corrupt line after the first: the report must measure all four (it showed 1)
    and say in summary.md which line it skipped."""
    from harness.report.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "run", "config": {"baseline": "vanilla"}}))
    lines = [json.dumps(measured(str(q), 0, 1)).encode() for q in range(1, 5)]
    write_lines(run / "records.jsonl", [lines[0], b"\x00\x00\x00", *lines[1:]])
    with pytest.warns(R.CorruptRecordWarning, match="records.jsonl:2"):
        paths = write_report(run)
    summary = pd.read_csv(paths["summary_csv"])
    assert summary.loc[0, "n_questions"] == 4
    assert "- records: 1 bad line skipped (records.jsonl:2; the warnings say why)" in paths["summary_md"].read_text()


def test_report_leaves_out_an_incomplete_question(tmp_path):
    """q2 has turn 0 of its two turns: measuring it would mix a half question into the means (q1: 8 tokens in
    2 s = 4 tok/s; q2's lone turn 4 tokens in 0.1 s would lift the mean to 22)."""
    from harness.report.tables import summary_table, turns_table

    recs = [measured("1", 0, 2), measured("1", 1, 2, wall=1.0), measured("2", 0, 2, wall=0.1)]
    row = summary_table(turns_table(recs)).iloc[0]
    assert (row["n_questions"], row["n_turns"], row["n_incomplete"]) == (1, 2, 1)
    assert row["tokens_per_s"] == pytest.approx(4.0)


def test_quality_is_not_averaged_over_the_answers_that_happened_to_score(tmp_path):
    """q1 scored 1.0 and q2's scorer failed: a quality of 1.0 would hide the failure; it must be NaN, with the
    failure counted and q2 still measured for speed (its generation is fine)."""
    from harness.report.tables import questions_table, summary_table, turns_table

    recs = [measured("1", 0, 1, score=1.0, score_name="exact"),
            measured("2", 0, 1, score_name="exact", score_error="RuntimeError: scorer exploded")]
    turns = turns_table(recs)
    row = summary_table(turns).iloc[0]
    assert math.isnan(row["quality"]) and row["n_score_errors"] == 1 and row["n_questions"] == 2
    questions = questions_table(turns).set_index("question_id")
    assert questions.loc["1", "score"] == 1.0 and math.isnan(questions.loc["2", "score"])


# hand-broken records: each is one named line, never a traceback, a silent drop or a row of nan

BROKEN = [  # (what is changed in question 2's record, the reason the reader must give)
    ({"wall_time_s": 0}, "wall_time_s: expected a number >= 1e-09, got 0"),
    ({"wall_time_s": -1.5}, "wall_time_s: expected a number >= 1e-09, got -1.5"),
    ({"wall_time_s": float("nan")}, "wall_time_s: expected a number >= 1e-09, got NaN"),
    ({"wall_time_s": "1.5"}, 'wall_time_s: expected a number >= 1e-09, got "1.5"'),
    ({"wall_time_s": 5e-324}, "wall_time_s: expected a number >= 1e-09, got 5e-324"),  # gave tokens/s = inf
    ({"seed": 2**64}, "seed: 18446744073709551616 does not fit a 64-bit integer"),  # OverflowError writing parquet
    ({"output_ids": [5, 5, 5, 2**70]}, "output_ids: 1180591620717411303424 does not fit a 64-bit integer"),
    ({"energy_j": float("inf")}, "energy_j: inf is not a JSON number"),
    ({"timings": {"draft_s": float("nan")}}, "timings: nan is not a JSON number"),
    ({"label": None}, "label: expected a non-empty string, got null"),
    ({"temperature": "0"}, 'temperature: expected a number >= 0, got "0"'),
    ({"accept_lengths": None}, "accept_lengths: expected a list of integers >= 0, got null"),
    ({"output_ids": [5, 5]}, "output_ids: expected a list of new_tokens = 4 ids, got 2 ids"),
    ({"steps": 0, "accept_lengths": []}, "accept_lengths: sums to 0 but new_tokens is 4"),
    ({"steps": 3}, "steps: is 3 but accept_lengths has 4 entries"),
    ({"new_tokens": "4"}, 'new_tokens: expected an integer >= 0, got "4"'),
    ({"attempt": ["a"]}, 'attempt: expected a string, got ["a"]'),
    ({"status": "done"}, 'status: expected one of \'ok\', \'error\', got "done"'),
    ({"turn": -1}, "turn: expected an integer >= 0, got -1"),
    ({"question_id": None}, "question_id: expected a string or an integer, got null"),
    ({"prefill_time_s": -0.5}, "prefill_time_s: expected a number >= 0, got -0.5"),
    ({"suite": ""}, 'suite: expected a non-empty string, got ""'),
]


@pytest.mark.parametrize("change, reason", BROKEN, ids=[r.split(":")[0] + "-" + str(i) for i, (_, r) in
                                                         enumerate(BROKEN)])
def test_a_hand_broken_record_is_one_named_line_and_the_report_still_runs(tmp_path, change, reason):
    """Each of these used to end in a traceback, a silently dropped question (changing the other labels' speed-ups
    with no note), a row labelled nan, or counters that contradict each other passing unnoticed."""
    from harness.report.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "run", "config": {"baseline": "vanilla"}}))
    recs = [measured(str(q), 0, 1) for q in (1, 2, 3)]
    recs[1].update(change)
    write_lines(run / "records.jsonl", [json.dumps(r).encode() for r in recs])
    with pytest.warns(R.CorruptRecordWarning, match=r"records\.jsonl:2: "):
        found = R.load_records(run)
    assert found.bad_lines == [f"{run / 'records.jsonl'}:2: {reason}"]
    assert [r["question_id"] for r in found.records] == ["1", "3"]
    with pytest.warns(R.CorruptRecordWarning):
        paths = write_report(run)
    summary = pd.read_csv(paths["summary_csv"])
    assert summary["label"].tolist() == ["vanilla"] and summary.loc[0, "n_questions"] == 2
    assert "records.jsonl:2" in paths["summary_md"].read_text()


def test_a_line_that_is_no_record_at_all_is_named(tmp_path):
    """An extra {"foo": 1} line is not a record: it used to enter the tables and end in a traceback."""
    write_lines(tmp_path / "records.jsonl", [json.dumps(measured("1", 0, 1)).encode(), b'{"foo": 1}'])
    with pytest.warns(R.CorruptRecordWarning, match="records.jsonl:2: label: missing"):
        found = R.load_records(tmp_path)
    assert len(found.records) == 1 and len(found.complete) == 1


def test_a_line_written_twice_is_a_duplicate_not_an_incomplete_question(tmp_path):
    """A duplicated line made its question look incomplete (two records of one turn): the later copy is kept, the
    question is complete, and the earlier copy is named."""
    line = json.dumps(measured("1", 0, 1)).encode()
    path = write_lines(tmp_path / "records.jsonl", [line, line])
    with pytest.warns(R.CorruptRecordWarning, match="duplicate"):
        found = R.load_records(tmp_path)
    assert len(found.records) == 1 and found.complete and not found.incomplete
    assert found.bad_lines == [f"{path}:1: duplicate of turn 0 of attempt a1 (a later copy at {path}:2 is kept)"]


def test_an_entry_whose_every_turn_failed_is_named_with_its_first_error():
    """A run where every turn of one entry is an error record measured nothing for it: the run must not pass as a
    success (temperature 1e-40 made every turn an error and the run exited 0)."""
    recs = [turn("1", 0, "a"), turn("1", 0, "b", label="eagle2", status="error", error="ValueError: nan"),
            turn("2", 0, "c", label="eagle2", status="error", error="ValueError: other"),
            turn("2", 0, "d", label="pld", status="error", error="OOM"), turn("3", 0, "e", label="pld")]
    assert R.failed_entries(recs) == {"eagle2": "ValueError: nan"}


def test_an_engine_entry_is_measured_against_the_same_engines_vanilla():
    """vLLM's ngram must be held against vLLM's vanilla (the same engine without speculation), not against the
    harness's vanilla: their speeds come from different engines. An engine with no vanilla of its own, or with two,
    falls back to the run's baseline; the harness's own entries are unchanged."""
    turns = pd.DataFrame({
        "label": ["vanilla", "pld", "vllm-vanilla", "vllm-ngram", "served-eagle3"],
        "method": ["vanilla", "pld", "vanilla", "pld", "eagle3"],
        "runtime": ["eager"] * 5,
        "engine": [None, None, "vllm", "vllm", "openai"],
    })
    assert R.baseline_labels(turns) == {"vanilla": "vanilla", "pld": "vanilla", "vllm-vanilla": "vllm-vanilla",
                                        "vllm-ngram": "vllm-vanilla", "served-eagle3": "vanilla"}
    two = pd.concat([turns, pd.DataFrame({"label": ["vllm-vanilla-2"], "method": ["vanilla"], "runtime": ["eager"],
                                          "engine": ["vllm"]})], ignore_index=True)
    assert R.baseline_labels(two)["vllm-ngram"] == "vanilla"


def test_a_lone_surrogate_or_nul_in_a_turns_text_is_stored_and_read_back(tmp_path):
    """A lone surrogate ("\\ud800", which a tokenizer or a server can emit) made the append raise UnicodeEncodeError:
    the run aborted with the turn lost, and failed again on every resume. It must be stored (escaped, the line stays
    UTF-8) and read back as text every table can hold; a NUL comes back as it was."""
    RecordStore(tmp_path).append([turn("1", 0, "a", n_turns=1, output_text="a\ud800b\x00c")])
    assert (tmp_path / "records.jsonl").read_bytes().decode("utf-8").count("\\ud800") == 1
    assert [r["output_text"] for r in read_records(tmp_path)] == ["a\\ud800b\x00c"]


def test_a_record_holding_a_lone_surrogate_does_not_stop_the_report(tmp_path):
    """A record whose text held an escaped lone surrogate made `report` (and `compare`) refuse the whole run with
    "'utf-8' codec can't encode character '\\ud800'": the report must be built and show the text escaped."""
    from harness.report.report import write_report

    write_lines(tmp_path / "records.jsonl", [json.dumps(measured("1", 0, 1, output_text="x\ud800")).encode()])
    paths = write_report(tmp_path)
    assert pd.read_parquet(paths["turns_parquet"])["output_text"].tolist() == ["x\\ud800"]


def test_a_key_given_twice_in_a_record_is_named(tmp_path):
    """{"wall_time_s": 0.5, "wall_time_s": 0} was read as its last copy without a word: which one was measured? The
    line is named and skipped."""
    text = json.dumps(measured("1", 0, 1))[:-1] + ', "wall_time_s": 0.25}'
    path = write_lines(tmp_path / "records.jsonl", [text.encode()])
    with pytest.warns(R.CorruptRecordWarning, match="given twice"):
        found = R.load_records(tmp_path)
    assert found.records == [] and found.bad_lines == [f"{path}:1: not strict JSON (key 'wall_time_s' given twice)"]


def test_records_of_another_run_appended_to_a_run_are_named_and_left_out(tmp_path):
    """Lines of another run's records.jsonl appended to this run's were used silently, as if measured here: each is
    named with both run ids and left out of the tables."""
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "mine"}))
    path = write_lines(tmp_path / "records.jsonl", [json.dumps(measured("1", 0, 1, run_id="mine")).encode(),
                                                    json.dumps(measured("2", 0, 1, run_id="theirs")).encode()])
    with pytest.warns(R.CorruptRecordWarning, match="another run"):
        found = R.load_records(tmp_path)
    assert [r["question_id"] for r in found.records] == ["1"]
    assert found.bad_lines == [f'{path}:2: run_id: "theirs" is another run\'s (this run is "mine"); record left out']


def test_without_a_manifest_the_run_most_records_belong_to_is_the_run(tmp_path):
    """A run directory without its manifest still has one run: the run id most records carry; a stray record of
    another run is named, not counted."""
    lines = [json.dumps(measured(str(q), 0, 1, run_id="mine")).encode() for q in (1, 2)]
    write_lines(tmp_path / "records.jsonl", [json.dumps(measured("3", 0, 1, run_id="theirs")).encode(), *lines])
    with pytest.warns(R.CorruptRecordWarning, match='"theirs" is another run'):
        found = R.load_records(tmp_path)
    assert [r["question_id"] for r in found.records] == ["1", "2"]
