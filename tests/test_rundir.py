"""The run directory's owner (harness/measure/rundir.py): atomic writes, the one manifest reader and its errors."""

import json
import os
from pathlib import Path

import pytest

from harness.measure import rundir
from harness.measure.rundir import ManifestError, read_manifest, write_manifest, write_text_atomic


def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old")
    write_text_atomic(path, "new text")
    assert path.read_text() == "new text"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temporary file left behind


def test_a_failed_atomic_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    """A write that fails half-way (here: os.replace refused after the temporary file was written) must leave the old
    file whole and no temporary file; else a reader could see half a manifest, or the folder fill with debris."""
    path = tmp_path / "manifest.json"
    path.write_text('{"run_id": "old"}')

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rundir.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, '{"run_id": "new"')
    assert path.read_text() == '{"run_id": "old"}'
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_manifest_round_trip_is_strict_json(tmp_path):
    """NaN is not JSON (other tools refuse the file): it is written as null; other values (a path) as text."""
    write_manifest(tmp_path, {"run_id": "r", "score": float("nan"), "source": Path("q.jsonl")})
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"run_id": "r", "score": None, "source": "q.jsonl"}
    assert read_manifest(tmp_path) == {"run_id": "r", "score": None, "source": "q.jsonl"}


def test_a_missing_manifest_is_none(tmp_path):
    """Missing is not an error at this level: report goes on without provenance, resume refuses (their choice)."""
    assert read_manifest(tmp_path) is None


@pytest.mark.parametrize("text, detail", [
    ("{truncated", "Expecting property name"),
    ("[1, 2]", "expected a JSON object, got list"),
    (b"\xff\xfe", "codec can't decode"),
])
def test_an_invalid_manifest_names_its_path(tmp_path, text, detail):
    """json's bare "Expecting value: line 1 column 1" says nothing about which file: the error starts with the path."""
    path = tmp_path / "manifest.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ManifestError) as e:
        read_manifest(tmp_path)
    assert str(e.value).startswith(f"{path}: corrupt manifest: ") and detail in str(e.value)


def test_records_files_are_named_here():
    assert rundir.records_file_name() == "records.jsonl" and rundir.records_file_name(1) == "records.rank1.jsonl"


def test_a_writer_that_fails_inside_atomic_file_leaves_the_old_file(tmp_path):
    """Report files (CSV, parquet, PNG, HTML) go through atomic_file: a kill while one was written left a truncated
    report.html. A failure (or Ctrl-C) in the middle must leave the old file whole and no temporary file."""
    from harness.measure.rundir import atomic_file

    path = tmp_path / "report.html"
    path.write_text("old page")
    with pytest.raises(KeyboardInterrupt), atomic_file(path) as tmp:
        assert tmp.suffix == ".html" and tmp.parent == tmp_path  # same folder, same format suffix
        tmp.write_text("half a pa")
        raise KeyboardInterrupt
    assert path.read_text() == "old page" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    with atomic_file(path) as tmp:
        tmp.write_text("new page")
    assert path.read_text() == "new page" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


# a run folder turned against its owner (runs are shared as CI artefacts): nothing outside it is written, nothing
# that is not a regular file is read

def test_resume_does_not_truncate_the_file_a_linked_lock_points_to(tmp_path):
    """`.lock` as a symbolic link to a file of the owner's: taking the lock truncated and overwrote that file. It
    must be refused by name and the file left as it was."""
    from harness.measure.rundir import RunFileError, RunLock

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(RunFileError, match=r"\.lock: a symbolic link to .*notes\.txt; draftbench writes only"):
        RunLock(run).acquire()
    assert victim.read_text() == "my notes"


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_records_are_never_appended_to_a_file_outside_the_run(tmp_path, how):
    """records.jsonl as a symbolic or hard link to another file: the resume repaired (truncated) that file's "torn
    tail" and appended records to it. Both must be refused, naming the file, and the other file left whole."""
    from harness.measure.records import RecordStore
    from harness.measure.rundir import RunFileError

    victim = tmp_path / "script.sh"
    victim.write_text("echo unfinished")  # no newline at the end: a "torn" last line
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").symlink_to(victim) if how == "symlink" else (run / "records.jsonl").hardlink_to(victim)
    with pytest.raises(RunFileError, match=r"records\.jsonl: a (symbolic link|regular file with 2 hard links)"):
        RecordStore(run).append([{"label": "x"}])
    assert victim.read_text() == "echo unfinished"


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a FIFO (named pipe), not a regular file"),
    (lambda p: p.mkdir(), "a directory, not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "a symbolic link to /dev/zero, not a file of the run folder"),
])
def test_report_refuses_a_records_file_that_is_no_regular_file_in_one_line(tmp_path, make, kind):
    """A FIFO as records.jsonl made `report` block for ever, a link to /dev/zero read without end (memory), a
    directory gave a bare "[Errno 21] Is a directory": one error naming the file and what it is, at once."""
    from harness.measure.records import load_records
    from harness.measure.rundir import RunFileError

    make(tmp_path / "records.jsonl")
    with pytest.raises(RunFileError) as e:
        load_records(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'records.jsonl'}: {kind}")


def test_a_manifest_linked_outside_the_run_is_not_read_but_one_inside_is(tmp_path):
    """manifest.json as a link to a file elsewhere made `report` print that file's content as the run's
    provenance: a link out of the run folder is refused; a link to a file of the folder itself is read."""
    from harness.measure.rundir import RunFileError

    elsewhere = tmp_path / "secret.json"
    elsewhere.write_text('{"run_id": "secret"}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").symlink_to(elsewhere)
    with pytest.raises(RunFileError, match="not a file of the run folder"):
        read_manifest(run)
    (run / "manifest.json").unlink()
    (run / "manifest.v1.json").write_text('{"run_id": "run"}')
    (run / "manifest.json").symlink_to("manifest.v1.json")
    assert read_manifest(run) == {"run_id": "run"}


def test_report_files_follow_the_umask(tmp_path):
    """Every report file came out 0600 whatever the umask (the temporary file's mode): a CI artefact or a shared
    results folder could not be read by the team. A written file must get 0666 less the umask."""
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "summary.md", "table")
    finally:
        os.umask(old)
    assert (tmp_path / "summary.md").stat().st_mode & 0o777 == 0o644


def test_report_does_not_write_through_a_linked_tables_folder(tmp_path):
    """tables/ as a symbolic link to another folder: `report` wrote its CSV and parquet files into that folder. It
    must refuse by name and write nothing there."""
    from harness.report.report import write_report

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    rec = {"run_id": "run", "status": "ok", "label": "vanilla", "suite": "s", "question_id": "1", "turn": 0,
           "question_turns": 1, "temperature": 0.0, "seed": 0, "repeat": 0, "new_tokens": 2, "steps": 2,
           "accept_lengths": [1, 1], "wall_time_s": 1.0}
    (run / "records.jsonl").write_text(json.dumps(rec) + "\n")
    (run / "tables").symlink_to(elsewhere)
    with pytest.raises(ValueError, match=r"tables: a symbolic link to .*elsewhere, not a folder of the run"):
        write_report(run)
    assert list(elsewhere.iterdir()) == []


def test_names_read_from_records_never_lead_a_plot_out_of_the_run(tmp_path):
    """An ablation plot is named after the records' method: a method "../../../escaped" wrote
    ablation_../../../escaped_mode.png three folders up, outside the run. Every plot must land in the run's plots/."""
    from harness.report.report import write_report
    from tests.support.ablation_run import RECORDS, write_run

    hostile = [{**r, "method": "../../../escaped"} if r["method"] == "jakiro" else r for r in RECORDS]
    run = write_run(tmp_path / "a" / "b" / "c", hostile)
    written = write_report(run)
    plots = [p for name, p in written.items() if name.startswith("plot_ablation")]
    assert plots and all(p.parent == run / "plots" for p in plots)
    assert sorted(p.name for p in tmp_path.rglob("*.png") if p.parent != run / "plots") == []


def test_export_does_not_write_through_a_linked_exports_folder(tmp_path):
    """exports/ as a symbolic link to another folder: `draftbench export` wrote its file there. It must refuse by
    name and write nothing there."""
    from harness.gate.baseline import export_run
    from tests.support.ablation_run import write_run

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = write_run(tmp_path)
    (run / "exports").symlink_to(elsewhere)
    with pytest.raises(ValueError, match=r"exports: a symbolic link to .*elsewhere, not a folder of the run"):
        export_run(run, "vllm")
    assert list(elsewhere.iterdir()) == []
