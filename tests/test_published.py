"""Published tables as data (harness/published/tables.py), the measured-vs-reported comparison on literal records
(harness/published/against.py), the spec_bench suite format and the vicuna_v1.1 chat template."""

import copy
import math
import shutil
from pathlib import Path

import pytest
import yaml

from harness.published.against import (
    AgainstError,
    compare_load,
    compare_run,
    compare_turns,
    comparison_markdown,
    match_rows,
    plot_against,
)
from harness.published.tables import TableError, load_table, table_from_dict, table_names
from harness.report.tables import turns_table
from harness.run import suites
from harness.run.chat import resolve_chat_template
from harness.run.suites import DataError, fetch_suite, load_suite, suite_info
from tests.support.helpers import char_tokenizer, tiny_target

DATA = Path(__file__).resolve().parent / "data"
STANDIN = DATA / "standin_eagle2.yaml"

# name -> (rows, runnable rows, reported numbers): what the shipped files hold
SHIPPED = {
    "eagle1_paper": (6, 6, 48),
    "eagle1_paper_t1": (6, 6, 46),
    "eagle2_paper": (23, 23, 310),
    "eagle2_paper_t1": (10, 10, 140),
    "eagle3_paper": (14, 11, 168),
    "eagle3_paper_t1": (10, 7, 120),
    "eagle3_sglang_batch": (2, 1, 18),
    "eagle3_sglang_h100": (3, 2, 3),
    "eagle3_vllm_batch": (2, 1, 16),
    "jakiro_a40_t0": (8, 7, 184),
    "jakiro_a40_t1": (10, 9, 230),
    "medusa1": (2, 1, 2),
    "spec_bench_a100": (10, 10, 80),
    "spec_bench_a100_vicuna13b": (11, 11, 88),
    "spec_bench_a100_vicuna33b": (10, 10, 80),
    "spec_bench_rtx3090": (10, 10, 80),
}


def test_the_shipped_tables_are_the_expected_ones():
    """A table file dropped or added without its test entry would go unvalidated here."""
    assert table_names() == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_table_validates(name):
    """Every method, option set, suite, column and cell of a shipped table must exist and parse; a typo in any of
    them (or a lost row) fails loading or changes these counts."""
    table = load_table(name)
    rows, runnable, cells = SHIPPED[name]
    assert (len(table.rows), len(table.runnable_rows()), table.n_cells()) == (rows, runnable, cells)
    assert table.source["citation"] and (table.source.get("arxiv") or table.source.get("url"))
    for row in table.rows:
        assert set(row.cells) <= set(table.columns) and row.cells, row.id
        assert row.runnable or row.reason, row.id
        if row.head is not None:
            assert row.head in table.heads


@pytest.mark.parametrize("name, row, column, metric, value", [
    ("eagle1_paper", "vicuna_7b_eagle1", "humaneval", "tau", 4.29),
    ("eagle2_paper", "vicuna_7b_eagle2", "mt_bench", "speedup", 3.62),
    ("eagle2_paper", "llama3_instruct_8b_eagle2", "mt_bench", "tau", 4.53),
    ("spec_bench_rtx3090", "eagle2", "overall", "tau", 4.35),
    ("spec_bench_a100", "pld", "summarization", "speedup", 2.66),
    ("medusa1", "medusa1", "mt_bench", "speedup", 1.97),
    ("medusa1", "medusa1_paper_v15", "mt_bench", "speedup", 2.18),
    ("jakiro_a40_t0", "vicuna_13b_jakiro", "mean", "speedup", 2.97),
    ("jakiro_a40_t0", "vicuna_7b_eagle2", "mean", "baseline_tokens_per_s", 32.2),
    ("jakiro_a40_t1", "vicuna_7b_jakiro_star", "mt_bench", "tau", 5.64),
    ("jakiro_a40_t1", "vicuna_33b_jakiro", "nq", "tau_eagle_step", 3.28),
    ("spec_bench_a100_vicuna13b", "eagle3", "overall", "speedup", 3.02),
    ("spec_bench_a100_vicuna13b", "eagle3", "overall", "tau", 5.71),
    ("spec_bench_a100_vicuna13b", "eagle2", "rag", "speedup", 2.25),
    ("spec_bench_a100_vicuna33b", "eagle2", "math_reasoning", "speedup", 3.3),
    ("spec_bench_a100_vicuna33b", "lookahead", "overall", "tau", 1.61),
    # Spec-Bench's SAMD[EAGLE2], Recycling, REST and Hydra rows (Leaderboard.md at fd2c1cd)
    ("spec_bench_a100", "sam_eagle2", "overall", "speedup", 2.73),
    ("spec_bench_rtx3090", "sam_eagle2", "overall", "tau", 4.61),
    ("spec_bench_a100", "token_recycling", "translation", "speedup", 2.02),
    ("spec_bench_a100_vicuna33b", "rest", "overall", "tau", 1.8),
    ("spec_bench_a100_vicuna13b", "hydra", "overall", "speedup", 2.2),
    ("eagle3_paper", "vicuna_13b_eagle3", "humaneval", "speedup", 6.47),
    ("eagle3_paper", "llama31_instruct_8b_eagle3", "cnn_dm", "tau", 5.34),
    ("eagle3_sglang_batch", "sglang_eagle3_chain3", "bs64", "throughput_ratio", 1.38),
    ("eagle3_sglang_h100", "sglang_eagle3", "mt_bench", "tokens_per_s", 373.25),
    ("eagle3_sglang_h100", "sglang_vanilla", "mt_bench", "tokens_per_s", 158.34),
    ("eagle3_paper", "llama33_instruct_70b_eagle3", "humaneval", "speedup", 4.79),
    ("eagle3_paper", "dsl_8b_eagle3", "gsm8k", "tau", 6.93),
    ("eagle3_paper", "vicuna_13b_hydra", "mean", "tau", 3.5),
    ("eagle3_paper_t1", "vicuna_13b_eagle3", "mt_bench", "speedup", 4.57),
    ("eagle3_paper_t1", "dsl_8b_eagle2", "cnn_dm", "tau", 3.13),
    ("eagle2_paper", "llama2_chat_13b_eagle2", "nq", "speedup", 3.51),
    ("eagle2_paper", "vicuna_7b_pld", "cnn_dm", "tau", 2.72),
    ("eagle2_paper_t1", "llama2_chat_7b_eagle2", "humaneval", "tau", 5.06),
    ("eagle1_paper", "llama2_chat_70b_eagle1", "humaneval", "speedup", 3.52),
    ("eagle1_paper", "vicuna_33b_eagle1", "mt_bench", "tau", 3.68),
    ("eagle1_paper_t1", "vicuna_33b_eagle1", "gsm8k", "speedup", 2.77),
    ("eagle3_sglang_batch", "sglang_eagle_chain3", "bs24", "throughput_ratio", 0.93),
    ("eagle3_vllm_batch", "vllm_eagle3_chain2", "bs56", "throughput_ratio", 1.01),
])
def test_shipped_cells_hold_the_published_numbers(name, row, column, metric, value):
    """Spot checks against the sources (the cell a reader would look up first); a shifted column would fail."""
    assert load_table(name).row(row).cells[column][metric] == value


@pytest.mark.parametrize("name", ["jakiro_a40_t0", "jakiro_a40_t1"])
def test_jakiro_mean_column_is_the_mean_of_its_six_cells(name):
    """The recomputed Jakiro tables give a mean column = equal-weight mean of the six datasets; a mistyped cell in a
    row breaks this identity beyond the two-decimal rounding of the published cells."""
    table = load_table(name)
    for row in table.rows:
        for metric in ("speedup", "tau", "tau_eagle_step"):
            six = [row.cells[c][metric] for c in ("mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq")]
            assert sum(six) / 6 == pytest.approx(row.cells["mean"][metric], abs=0.011), (row.id, metric)


# (table, row, metric) -> (printed mean, mean of the printed cells): the papers' own inconsistencies, kept as printed
PAPER_MEAN_SLIPS = {
    ("eagle3_paper", "llama33_instruct_70b_eagle3", "speedup"): (4.12, 4.162),
    ("eagle3_paper_t1", "llama31_instruct_8b_eagle3", "speedup"): (3.45, 3.482),
    ("eagle2_paper_t1", "vicuna_13b_sps", "speedup"): (1.55, 1.568),
}


@pytest.mark.parametrize("name", ["eagle2_paper", "eagle2_paper_t1", "eagle3_paper", "eagle3_paper_t1"])
def test_printed_means_recompute_from_the_cells(name):
    """EAGLE-2's and EAGLE-3's Table 1 print a mean column: the mean of a row's printed cells must give it back
    within 0.01 (each cell is rounded to 0.005 and so is the mean). A misread or shifted cell moves the mean of its
    row by 0.1 / 6 or more for any misread digit but the last, and fails here; the three rows where the paper itself
    is off are listed with both numbers."""
    table = load_table(name)
    checked = 0
    for row in table.rows:
        if "mean" not in row.cells:
            continue
        suites = table.columns["mean"].mean_of
        for metric in ("speedup", "tau"):
            recomputed = sum(row.cells[c][metric] for c in suites) / len(suites)
            slip = PAPER_MEAN_SLIPS.get((name, row.id, metric))
            if slip:
                assert (row.cells["mean"][metric], recomputed) == pytest.approx(slip, abs=1e-3)
            else:
                assert recomputed == pytest.approx(row.cells["mean"][metric], abs=0.01), (row.id, metric)
            checked += 1
    assert checked == 2 * len([r for r in table.rows if r.id != "llama3_instruct_8b_eagle2"])


# (table, row) of one paper -> (table, row) of another printing the same measurement, and the cells they differ in
SAME_MEASUREMENT = [
    ("eagle3_paper", "vicuna_13b", "eagle2_paper", "vicuna_13b",
     ["sps", "pld", "medusa", "lookahead", "hydra", "eagle1", "eagle2"]),
    ("eagle3_paper_t1", "vicuna_13b", "eagle2_paper_t1", "vicuna_13b", ["sps", "eagle1", "eagle2"]),
    ("eagle1_paper", "vicuna_7b", "eagle2_paper", "vicuna_7b", ["eagle1"]),
    ("eagle1_paper", "vicuna_13b", "eagle2_paper", "vicuna_13b", ["eagle1"]),
    ("eagle1_paper", "llama2_chat_7b", "eagle2_paper", "llama2_chat_7b", ["eagle1"]),
    ("eagle1_paper", "llama2_chat_13b", "eagle2_paper", "llama2_chat_13b", ["eagle1"]),
    ("eagle1_paper_t1", "vicuna_7b", "eagle2_paper_t1", "vicuna_7b", ["eagle1"]),
    ("eagle1_paper_t1", "vicuna_13b", "eagle2_paper_t1", "vicuna_13b", ["eagle1"]),
    ("eagle1_paper_t1", "llama2_chat_7b", "eagle2_paper_t1", "llama2_chat_7b", ["eagle1"]),
    ("eagle1_paper_t1", "llama2_chat_13b", "eagle2_paper_t1", "llama2_chat_13b", ["eagle1"]),
]


@pytest.mark.parametrize("a, a_target, b, b_target, methods", SAME_MEASUREMENT)
def test_cells_two_papers_print_for_one_measurement_agree(a, a_target, b, b_target, methods):
    """The EAGLE papers reprint their predecessors' rows: EAGLE-3's Vicuna-13B baselines are EAGLE-2's, EAGLE-2's
    EAGLE rows are EAGLE-1's Tables 1-2 and Figures 1-2. Both files were read from different texts, so a cell misread
    in one of them differs here. The one cell the papers themselves print differently: Vicuna-7B Alpaca tau at T = 0
    (EAGLE-1 3.86, EAGLE-2 3.89)."""
    ta, tb = load_table(a), load_table(b)
    compared = 0
    for m in methods:
        ra, rb = ta.row(f"{a_target}_{m}"), tb.row(f"{b_target}_{m}")
        for col in set(ra.cells) & set(rb.cells) - {"mean"}:
            for metric in set(ra.cells[col]) & set(rb.cells[col]):
                if (a, ra.id, col, metric) == ("eagle1_paper", "vicuna_7b_eagle1", "alpaca", "tau"):
                    assert (ra.cells[col][metric], rb.cells[col][metric]) == (3.86, 3.89)
                else:
                    assert ra.cells[col][metric] == rb.cells[col][metric], (ra.id, col, metric)
                compared += 1
    assert compared == {"eagle3_paper": 70, "eagle3_paper_t1": 30}.get(a, 8)


def test_rows_of_other_targets_or_budgets_are_kept_apart():
    """EAGLE-1 and Jakiro* come from Jakiro's other evaluation folder (1024-token cap): their rows must say so, or a
    reproduction would run them under the wrong budget."""
    table = load_table("jakiro_a40_t1")
    assert table.row("vicuna_7b_eagle1").max_new_tokens == 1024
    assert table.row("vicuna_7b_jakiro").max_new_tokens is None and table.max_new_tokens == 512
    assert table.row("vicuna_7b_jakiro_star").options == {"variant": "as_published"}
    assert table.temperature == 1.0 and table.tau_convention == "eagle_script"


def _standin() -> dict:
    return yaml.safe_load(STANDIN.read_text())


def _set(data: dict, path: str | tuple[str, ...], value) -> dict:
    """A copy of ``data`` with the field at ``path`` (dotted, or a tuple of keys when a key has dots) set or deleted."""
    data = copy.deepcopy(data)
    keys = path.split(".") if isinstance(path, str) else list(path)
    node = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("path, value, message", [
    ("rows.0.method", "no_such_method", r"rows\[0\]\.method: unknown method 'no_such_method'"),
    ("rows.0.options.depth", 0, r"rows\[0\]\.options: depth must be >= 1, got 0"),
    ("rows.0.options.dept", 5, r"rows\[0\]\.options: unknown option 'dept' \(did you mean 'depth'\?\)"),
    ("rows.0.options.head", "x", r"rows\[0\]\.options\.head: name the head in the row's `head` field"),
    ("rows.0.head", "yuhuili/EAGLE-Vicuna-7B", r"rows\[0\]\.head: 'yuhuili/EAGLE-Vicuna-7B' is not an id of heads"),
    ("rows.0.target", "vicuna_13b", r"rows\[0\]\.target: 'vicuna_13b' is not a key of targets"),
    ("rows.0.cells.mt_bench.speedup", "fast", r"rows\[0\]\.cells\.mt_bench\.speedup: expected a number"),
    ("rows.0.cells.humaneval", {"speedup": 3.95}, r"rows\[0\]\.cells: unknown field 'humaneval'"),
    ("rows.0.cells.mt_bench.tau_mat", 4.0, r"rows\[0\]\.cells\.mt_bench: unknown field 'tau_mat'"),
    ("rows.2.reason", _DELETE, r"rows\[2\]\.reason: a row with runnable: false must say why"),
    ("protocol.tau_convention", "mat", r"protocol\.tau_convention: unknown convention 'mat'"),
    ("protocol.suites", ["mtbench", "gsm8k"], r"protocol\.suites\[0\]: unknown suite 'mtbench'"),
    ("protocol.columns.mean.mean_of", ["mt_bench", "mean"], r"protocol\.columns\.mean\.mean_of\[1\]: 'mean' is not a"),
    ("protocol.columns.gsm8k.suite", "alpaca", r"protocol\.columns\.gsm8k\.suite: 'alpaca' is not in protocol"),
    ("protocol.max_new_tokens", 0, r"protocol\.max_new_tokens: must be >= 1, got 0"),
    ("source.arxiv", None, r"source\.arxiv: a paper source needs its arXiv id"),
    ("source.kind", "blog", r"source\.kind: must be one of paper, leaderboard, recomputed"),
    ("dtype", "fp8", r"dtype: must be one of float16, bfloat16, float32"),
    ("hardwre", "A100", r"table: unknown field 'hardwre' \(did you mean 'hardware'\?\)"),
    ("targets.vicuna_7b.chat_template", "vicuna_v2", r"targets\.vicuna_7b\.chat_template: unknown chat template"),
    (("heads", "Jakiro-Vicuna-7B-v1.3", "url"), None, r"heads\.Jakiro-Vicuna-7B-v1\.3\.url: a head that is not on the"),
])
def test_a_wrong_field_fails_naming_it(path, value, message):
    """Every bad field must give one line naming the file and the field path, so a table author can fix it."""
    _assert_refused(path, value, message)


def _assert_refused(path, value, message: str) -> None:
    """The stand-in table with ``path`` set to ``value`` (or deleted) must fail loading with ``message``."""
    with pytest.raises(TableError, match=r"standin_eagle2\.yaml: " + message):
        table_from_dict(_set(_standin(), path, value), "standin_eagle2.yaml")


@pytest.mark.parametrize("path, value, message", [
    ("hardware", _DELETE, r"table: missing field\(s\) hardware"),
    ("hardware", " ", r"hardware: expected a non-empty string"),
    ("framework", _DELETE, r"table: missing field\(s\) framework"),
    ("source.citation", _DELETE, r"source: missing field\(s\) citation"),
    ("rows.0.gpus", 0, r"rows\[0\]\.gpus: must be >= 1, got 0"),
    (("heads", "yuhuili/EAGLE-Vicuna-7B-v1.3", "weights"), "",
     r"heads\.yuhuili/EAGLE-Vicuna-7B-v1\.3\.weights: expected a non-empty"),
])
def test_a_table_missing_its_provenance_is_refused(path, value, message):
    """A table without its GPU (or "not stated"), framework or citation, or with a GPU count below 1 or an empty
    weights source, would let a reproduction compare against an unnamed setting: loading must refuse it."""
    _assert_refused(path, value, message)


def test_shipped_provenance_names_the_setting_the_numbers_came_from():
    """The settings the sources state (issue #24): Medusa's 2.18x is a v1.5 figure with unreleased heads and no GPU is
    named, Spec-Bench's A100 leaderboard is pinned to its commit with 96 CPU cores and CUDA 11.5, EAGLE-1's scripts
    stop at 1024 new tokens, Jakiro's Vicuna-33B rows ran on 2 GPUs with the Google Drive heads. A regression to the
    old metadata would make a reproduction compare against the wrong setting."""
    medusa = load_table("medusa1")
    assert medusa.hardware == "not stated" and medusa.row("medusa1").runnable
    assert not medusa.row("medusa1_paper_v15").runnable
    assert medusa.targets[medusa.row("medusa1_paper_v15").target].id == "lmsys/vicuna-7b-v1.5"
    a100 = load_table("spec_bench_a100")
    assert "96 CPU cores" in a100.hardware and "CUDA 11.5" in a100.framework
    for name in ("spec_bench_a100", "spec_bench_rtx3090"):
        assert "fd2c1cd7d2201ef71db4c5f4e455008f017967bf" in load_table(name).source["url"]
    assert load_table("eagle1_paper").max_new_tokens == 1024
    assert load_table("eagle2_paper").hardware == "not stated"
    for name in ("jakiro_a40_t0", "jakiro_a40_t1"):
        table = load_table(name)
        assert {r.id: r.gpus for r in table.rows if r.gpus != 1} == {"vicuna_33b_eagle2": 2, "vicuna_33b_jakiro": 2}
        assert all("f46e7b0" in h.weights for h in table.heads.values() if h.kind.startswith("jakiro"))


def test_engine_tables_name_engine_gpu_and_batch_sizes():
    """EAGLE-3's SGLang tables (arXiv:2503.01840v3, Tables 3-4) were measured in SGLang v0.4.4 on one H100 at batch
    sizes 2..64 and 1: a table that lost its engine or batch sizes would be compared with draftbench's batch-1 loop."""
    batch = load_table("eagle3_sglang_batch")
    assert (batch.engine["name"], batch.engine["version"], batch.batch_sizes()) == (
        "sglang", "v0.4.4", [2, 4, 8, 16, 24, 32, 48, 56, 64])
    # reproduce launches the rows whose head the paper names; the EAGLE row's head is unnamed: reported only
    assert "H100" in batch.hardware and [r.id for r in batch.runnable_rows()] == ["sglang_eagle3_chain3"]
    assert batch.row("sglang_eagle3_chain3").engine_options == {
        "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4}
    h100 = load_table("eagle3_sglang_h100")
    assert h100.batch_sizes() == [1] and [r.id for r in h100.rows] == ["sglang_vanilla", "sglang_eagle2",
                                                                       "sglang_eagle3"]
    vllm = load_table("eagle3_vllm_batch")
    assert (vllm.engine["name"], vllm.engine["version"], vllm.batch_sizes()) == (
        "vllm", "not stated", [2, 4, 8, 16, 24, 32, 48, 56])
    assert "A100" in vllm.hardware and "RTX 3090" in vllm.hardware
    assert [r.id for r in vllm.runnable_rows()] == ["vllm_eagle3_chain2"]
    assert [r.id for r in h100.runnable_rows()] == ["sglang_vanilla", "sglang_eagle3"]
    for name in ("eagle3_paper", "eagle3_paper_t1", "spec_bench_a100_vicuna13b"):
        assert load_table(name).engine is None and load_table(name).batch_sizes() == [1]


def test_eagle_trees_are_the_papers_per_target_size():
    """EAGLE-2's and EAGLE-3's Appendix A: 60 / 50 / 48 draft tokens for 7B (8B) / 13B / 70B targets, depth 6 for
    EAGLE-2 and 8 for EAGLE-3 (draftbench depths 5 and 7); EAGLE-1 one static tree for all. A 13B row run with the
    8B node count would compare a different tree with the paper's number."""
    e3 = load_table("eagle3_paper")
    assert {r.id: r.options["total_tokens"] for r in e3.rows if r.method == "eagle3"} == {
        "vicuna_13b_eagle3": 50, "llama31_instruct_8b_eagle3": 60, "llama33_instruct_70b_eagle3": 48,
        "dsl_8b_eagle3": 60}
    assert {r.options["depth"] for r in e3.rows if r.method == "eagle3"} == {7}
    e2 = load_table("eagle2_paper")
    assert {r.id: r.options["total_tokens"] for r in e2.rows if r.method == "eagle2"} == {
        "vicuna_13b_eagle2": 50, "llama2_chat_13b_eagle2": 50, "vicuna_7b_eagle2": 60, "llama2_chat_7b_eagle2": 60,
        "llama3_instruct_8b_eagle2": 60}
    e1 = load_table("eagle1_paper")
    assert {r.options["tree"] for r in e1.rows} == {"eagle_mc_sim_7b_63"}
    assert e1.row("llama2_chat_70b_eagle1").gpus == 4
    for name in ("eagle1_paper_t1", "eagle2_paper_t1", "eagle3_paper_t1"):
        assert load_table(name).temperature == 1.0


def _engine_table() -> dict:
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "results" / "published" /
                           "eagle3_sglang_batch.yaml").read_text())


@pytest.mark.parametrize("path, value, message", [
    ("engine", _DELETE, r"protocol\.columns\.bs2\.batch_size: batch size 2 needs the table's `engine`"),
    ("engine.version", _DELETE, r"engine: missing field\(s\) version"),
    ("engine.version", 0.44, r"engine\.version: expected a string"),
    ("engine.name", _DELETE, r"engine: missing field\(s\) name"),
    ("protocol.columns.bs64.batch_size", _DELETE,
     r"protocol\.columns\.bs64\.batch_size: an engine table states each column's batch size"),
    ("protocol.columns.bs64.batch_size", 0, r"protocol\.columns\.bs64\.batch_size: must be >= 1, got 0"),
    ("engine.name", "tgi", r"rows\[0\]\.runnable: reproduce launches an engine table's rows in vllm or sglang, not "
                           r"'tgi': set runnable: false"),
    ("protocol.columns.bs2.category", "writing",
     r"rows\[0\]\.runnable: .* load levels, which mix the prompts of every category: column\(s\) bs2 select"),
    ("rows.0.engine_options.speculative_num_steps", [3], r"rows\[0\]\.engine_options\.speculative_num_steps"),
    ("rows.0.cells.bs2.throughput", 1.8, r"rows\[0\]\.cells\.bs2: unknown field 'throughput'"),
])
def test_an_engine_table_missing_its_engine_or_batch_size_is_refused(path, value, message):
    """An engine table without its engine, version or a column's batch size would be compared with the wrong
    setting, and a runnable row in an engine reproduce does not launch, or under a column a load level cannot stand
    for (one category of the suite), could not be measured: loading must refuse it and name the field."""
    with pytest.raises(TableError, match=r"eagle3_sglang_batch\.yaml: " + message):
        table_from_dict(_set(_engine_table(), path, value), "eagle3_sglang_batch.yaml")


def test_a_vllm_rows_speculative_config_must_be_a_json_object():
    """vLLM's speculative_config is written as its --speculative-config JSON string; one that does not parse would
    reach vLLM only when reproduce launches it, minutes into the run: loading refuses it and names the field."""
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "results" / "published" /
                           "eagle3_vllm_batch.yaml").read_text())
    for bad in ('{"method": "eagle3",', '["eagle3"]'):
        with pytest.raises(TableError, match=r"eagle3_vllm_batch\.yaml: rows\[0\]\.engine_options\.speculative_config: "
                                             r"expected vLLM's --speculative-config JSON object as a string"):
            table_from_dict(_set(data, "rows.0.engine_options.speculative_config", bad), "eagle3_vllm_batch.yaml")


def test_engine_options_belong_to_engine_tables():
    """Engine options on a row of draftbench's own loop would be silently ignored: refused."""
    _assert_refused("rows.0.engine_options", {"speculative_num_steps": 3},
                    r"rows\[0\]\.engine_options: only a table with `engine` has engine options")


def test_table_id_must_match_its_file_and_unknown_names_suggest(tmp_path):
    """A copied file with a stale id, or a mistyped table name, must be caught with a usable hint."""
    path = tmp_path / "my_table.yaml"
    shutil.copy(STANDIN, path)
    with pytest.raises(TableError, match=r"my_table\.yaml: id: 'standin_eagle2' must equal the file name 'my_table'"):
        load_table(path)
    with pytest.raises(TableError, match=r"unknown published table 'eagle2_papr'.*Did you mean 'eagle2_paper'"):
        load_table("eagle2_papr")


# ------------------------------------------------------------------------------------- comparison on literal records


def rec(label, method, suite, qid, turn, accept_lengths, wall, options, category=None, status="ok"):
    """One turn record as the runner writes it (only the fields the comparison reads)."""
    return {"run_id": "r", "status": status, "error": None, "method": method, "label": label, "lossless": True,
            "method_options": options, "suite": suite, "suite_version": "1", "question_id": str(qid),
            "category": category, "turn": turn, "target": "smollm2-135m", "dtype": "float32", "device": "cpu",
            "temperature": 0.0, "top_p": 1.0, "seed": 0, "repeat": 0, "new_tokens": sum(accept_lengths),
            "steps": len(accept_lengths), "accept_lengths": accept_lengths, "accepted_drafts": [],
            "draft_depths": [], "wall_time_s": wall, "output_ids": None}


EAGLE_OPTS = {"head": "/heads/eagle", "total_tokens": 16, "depth": 3, "top_k": 4, "draft_vocab": 4096}
OTHER_OPTS = {**EAGLE_OPTS, "depth": 5}


def literal_records():
    """vanilla: 10 tokens/s on MT-bench q81 (two turns of 10 tokens in 1 s), 5 tokens/s on GSM8K q1.
    eagle2 (the stand-in's options): 20 tokens/s and 10 tokens/s -> speed-ups 2.0 and 2.0.
    eagle2_d5: the same method with depth 5, which must not be matched to the table row."""
    out = [rec("vanilla", "vanilla", "mt_bench", 81, 0, [1] * 10, 1.0, {}),
           rec("vanilla", "vanilla", "mt_bench", 81, 1, [1] * 10, 1.0, {}),
           rec("vanilla", "vanilla", "gsm8k", 1, 0, [1] * 5, 1.0, {})]
    for label, opts in (("eagle2", EAGLE_OPTS), ("eagle2_d5", OTHER_OPTS)):
        out += [rec(label, "eagle2", "mt_bench", 81, 0, [1, 3, 4, 2], 0.5, opts),
                rec(label, "eagle2", "mt_bench", 81, 1, [1, 4, 5], 0.5, opts),
                rec(label, "eagle2", "gsm8k", 1, 0, [1, 2, 2], 0.5, opts)]
    return out


@pytest.fixture()
def standin():
    return load_table(STANDIN)


def test_rows_match_by_method_and_options_not_label(standin):
    """A run not made by `reproduce` is matched on method + options (head ignored): the depth-5 variant must not
    stand in for the table's depth-3 row, and a table row without a run label is simply absent."""
    turns = turns_table(literal_records())
    assert match_rows(standin, turns, {"config": {"target": "lmsys/vicuna-7b-v1.3"}}) == {"vicuna_7b_eagle2": "eagle2"}
    # a reproduction's manifest says which label is which row, whatever the options
    manifest = {"reproduce": {"table": "standin_eagle2", "rows": {"eagle2_d5": "vicuna_7b_eagle2"}}}
    assert match_rows(standin, turns, manifest) == {"vicuna_7b_eagle2": "eagle2_d5"}


def test_comparison_values_on_literal_records(standin):
    """Every number of the comparison from hand-computed records. Speed-up: 20 / 10 and 10 / 5 tokens/s = 2.0 on both
    suites; tau (eagle_script): MT-bench S = (3+4+2) + (4+5) = 18 over loop indices (3−1) + (2−1) = 3 -> 6.0, GSM8K
    4 / 1 = 4.0; draftbench tau 20/7 and 5/3; the mean column averages the suites."""
    df = compare_turns(turns_table(literal_records()), standin, {"config": {"target": "lmsys/vicuna-7b-v1.3"}},
                       n_boot=200)
    cell = df.set_index(["row", "column", "metric"])
    sp = cell.loc[("vicuna_7b_eagle2", "mt_bench", "speedup")]
    assert (sp["measured"], sp["reported"]) == pytest.approx((2.0, 3.62))
    assert (sp["delta"], sp["ratio"]) == pytest.approx((-1.62, 2.0 / 3.62))
    assert (sp["ci_lo"], sp["ci_hi"]) == pytest.approx((2.0, 2.0))      # one question: the CI collapses on it
    tau = cell.loc[("vicuna_7b_eagle2", "mt_bench", "tau")]
    assert (tau["measured"], tau["convention"], tau["tau_draftbench"]) == (pytest.approx(6.0), "eagle_script",
                                                                           pytest.approx(20 / 7))
    assert (tau["delta"], tau["ratio"]) == pytest.approx((6.0 - 4.98, 6.0 / 4.98))
    g = cell.loc[("vicuna_7b_eagle2", "gsm8k", "tau")]
    assert (g["measured"], g["tau_draftbench"]) == pytest.approx((4.0, 5 / 3))
    mean = cell.loc[("vicuna_7b_eagle2", "mean", "speedup")]
    assert mean["measured"] == pytest.approx(2.0) and math.isnan(mean["reported"]) and math.isnan(mean["delta"])
    assert cell.loc[("vicuna_7b_eagle2", "mean", "tau"), "measured"] == pytest.approx(5.0)
    assert ("vicuna_7b_eagle2", "gsm8k", "tokens_per_s") not in cell.index  # not reported: no row for it
    assert set(df["row"]) == {"vicuna_7b_eagle2"}                         # the Jakiro row was not run
    assert df.attrs["notes"] == []


def test_markdown_and_plot_show_both_numbers(standin, tmp_path):
    """The printed table must carry measured, its CI, reported, delta and ratio per cell, both hardwares, and the
    plot must be written (one point per cell, with the diagonal)."""
    df = compare_turns(turns_table(literal_records()), standin, {"config": {"target": "lmsys/vicuna-7b-v1.3"},
                                                                 "device": {"device_name": "Test CPU"}}, n_boot=200)
    md = comparison_markdown(df, standin, "run1")
    assert ("| EAGLE-2 Vicuna-7B | 2.00 [2.00, 2.00] vs 3.62 (-1.62, ×0.55) | 2.00 [2.00, 2.00] vs 3.63 (-1.63, ×0.55)"
            in md)
    assert "6.00 [τ 2.86] vs 4.98 (+1.02, ×1.20)" in md
    assert "reported **not stated with the table**" in md and "measured **Test CPU**" in md
    assert plot_against(df, tmp_path / "p.png").stat().st_size > 1000


def load_row(label: str, method: str, c: int, qid: int, finished: float, tokens: int = 4) -> dict:
    """One request of a load level (harness/run/load.py's row): ``tokens`` tokens, sent at 0, finished at ``finished``
    s."""
    return {"attempt": f"{label}-{c}", "label": label, "method": method, "method_options": {}, "engine": "openai",
            "target": "smollm2-135m", "concurrency": c, "request_rate": None, "burstiness": 1.0, "status": "ok",
            "question_id": str(qid), "new_tokens": tokens, "wall_time_s": finished, "prefill_time_s": finished / 4,
            "sent_s": 0.0, "finished_s": finished, "level_counters": None, "engine_notes": [],
            "token_times_s": [finished * (i + 1) / tokens for i in range(tokens)]}


def literal_load_rows() -> list[dict]:
    """Two requests of 4 tokens a level. Concurrency 1: vanilla's finish at 0.4 s (8 tokens / 0.4 s = 20 tokens/s,
    10 per request), e3's at 0.2 s (40, 20 per request): throughput ratio and speed-up 2.0. Concurrency 2: 0.5 s
    (16, 8) and 0.4 s (20, 10): 1.25."""
    return [load_row(label, method, c, q, finished) for c, times in ((1, (0.4, 0.2)), (2, (0.5, 0.4)))
            for (label, method), finished in zip((("vanilla", "vanilla"), ("e3", "eagle3")), times) for q in (0, 1)]


def test_an_engine_table_is_compared_with_the_load_levels_at_its_batch_sizes(tmp_path):
    """Each column is the level at its batch size, its numbers the load report's: throughput ratio 2.0 vs 1.5 at
    batch 1 and 1.25 vs 1.25 at 2, the paired speed-up beside it, tokens/s the level's output tokens/s. A column read
    at another concurrency, or a ratio recomputed differently from tables/load.csv, would fail here."""
    from tests.test_reproduce import _engine_table

    table = _engine_table("vllm", cells={"bs1": {"throughput_ratio": 1.5, "tokens_per_s": 30.0},
                                         "bs2": {"throughput_ratio": 1.25}})
    manifest = {"config": {"baseline": "vanilla", "target": "smollm2-135m"}, "device": {"device_name": "Test GPU"},
                "reproduce": {"table": "tiny_engine", "rows": {"e3": "e3"}}}
    df = compare_load(literal_load_rows(), table, manifest)
    cell = df.set_index(["row", "column", "metric"])
    assert list(cell.index) == [("e3", "bs1", "throughput_ratio"), ("e3", "bs1", "speedup"),
                                ("e3", "bs1", "tokens_per_s"), ("e3", "bs2", "throughput_ratio"),
                                ("e3", "bs2", "speedup")]
    tr = cell.loc[("e3", "bs1", "throughput_ratio")]
    assert (tr["measured"], tr["reported"], tr["delta"], tr["ratio"]) == pytest.approx((2.0, 1.5, 0.5, 2.0 / 1.5))
    assert cell.loc[("e3", "bs2", "throughput_ratio"), ["measured", "delta"]].tolist() == pytest.approx([1.25, 0.0])
    sp = cell.loc[("e3", "bs1", "speedup")]
    # two pairs are fewer than the load report's 8 for a CI: none, as in tables/load.csv
    assert sp["measured"] == pytest.approx(2.0) and math.isnan(sp["reported"]) and math.isnan(sp["ci_lo"])
    tps = cell.loc[("e3", "bs1", "tokens_per_s")]
    assert (tps["measured"], tps["reported"], tps["n_questions"]) == (pytest.approx(40.0), 30.0, 2)
    assert set(df["hardware_measured"]) == {"Test GPU"} and set(df["target"]) == {"org/target"}
    md = comparison_markdown(df, table, "run1")
    assert "**throughput ratio (×, output tokens/s over the same engine without speculation)**" in md
    assert "| EAGLE-3 | 2.00 vs 1.50 (+0.50, ×1.33) | 1.25 vs 1.25 (+0.00, ×1.00) |" in md
    assert "each column is the run's load level at its batch size" in md
    assert "another version of vllm than the source's (0.0)" in md and "compare τ first" not in md
    assert plot_against(df, tmp_path / "p.png").stat().st_size > 1000
    # without a reproduce record: matched by method, on another target noted; a level not measured leaves it empty
    rows = [r for r in literal_load_rows() if r["concurrency"] == 1]
    df = compare_load(rows, table, {"config": {"target": "smollm2-135m"}})
    assert df.set_index(["column", "metric"]).loc[("bs1", "throughput_ratio"), "measured"] == pytest.approx(2.0)
    assert math.isnan(df.set_index(["column", "metric"]).loc[("bs2", "throughput_ratio"), "measured"])
    assert "not the table's 'org/target'" in df.attrs["notes"][0]
    assert "`e3` has no level at concurrency 2: column bs 2 is empty" in df.attrs["notes"]
    # a run of one question at a time has no levels to read a batch size from
    with pytest.raises(AgainstError, match=r"no load levels \(load\.jsonl\); table 'tiny_engine' was measured in "
                                           r"vllm at batch size\(s\) 1, 2 and is compared with a run of load levels"):
        compare_run(tmp_path, table)


def test_target_mismatch_is_noted_or_refused(standin):
    """A run on another model is compared only when the table has a single target, and the output says so; a
    --model-dir mapping that names the run's folder silences the note."""
    turns = turns_table(literal_records())
    df = compare_turns(turns, standin, {"config": {"target": "smollm2-135m"}}, n_boot=50)
    assert "not the table's 'lmsys/vicuna-7b-v1.3'" in df.attrs["notes"][0]
    df = compare_turns(turns, standin, {"config": {"target": "smollm2-135m"}}, n_boot=50,
                       model_dir={"lmsys/vicuna-7b-v1.3": "smollm2-135m"})
    assert df.attrs["notes"] == []
    with pytest.raises(AgainstError, match="the run's target 'smollm2-135m' is none of the table's targets"):
        match_rows(load_table("eagle2_paper"), turns, {"config": {"target": "smollm2-135m"}})


def test_no_matching_row_or_baseline_is_a_clear_error(standin):
    """Comparing a run that measured none of the table's methods must say what each side has."""
    only_vanilla = [r for r in literal_records() if r["label"] == "vanilla"]
    with pytest.raises(AgainstError, match=r"no row of table 'standin_eagle2' matches.*the run has vanilla"):
        compare_turns(turns_table(only_vanilla), standin, {"config": {"target": "lmsys/vicuna-7b-v1.3"}})
    no_base = [r for r in literal_records() if r["label"] != "vanilla"]
    with pytest.raises(AgainstError, match="no baseline label 'vanilla'"):
        compare_turns(turns_table(no_base), standin, {"config": {"target": "lmsys/vicuna-7b-v1.3"}})


def test_other_temperature_or_missing_suites_are_said(standin):
    """A greedy run compared with a T = 1 table has nothing comparable (an error, not a table of NaN); a run without
    one of the table's suites is compared on the others with a note."""
    recs = literal_records()
    with pytest.raises(AgainstError, match="no measured turn at temperature 1 .*its temperatures: 0"):
        compare_turns(turns_table(recs), load_table("jakiro_a40_t1"),
                      {"config": {"target": "lmsys/vicuna-7b-v1.3"}, "reproduce": {"table": "jakiro_a40_t1", "rows": {
                          "eagle2": "vicuna_7b_eagle2"}}})
    no_gsm8k = [r for r in recs if r["suite"] != "gsm8k"]
    df = compare_turns(turns_table(no_gsm8k), standin, {"config": {"target": "lmsys/vicuna-7b-v1.3"}}, n_boot=50)
    assert df.attrs["notes"] == ["the run has no measured turn of suite(s) gsm8k: those columns are empty"]
    assert math.isnan(df.set_index(["row", "column", "metric"]).loc[("vicuna_7b_eagle2", "gsm8k", "speedup"),
                                                                     "measured"])


def test_categories_select_questions_for_leaderboard_columns():
    """Spec-Bench columns pick questions by recorded category: a category column must only see its questions and
    the overall column all of them (pooled ratio of means, not a mean of categories)."""
    table = load_table("spec_bench_rtx3090")
    recs = []
    for qid, cat, van_wall, pld_wall in ((81, "mt_bench", 1.0, 0.5), (161, "translation", 1.0, 1.0)):
        recs += [rec("vanilla", "vanilla", "spec_bench", qid, 0, [1] * 10, van_wall, {}, cat),
                 rec("pld", "pld", "spec_bench", qid, 0, [1, 5, 4], pld_wall,
                     {"max_ngram": 3, "min_ngram": 1, "num_draft_tokens": 10, "occurrence": "earliest"}, cat)]
    df = compare_turns(turns_table(recs), table, {"config": {"target": "lmsys/vicuna-7b-v1.3"}}, n_boot=50)
    cell = df.set_index(["row", "column", "metric"])["measured"]
    assert cell[("pld", "mt_conv", "speedup")] == pytest.approx(2.0)
    assert cell[("pld", "translation", "speedup")] == pytest.approx(1.0)
    assert cell[("pld", "overall", "speedup")] == pytest.approx((20 + 10) / 2 / 10)
    assert cell[("pld", "overall", "tau")] == pytest.approx(9 / 2)   # #MAT: (5 + 4) per 2 steps, both questions
    assert math.isnan(cell[("pld", "qa", "speedup")])                # no QA question was run


# ------------------------------------------------------------------------------------- spec_bench suite, template


def test_spec_bench_definition_pins_the_cited_commit():
    """The definition pins the file of the commit the published Spec-Bench tables cite (its digest read from the
    repository): a download from a moving branch, or a different file, must not load silently. MT-bench's categories
    are grouped as Spec-Bench's one task."""
    info = suite_info("spec_bench")
    assert info["sha256"] == "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
    assert info["records"] == 480
    assert info["category_groups"]["mt_bench"][:2] == ["writing", "roleplay"]
    assert info["source_url"].endswith(
        "hemingkx/Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl")


@pytest.fixture()
def sample_suite(monkeypatch, tmp_path):
    """The spec_bench definition over tests/data/spec_bench_sample.jsonl (8 records in Spec-Bench's format), with
    no checksum (trust on first fetch: the sample is not the pinned upstream file)."""
    info = {**suite_info("spec_bench"), "records": 8, "sha256": None}
    monkeypatch.setattr(suites, "suite_info", lambda name: info)
    return tmp_path


def test_spec_bench_format_loads_with_list_and_object_references(sample_suite):
    """Spec-Bench's RAG rows hold list-valued references (and odd shapes); they must load as they are, with the
    MT-bench categories recorded as Spec-Bench's 'mt_bench' task."""
    (sample_suite / "spec_bench").mkdir()
    shutil.copy(DATA / "spec_bench_sample.jsonl", sample_suite / "spec_bench" / "question.jsonl")
    suite = load_suite("spec_bench", data_dir=sample_suite)
    cats = [q.category for q in suite.questions]
    assert cats == ["mt_bench", "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "rag"]
    assert suite.questions[6].reference == [["north", "northward"], ["to the north"]]
    assert suite.questions[7].reference == [{"answers": ["Japan"], "source": "passage"}]
    assert suite.sha256 is not None and len(suite.questions[0].turns) == 2


def test_spec_bench_is_pinned_on_first_fetch(sample_suite):
    """sha256: null means trust-on-first-fetch: the fetch writes the digest beside the file, a changed file then
    fails to load, and a refetch of different content is refused."""
    source = (DATA / "spec_bench_sample.jsonl").as_uri()
    path = fetch_suite("spec_bench", data_dir=sample_suite, url=source)
    pin = Path(str(path) + ".sha256").read_text().split()[0]
    assert pin == suites.sha256_file(path) and len(load_suite("spec_bench", data_dir=sample_suite)) == 8
    path.write_text(path.read_text().replace("harbour", "harbor"))
    with pytest.raises(DataError, match=r"checksum mismatch .* pinned in question\.jsonl\.sha256 at its first fetch"):
        load_suite("spec_bench", data_dir=sample_suite)
    other = sample_suite / "other.jsonl"
    other.write_text('{"question_id": 1, "turns": ["x"]}\n')
    with pytest.raises(DataError, match="not saved"):
        fetch_suite("spec_bench", data_dir=sample_suite, url=other.as_uri())


def test_reference_shapes_still_reject_scalars():
    """Relaxing references must not accept a bare number (a malformed file) silently."""
    with pytest.raises(DataError, match=r"f:1: 'reference' must be a list, a string, an object or absent"):
        suites.parse_record({"question_id": 1, "turns": ["x"], "reference": 7}, "f:1")
    assert suites.parse_record({"question_id": 1, "turns": ["x"], "reference": "y"}, "f:1").reference == ["y"]


def test_vicuna_template_renders_fastchat_vicuna_prompts():
    """The FastChat vicuna_v1.1 layout the EAGLE/Jakiro/Spec-Bench evaluations feed Vicuna (a missing space or
    separator changes every prompt token and with it acceptance)."""
    target = tiny_target()
    target.tokenizer = char_tokenizer()
    target.tokenizer.chat_template = resolve_chat_template("vicuna_v1.1")
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"}]
    text = target.tokenizer.decode(target.render_chat(msgs)[0].tolist())
    system = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
              "detailed, and polite answers to the user's questions.")
    assert text == f"<s>{system} USER: Hi ASSISTANT: Hello<|im_end|>USER: Bye ASSISTANT:"
    text = target.tokenizer.decode(target.render_chat(msgs[:1], system_prompt="Be brief.")[0].tolist())
    assert text == "<s>Be brief. USER: Hi ASSISTANT:"
