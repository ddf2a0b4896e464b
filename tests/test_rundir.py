"""The run directory's owner (harness/measure/rundir.py): atomic writes, the one manifest reader and its errors."""

import json
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
