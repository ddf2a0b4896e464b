"""The precision matrix (issue #49 item 3): target precisions as configuration (``precisions``, an entry's
``precision``) and head precision as an option (``head_precision``), both through the one validator; the target copies
and head weights they make (torchao int8 weight-only, bf16/fp16 casts); the precision table on literal rows; and the
real default model end to end (slow): an int8 target with a float32 head runs and reports its lossless share."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import torch

from harness.engine.method import OptionsError, build_options
from harness.engine.sampling import SamplingParams
from harness.measure.records import baseline_labels, precision_label
from harness.models import PrecisionError, set_head_precision, with_precision
from harness.report.precision import precision_markdown, precision_table
from harness.report.tables import summary_table, turns_table
from harness.run.config import ConfigError, config_from_dict
from methods.eagle.eagle2 import Eagle2, Eagle2Options
from methods.vanilla import Vanilla
from tests.support.helpers import random_eagle_head, tiny_target

TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not TORCHAO, reason="torchao is not installed (pip install 'draftbench[quant]')")
PROMPT = torch.tensor([[1, 5, 9, 3, 7, 2]])


@pytest.mark.parametrize("data, message", [
    ({"precisions": ["int4"]}, "run.precisions[0]: unknown precision 'int4'; use float32, bfloat16, float16, int8"),
    ({"precisions": []}, "run.precisions: at least one precision is required"),
    ({"precisions": ["int8", "int8"]}, "run.precisions: a precision is listed twice: ['int8', 'int8']"),
    ({"precisions": ["int8"], "dtype": "bfloat16"}, "run.dtype: with precisions the target loads in float32"),
    ({"precisions": "int8x"}, "run.precisions[0]: unknown precision 'int8x'"),
    ({"methods": [{"name": "pld", "precision": 8}]}, "run.methods[0].precision: expected a string or null, got 8"),
    ({"methods": [{"name": "pld", "precision": "fp8"}]}, "run.methods[0].precision: unknown precision 'fp8'"),
])
def test_bad_precisions_are_one_line_naming_the_field(data, message):
    """Every bad precision is refused before anything loads, with the field's path: a typo must not silently run
    the target in float32 under an @int8 label."""
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert str(e.value).startswith(message), str(e.value)


def test_precisions_expand_every_entry_with_suffixed_labels():
    """Each entry runs once per precision, float32 unsuffixed (the reference), the others @bf16/@fp16/@int8; an
    entry's own precision replaces the run's; a run without precisions keeps its labels and its digest (older
    runs compare as before)."""
    config = config_from_dict({"precisions": ["float32", "int8", "bfloat16"],
                               "methods": ["vanilla", {"name": "pld", "precision": "float16"}]})
    assert [(e.label, e.precision) for e in config.entries()] == [
        ("vanilla", "float32"), ("vanilla@int8", "int8"), ("vanilla@bf16", "bfloat16"), ("pld@fp16", "float16")]
    assert config.to_dict()["precisions"] == ["float32", "int8", "bfloat16"]
    plain = config_from_dict({"methods": ["vanilla", "pld"]})
    assert [e.label for e in plain.entries()] == ["vanilla", "pld"]
    assert "precisions" not in plain.to_dict() and all("precision" not in m for m in plain.to_dict()["methods"])
    served = config_from_dict({"precisions": ["float32", "int8"], "methods": [
        "vanilla", {"name": "vanilla", "label": "llamacpp-q4_1", "engine": "openai",
                    "engine_options": {"server_url": "http://127.0.0.1:8091"}}]})
    assert [(e.label, e.precision) for e in served.entries()] == [
        ("vanilla", "float32"), ("vanilla@int8", "int8"), ("llamacpp-q4_1", None)]  # the GGUF as llama.cpp runs it
    with pytest.raises(ConfigError, match="run on another engine, which loads its own target"):
        config_from_dict({"methods": [{"name": "vanilla", "engine": "openai", "precision": "int8",
                                       "engine_options": {"server_url": "http://127.0.0.1:8091"}}]})
    assert precision_label("eagle2@compiled", "float16") == "eagle2@compiled@fp16"
    assert precision_label("x@int8", "int8") == "x@int8"


def test_the_shipped_preset_is_the_whole_matrix():
    """The preset crosses 4 target precisions with vanilla, pld and 3 head methods x 3 head precisions: 44
    entries; a lost sweep or precision would leave cells of the matrix unmeasured."""
    from harness.run.config import load_preset_dict

    config = config_from_dict(load_preset_dict("precision"))
    labels = [e.label for e in config.entries()]
    assert len(labels) == 4 * (2 + 3 * 3)
    assert "jakiro[head_precision=int8]@fp16" in labels and "vanilla@int8" in labels
    assert {e.options.get("head_precision") for e in config.entries() if e.name == "eagle3"} == {
        "float32", "bfloat16", "int8"}


def test_head_precision_option_is_validated():
    """head_precision takes the precision names or null; anything else is the option's one-line error."""
    assert build_options(Eagle2Options, {"head_precision": "int8"}, "eagle2").head_precision == "int8"
    with pytest.raises(OptionsError, match="head_precision must be one of float32, bfloat16, float16, int8"):
        build_options(Eagle2Options, {"head_precision": "int4"}, "eagle2")


def test_baselines_pair_by_precision():
    """eagle2@int8's speed-up and lossless share are measured against vanilla@int8, not the float32 vanilla (whose
    outputs an int8 target need not reproduce); a label without a precision keeps the plain baseline."""
    turns = pd.DataFrame({"label": ["vanilla", "vanilla@int8", "eagle2", "eagle2@int8"],
                          "method": ["vanilla", "vanilla", "eagle2", "eagle2"], "runtime": ["eager"] * 4,
                          "precision": ["float32", "int8", "float32", "int8"]})
    assert baseline_labels(turns) == {"vanilla": "vanilla", "vanilla@int8": "vanilla@int8", "eagle2": "vanilla",
                                      "eagle2@int8": "vanilla@int8"}


def rec(label, method, ids, precision, margins=None, accepted=None, options=None):
    """A measured greedy turn (one question, one turn) of ``label``: every step accepts ``accepted`` drafts."""
    accepted = accepted if accepted is not None else [0] * len(ids)
    lengths = [a + 1 for a in accepted]
    return {"status": "ok", "label": label, "method": method, "suite": "s", "question_id": "q1", "turn": 0,
            "question_turns": 1, "temperature": 0.0, "seed": 0, "repeat": 0, "dtype": "float32",
            "precision": precision, "output_ids": ids, "new_tokens": len(ids), "steps": len(lengths),
            "wall_time_s": 1.0, "accept_lengths": lengths, "accepted_drafts": accepted,
            "draft_depths": [2] * len(accepted) if method != "vanilla" else [0] * len(accepted), "lossless": True,
            "logit_margins": margins or [1.0] * len(ids), "logit_tops": [20.0] * len(ids),
            "logit_runner_ups": [0] * len(ids), "method_options": options or {}, "runtime": "eager"}


def test_precision_table_on_literal_rows():
    """Four labels: the float32 reference, vanilla@int8 (its output changed at position 2), and eagle2 at both
    precisions. eagle2@int8 equals vanilla@int8 (lossless at its precision: share 1.0) but not the float32
    reference (reference share 0, first divergence at 2 with both margins); eagle2 in float32 equals the reference.
    The table must not mix the two comparisons up, nor drop the margins or the head precision."""
    ref = [5, 6, 7, 8]
    q8 = [5, 6, 9, 8]
    records = [
        rec("vanilla", "vanilla", ref, "float32", margins=[1.0, 1.0, 0.5, 1.0]),
        rec("vanilla@int8", "vanilla", q8, "int8", margins=[1.0, 1.0, 0.25, 1.0]),
        rec("eagle2[head_precision=int8]", "eagle2", ref, "float32", accepted=[1, 1], options={
            "head_precision": "int8"}),
        rec("eagle2[head_precision=int8]@int8", "eagle2", q8, "int8", margins=[1.0, 1.0, 0.25, 1.0],
            accepted=[1, 1], options={"head_precision": "int8"}),
        rec("eagle2", "eagle2", ref, "float32", accepted=[1, 1], options={"head_precision": None}),
        {**rec("llamacpp-q4_1", "vanilla", q8, None), "engine": "openai"},  # the GGUF as llama.cpp serves it
    ]
    turns = turns_table(records)
    table = precision_table(summary_table(turns, "vanilla"), turns, "vanilla").set_index("label")
    row = table.loc["eagle2[head_precision=int8]@int8"]
    assert (row["target_precision"], row["head_precision"], row["baseline"]) == ("int8", "int8", "vanilla@int8")
    assert (row["lossless_share"], row["reference_share"], row["reference_divergent"]) == (1.0, 0.0, 1.0)
    assert (row["first_position"], row["first_token"], row["reference_token"]) == (2, 9, 7)
    assert (row["first_margin"], row["reference_margin"]) == (0.25, 0.5)
    assert row["tau"] == pytest.approx(4 / 2) and row["acc@1"] == 1.0 and row["acc@2"] == 0.0
    assert table.loc["eagle2", "head_precision"] == "" and table.loc["vanilla", "head_precision"] == ""
    assert table.loc["eagle2[head_precision=int8]", "reference_share"] == 1.0
    assert pd.isna(table.loc["eagle2[head_precision=int8]", "first_position"])
    assert table.loc["vanilla@int8", "reference_share"] == 0.0
    assert table.loc["llamacpp-q4_1", "target_precision"] == "as served (openai)"
    assert table.loc["llamacpp-q4_1", "reference_share"] == 0.0
    assert list(table.index[:2]) == ["vanilla", "vanilla@int8"]  # method, then target precision in PRECISIONS order
    md = precision_markdown(table.reset_index(), "vanilla")
    assert "| eagle2[head_precision=int8]@int8 | int8 | int8 | 2.00 |" in md
    assert "q1 t0 @2: 0.250 / 0.500, tie" in md or "q1 t0 @2: 0.250 / 0.500, disagreement" in md


def test_a_run_without_precisions_has_no_precision_table():
    """The section is only for runs that measured precisions; an ordinary run's report must not grow an empty one."""
    records = [{k: v for k, v in rec("vanilla", "vanilla", [1, 2], None).items() if k != "precision"}]
    turns = turns_table(records)
    assert precision_table(summary_table(turns, "vanilla"), turns).empty
    assert precision_markdown(precision_table(summary_table(turns, "vanilla"), turns)) == ""


@needs_torchao
def test_int8_target_copy_is_quantised_and_the_reference_untouched():
    """with_precision int8 quantises every linear layer of a copy with torchao (the reference keeps its float32
    weights: the float32 rows must stay the reference); bfloat16 is a cast copy; float32 of a float32 target is the
    same model. A quantised copy that were the same model would make every precision row the int8 one."""
    target = tiny_target()
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    q = with_precision(target, "int8")
    assert q.model is not target.model and q.precision == "int8" and q.dtype == torch.float32
    linears = [m for m in q.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m.weight).__name__ == "Int8Tensor" for m in linears)
    for k, v in target.model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} of the reference changed"
    assert with_precision(target, "bfloat16").model.lm_head.weight.dtype == torch.bfloat16
    assert with_precision(target, "float32").model is target.model
    with pytest.raises(PrecisionError, match="unknown precision 'int4'"):
        with_precision(target, "int4")


@needs_torchao
def test_head_precision_changes_only_the_heads_own_weights():
    """bfloat16 rounds the head's own weights to bf16 (and back: it computes in the target's dtype); int8 quantises
    its linear layers; the embedding it shares with the target is the target's and stays as it is."""
    target = tiny_target()
    head = random_eagle_head(target)
    fc = head.fc.weight.detach().clone()
    set_head_precision(head, target, "bfloat16")
    assert head.fc.weight.dtype == torch.float32
    assert torch.equal(head.fc.weight, fc.to(torch.bfloat16).float()) and not torch.equal(head.fc.weight, fc)
    embed = target.model.get_input_embeddings().weight.detach().clone()
    set_head_precision(head, target, "int8")
    assert type(head.fc.weight).__name__ == "Int8Tensor"
    assert torch.equal(target.model.get_input_embeddings().weight, embed)


@needs_torchao
def test_eagle2_is_lossless_on_an_int8_target_with_an_int8_head():
    """Verification runs on the same int8 target as vanilla at that precision, so eagle2 with an int8 head on an
    int8 target must emit vanilla@int8's tokens exactly (fp32 activations, CPU); quantisation may change what the
    model says, never what a lossless method emits relative to its own target."""
    q = with_precision(tiny_target(), "int8")
    vanilla = Vanilla(q).generate(PROMPT, 24, SamplingParams())
    method = Eagle2(q, build_options(Eagle2Options, {"total_tokens": 8, "depth": 3, "top_k": 2,
                                                     "head_precision": "int8"}, "eagle2"),
                    head=random_eagle_head(q))
    got = method.generate(PROMPT, 24, SamplingParams())
    assert got.token_ids == vanilla.token_ids
    assert type(method.head.fc.weight).__name__ == "Int8Tensor"


@pytest.mark.slow
@needs_torchao
def test_int8_target_with_fp32_head_runs_end_to_end_and_reports_its_lossless_share(tmp_path, data_dir):
    """The real default model on the tiny suite: target float32 and int8, vanilla and eagle2 (shipped head in
    float32). The run's records name each entry's precision, and tables/precision.csv has eagle2@int8 lossless
    against vanilla@int8 (share 1.0, fp32 activations on CPU) with its share against the float32 reference and
    the first divergence, if any, with both margins; report.html carries the section."""
    from harness.report.report import write_report
    from harness.run.runner import run

    config = config_from_dict({
        "target": "smollm2-135m", "device": "cpu", "suites": ["tiny"], "limit": 2, "max_new_tokens": 24,
        "warmup": 0, "precisions": ["float32", "int8"], "data_dir": str(data_dir), "output_dir": str(tmp_path),
        "methods": ["vanilla", {"name": "eagle2", "options": {"total_tokens": 12, "depth": 3, "top_k": 4,
                                                               "head_precision": "float32"}}]})
    run_dir = run(config, progress=False)
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert {(r["label"], r["precision"]) for r in records} == {
        ("vanilla", "float32"), ("vanilla@int8", "int8"), ("eagle2", "float32"), ("eagle2@int8", "int8")}
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records if r["status"] != "ok"]
    paths = write_report(run_dir)
    table = pd.read_csv(paths["precision_csv"]).set_index("label")
    row = table.loc["eagle2@int8"]
    assert (row["target_precision"], row["head_precision"], row["baseline"]) == ("int8", "float32", "vanilla@int8")
    assert row["lossless_share"] == 1.0
    assert 0.0 <= row["reference_share"] <= 1.0 and row["tau"] > 1.0
    assert table.loc["eagle2", "lossless_share"] == 1.0 and table.loc["eagle2", "reference_share"] == 1.0
    if row["reference_divergent"] > 0:
        assert pd.notna(row["first_margin"]) and pd.notna(row["reference_margin"])
    assert "Precision matrix" in paths["report_html"].read_text()
