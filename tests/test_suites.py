"""suites: YAML definitions, loading with checksums and counts, selection, user files, errors and fetching."""

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from harness import registry
from harness.run import suites
from harness.run.suites import (
    DataError,
    Question,
    Suite,
    fetch_suite,
    load_suite,
    parse_record,
    suite_info,
    suite_names,
)

REPO = Path(__file__).resolve().parents[1]
BUILTIN = REPO / "suites"  # the built-in suite definitions
SHARED_DATA = Path(os.environ.get("DRAFTBENCH_DATA") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (SHARED_DATA / "eagle").is_dir(),
                                reason=f"shared evaluation data not found at {SHARED_DATA} (set DRAFTBENCH_DATA)")

EXPECTED = {  # name -> (records, sha256, first question_id), from shared/data/README.md
    "alpaca": (80, "8ad3e5a7fc61b88d8e25edb81a52a2ce00a04494d5694c122cb11a5cc26a00df", "0"),
    "cnn_dm": (80, "916876f0c42f938a944de96eed16e51425f29f27438cca5c9ef4737c0fedf771", "241"),
    "gsm8k": (80, "a55920b2f2aac724241124c59e5b8e8168dbbeb2ab0fdbee17d5b0ab6db5ff27", "0"),
    "humaneval": (80, "ce0244e2b228339e9a11afc63a151719beede1e389fdaec7cd9751d33902180e", "0"),
    "mt_bench": (80, "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", "81"),
    "nq": (80, "04252e41ab00bcc03b11940b4a3766cf40ae0b76a09c4f56968ba952f0b029f3", "321"),
}


@pytest.fixture
def data_env(monkeypatch):
    monkeypatch.setenv(suites.DATA_ENV, str(SHARED_DATA))


def test_suite_names_are_the_yaml_files():
    """Discovery is a sorted glob; a missing YAML would silently drop a suite from `draftbench suites`."""
    assert suite_names() == ["alpaca", "cnn_dm", "gsm8k", "humaneval", "long_context", "mt_bench", "nq", "spec_bench",
                             "speed_bench_qualitative", "speed_bench_throughput_16k", "speed_bench_throughput_1k",
                             "speed_bench_throughput_2k", "speed_bench_throughput_32k", "speed_bench_throughput_8k",
                             "tiny"]


@pytest.mark.parametrize("name", ["alpaca", "cnn_dm", "gsm8k", "humaneval", "long_context", "mt_bench", "nq",
                                  "spec_bench", "speed_bench_qualitative", "speed_bench_throughput_8k", "tiny"])
def test_every_yaml_is_valid(name):
    """Each YAML must carry every field with a string version, or result rows lose their provenance."""
    info = suite_info(name)
    assert set(suites.SUITE_FIELDS) <= set(info) and isinstance(info["version"], str)
    assert info["bundled"] == (name == "tiny")


@needs_data
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_every_shared_suite(name, data_env):
    """Counts, checksums and ids of the six paper suites; two files lack a final newline and must still give 80."""
    records, sha, first_id = EXPECTED[name]
    suite = load_suite(name)
    assert (len(suite), suite.sha256, suite.questions[0].question_id, suite.version) == (records, sha, first_id, "1")
    assert suite.source == str(SHARED_DATA / suite_info(name)["file"])
    assert len({q.question_id for q in suite.questions}) == records


@needs_data
def test_long_context_loads_its_buckets(data_env):
    """The shipped long-context suite: 4 prompts at each of 5 lengths under the default model's 8,192 positions,
    its documents the 80 CNN/DM articles without their "Summarize: " instruction, known by a digest of file and
    recipe (not the cnn_dm file's own, which would let a recipe change pass a resume check)."""
    suite = load_suite("long_context")
    assert suite.context.buckets == (512, 1024, 2048, 4096, 7168) and len(suite) == 20
    assert suite.questions[5].question_id == "1024-1" and suite.questions[5].context == {"bucket": 1024, "prompt": 1}
    assert len(suite.documents) == 80 and suite.documents[0][0] == "241"
    assert suite.documents[0][1].startswith("Hillary Clinton")
    assert suite.sha256 != EXPECTED["cnn_dm"][1] and len(suite.sha256) == 64


@needs_data
def test_mt_bench_has_80_two_turn_questions(data_env):
    """MT-bench's second turn is half the benchmark; losing it would halve the measured tokens."""
    suite = load_suite("mt_bench")
    assert len(suite) == 80 and all(len(q.turns) == 2 for q in suite.questions)
    assert suite.questions[0].category == "writing" and suite.scorer is None


@needs_data
def test_scorers_are_attached(data_env):
    """The scorer named in the YAML must reach the Suite, or quality is never measured."""
    assert load_suite("gsm8k").scorer == "gsm8k_exact_match"
    assert load_suite("humaneval").scorer == "humaneval_pass_at_1"


def test_tiny_is_bundled_and_needs_no_data_dir(monkeypatch):
    """The smoke suite must load with no DRAFTBENCH_DATA (CI, a fresh clone) and keep its checksum consistent."""
    monkeypatch.delenv(suites.DATA_ENV, raising=False)
    suite = load_suite("tiny")
    assert [q.question_id for q in suite.questions] == ["1", "2", "3", "4"]
    assert [len(q.turns) for q in suite.questions] == [1, 1, 1, 2]
    assert suite.sha256 == hashlib.sha256((BUILTIN / "data" / "tiny.jsonl").read_bytes()).hexdigest()


def test_select_limit_and_ids_keep_file_order():
    """question_ids keep file order (not the caller's), limit applies afterwards, and the original is untouched."""
    suite = load_suite("tiny")
    assert [q.question_id for q in suite.select(limit=2).questions] == ["1", "2"]
    assert [q.question_id for q in suite.select(question_ids=["4", "2"]).questions] == ["2", "4"]
    assert [q.question_id for q in suite.select(limit=1, question_ids=[4, 3]).questions] == ["3"]
    assert len(suite) == 4 and suite.select().questions == suite.questions


def test_select_per_category_takes_the_first_of_every_category():
    """A stratified short run (``stratify: true``) must cover every category in file order: taking the first
    ``limit`` overall would run only Spec-Bench's first task (its first 80 rows are all MT-bench)."""
    qs = [Question(question_id=f"q{i}", category=c, turns=["t"]) for i, c in enumerate("aabba", start=1)]
    suite = dataclasses.replace(load_suite("tiny"), questions=qs)
    assert [q.question_id for q in suite.select(limit=1, per_category=True).questions] == ["q1", "q3"]
    assert [q.question_id for q in suite.select(limit=2, per_category=True).questions] == ["q1", "q2", "q3", "q4"]
    assert [q.question_id for q in suite.select(limit=2).questions] == ["q1", "q2"]


def test_select_unknown_id_lists_valid_ones():
    """A typo in --questions must say which ids exist rather than run an empty suite."""
    with pytest.raises(DataError, match=r"no question_id '99'.*1, 2, 3, 4 \(4 in all\)"):
        load_suite("tiny").select(question_ids=["99"])
    with pytest.raises(DataError, match="limit"):
        load_suite("tiny").select(limit=0)


def test_unknown_suite_suggests_close_names():
    """'mtbench' is a likely typo for 'mt_bench'; the error must say so."""
    with pytest.raises(DataError, match=r"unknown suite 'mtbench'\. Did you mean 'mt_bench'"):
        load_suite("mtbench")


def test_data_dir_unset_is_a_clear_error(monkeypatch):
    """Without the variable the user must be told which variable to set."""
    monkeypatch.delenv(suites.DATA_ENV, raising=False)
    with pytest.raises(DataError, match="DRAFTBENCH_DATA is not set"):
        load_suite("gsm8k")


def test_missing_file_names_path_source_and_fetch_command(tmp_path):
    """A missing file error must give the full expected path, where it comes from and how to get it."""
    with pytest.raises(DataError) as e:
        load_suite("gsm8k", data_dir=tmp_path)
    message = str(e.value)
    assert str(tmp_path / "eagle/gsm8k/question.jsonl") in message
    assert "https://raw.githubusercontent.com/SafeAILab/EAGLE/main/eagle/data/gsm8k/question.jsonl" in message
    assert "draftbench data fetch gsm8k" in message


@needs_data
def test_corrupted_copy_fails_the_checksum(tmp_path):
    """One changed byte must be caught, or results could silently come from a different question set."""
    dest = tmp_path / "eagle" / "gsm8k" / "question.jsonl"
    dest.parent.mkdir(parents=True)
    data = bytearray((SHARED_DATA / "eagle/gsm8k/question.jsonl").read_bytes())
    data[100] ^= 1
    dest.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"checksum mismatch .*expected sha256 a55920b2"):
        load_suite("gsm8k", data_dir=tmp_path)


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_user_jsonl_file(tmp_path):
    """A user file becomes suite '<stem>' version 'user' without a scorer; a missing final newline is fine."""
    path = _write_lines(tmp_path / "my_prompts.jsonl", [
        '{"question_id": 7, "category": "chat", "turns": ["Hi", "And again"]}',
        "",
        '{"question_id": "b", "turns": ["Bye"], "reference": ["Goodbye"]}',
    ])
    suite = load_suite(str(path))
    assert (suite.name, suite.version, suite.scorer) == ("my_prompts", "user", None)
    assert suite.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert suite.questions == [Question("7", "chat", ["Hi", "And again"], None),
                               Question("b", None, ["Bye"], ["Goodbye"])]


@pytest.mark.parametrize("lines, message", [
    (['{"question_id": 1, "turns": ["ok"]}', '{"question_id": 2, "turns": ['], r"bad\.jsonl:2: malformed JSON"),
    (['{"question_id": 1, "prompt": "hi"}'], r"bad\.jsonl:1: record 1 has no 'turns'"),
    (['{"question_id": 1, "turns": []}'], r"bad\.jsonl:1: 'turns' must be a non-empty list of strings"),
    (['{"turns": ["x"]}'], r"bad\.jsonl:1: record has no 'question_id'"),
    (['{"question_id": 1, "turns": ["a"]}', '{"question_id": "1", "turns": ["b"]}'],
     r"bad\.jsonl:2: duplicate question_id '1'"),
    (['[1, 2]'], r"bad\.jsonl:1: expected a JSON object"),
])
def test_malformed_user_file_errors_name_file_and_line(tmp_path, lines, message):
    """Every data error must point at the file and line to fix."""
    with pytest.raises(DataError, match=message):
        load_suite(str(_write_lines(tmp_path / "bad.jsonl", lines)))


def test_missing_user_file(tmp_path):
    """A path that does not exist must not be mistaken for an unknown suite name."""
    with pytest.raises(DataError, match="does not exist"):
        load_suite(str(tmp_path / "nope.jsonl"))


def test_wrong_record_count_is_caught(tmp_path, monkeypatch):
    """A YAML whose count disagrees with its (checksum-valid) file must fail loudly, not run a partial suite."""
    data = tmp_path / "q.jsonl"
    _write_lines(data, ['{"question_id": 1, "turns": ["a"]}', '{"question_id": 2, "turns": ["b"]}'])
    info = {**suite_info("tiny"), "bundled": False, "file": "q.jsonl",
            "sha256": hashlib.sha256(data.read_bytes()).hexdigest(), "records": 3}
    monkeypatch.setattr(suites, "suite_info", lambda name: info)
    with pytest.raises(DataError, match=r"has 2 records, expected 3"):
        load_suite("tiny", data_dir=tmp_path)


def test_parse_record_converts_ids_and_empty_category():
    """Integer ids become strings (record keys are strings) and Alpaca's empty category becomes None."""
    q = parse_record({"question_id": 81, "category": "", "turns": ["Hi"]}, "f:1")
    assert q == Question("81", None, ["Hi"], None)


def test_suite_yaml_validation(tmp_path, monkeypatch):
    """A typo in a YAML field must be reported rather than silently ignored."""
    bad = tmp_path / "broken.yaml"
    bad.write_text((BUILTIN / "tiny.yaml").read_text().replace("name: tiny", "name: broken")
                   .replace("licence:", "license:"))
    monkeypatch.setattr(registry, "_SUITE_DIRS", [tmp_path])
    with pytest.raises(DataError, match=r"broken\.yaml: missing field\(s\) licence"):
        suite_info("broken")


@needs_data
def test_fetch_suite_downloads_and_verifies(tmp_path):
    """fetch_suite must save a verified file that load_suite then accepts (file:// stands in for the network)."""
    source = (SHARED_DATA / "eagle/qa/question.jsonl").as_uri()
    path = fetch_suite("nq", data_dir=tmp_path, url=source)
    assert path == tmp_path / "eagle/qa/question.jsonl" and len(load_suite("nq", data_dir=tmp_path)) == 80


@needs_data
def test_fetch_suite_rejects_wrong_checksum_and_keeps_nothing(tmp_path):
    """A download with the wrong content must not be saved (not even as a .part file)."""
    source = (SHARED_DATA / "eagle/alpaca/question.jsonl").as_uri()
    with pytest.raises(DataError, match=r"suite 'nq': download from .* has sha256 8ad3e5a7.*expected 04252e41"):
        fetch_suite("nq", data_dir=tmp_path, url=source)
    assert list(tmp_path.rglob("*.jsonl*")) == []


def test_fetch_suite_unreachable_url(tmp_path):
    """Offline users must get a one-line error naming the URL, not a urllib traceback."""
    with pytest.raises(DataError, match=r"suite 'gsm8k': download from file:///nonexistent/q.jsonl failed"):
        fetch_suite("gsm8k", data_dir=tmp_path, url="file:///nonexistent/q.jsonl")


def test_suite_is_a_plain_dataclass():
    """Suites built in code (e.g. by another tool) must work with select like loaded ones."""
    suite = Suite(name="x", version="1", questions=[Question("a", None, ["t"])])
    assert suite.select(limit=1).questions[0].turns == ["t"]
