"""SPEED-Bench (arXiv:2604.09557) as suites: its Parquet format read like a questions file, placeholders refused,
fetched and pinned like the other suites, and reported per category. The fixture
(tests/data/speed_bench_qualitative_sample.parquet) has the dataset's published columns (question_id, category,
sub_category, turns, source, src_id, difficulty, multiturn) and six original prompts in three categories, one of
them with two turns."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.report.report import write_report
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run
from harness.run.suites import DataError, fetch_suite, load_suite, suite_info
from tests.support.helpers import tiny_target

FIXTURE = Path(__file__).parent / "data" / "speed_bench_qualitative_sample.parquet"


def test_fixture_loads_as_a_suite():
    """Ids, categories and both turns of the multi-turn row; a lost second turn would halve that prompt's tokens."""
    suite = load_suite(str(FIXTURE))
    assert suite.name == "speed_bench_qualitative_sample" and len(suite) == 6
    assert [q.category for q in suite.questions] == ["coding", "coding", "math", "math", "writing", "writing"]
    assert suite.questions[1].question_id == "q-coding-1"
    assert suite.questions[1].turns == ["Explain what a list comprehension is.", "Now give an example with a filter."]


def test_placeholder_rows_are_refused(tmp_path):
    """A throughput row left empty for SPEED-Bench's preparation script must not run as an empty prompt."""
    path = tmp_path / "throughput.parquet"
    pq.write_table(pa.table({"question_id": ["a", "b"], "category": ["low", "low"],
                             "turns": pa.array([["text"], []], pa.list_(pa.string()))}), path)
    with pytest.raises(DataError, match=r"row 2: question 'b' has empty turns, a placeholder"):
        load_suite(str(path))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet table"):
        load_suite(str(tmp_path / "bad.parquet"))


def test_definitions_name_the_dataset_and_the_published_counts():
    """880 qualitative prompts and 1,536 per throughput bucket; a wrong count would reject the real files."""
    assert suite_info("speed_bench_qualitative")["records"] == 880
    for bucket in ("1k", "2k", "8k", "16k", "32k"):
        info = suite_info(f"speed_bench_throughput_{bucket}")
        assert info["records"] == 1536 and f"/throughput_{bucket}/" in info["source_url"]
        assert info["source_url"].startswith("https://huggingface.co/datasets/nvidia/SPEED-Bench/resolve/main/")


def test_fetch_pins_the_download_and_load_checks_the_count(tmp_path):
    """`draftbench data fetch` path (file:// stands in for the network): the download is saved and pinned; a file
    with the wrong number of rows (the 6-row fixture, not the 880) is refused on load."""
    path = fetch_suite("speed_bench_qualitative", data_dir=tmp_path, url=FIXTURE.as_uri())
    assert path == tmp_path / "speed_bench" / "qualitative.parquet"
    assert (tmp_path / "speed_bench" / "qualitative.parquet.sha256").is_file()
    with pytest.raises(DataError, match="has 6 records, expected 880"):
        load_suite("speed_bench_qualitative", data_dir=tmp_path)


def test_report_has_speed_bench_per_category_table(tmp_path):
    """A run on the fixture gets Spec-Bench's per-category layout: one row per label and category."""
    cfg = RunConfig(target="tiny-llama", device="cpu", suites=[str(FIXTURE)], max_new_tokens=2, warmup=0,
                    methods=[MethodSpec("vanilla"), MethodSpec("pld")], output_dir=str(tmp_path))
    run_dir = run(cfg, target=tiny_target(eos=False), progress=False)
    write_report(run_dir)
    lines = (run_dir / "tables" / "categories.csv").read_text().splitlines()
    assert [line.split(",")[4] for line in lines[1:]] == ["coding", "math", "writing"] * 2
    assert "speed_bench_qualitative_sample, temperature 0, per category" in (run_dir / "tables/summary.md").read_text()
