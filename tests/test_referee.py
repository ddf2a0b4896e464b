"""The referee (harness/report/referee.py): an engine entry held against the harness's own method on literal records.

The run (suite s1, greedy, bfloat16, one-turn questions q1 and q2):

* vanilla (harness): q1 ids 10..19, q2 ids 20..29, one token per forward; at q2's position 4 its margin is 0.5
  (tie tolerance at top logit 20 in bf16: 4 * 2^-7 * 20 = 0.625) with runner-up 99;
* eagle3 (harness, chain of 3): lossless; q1 accepted [2, 0, 2, 1] -> accept lengths [1, 3, 1, 3, 2];
  q2 accepted [3, 3, 2] -> [1, 4, 4, 1] (cut at the budget);
* vllm-eagle3 (engine vllm, chain of 3): q1 equal to vanilla, accepted [2, 0, 3, 0] -> [1, 3, 1, 4, 1]: its
  third position accepts at step 2 where the harness's does not (first differing drafting step 2, token 1 + 3 + 1 = 5);
  q2 takes 99 at position 4 (a near tie of vanilla's: the runner-up within tolerance) with the harness's steps.

Hand-computed, q1: engine acc@1..3 = 2/4, 2/4, 1/4; harness 3/4, 2/4, 0/4; both τ = 10 / 5 = 2.0.
Pooled over q1 and q2 (q2: 3 steps of depth 3, accepted 3, 3, 2): engine acc@3 = (1 + 2) / 7, harness (0 + 2) / 7.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.measure import metrics as M
from harness.measure import records as R
from harness.report import referee as RF
from harness.report import tables as T
from harness.report.report import write_report
from harness.run.config import ConfigError, config_from_dict
from tests.test_report import MANIFEST, rec, write_run

V = ("vanilla", "vanilla", True)
E3 = ("eagle3", "eagle3", True)
VE3 = ("vllm-eagle3", "eagle3", True)
ENGINE = {"engine": "vllm", "engine_version": "0.32.0", "dtype": "bfloat16"}


def margins(n, at=None, margin=0.5, runner_up=99):
    """vanilla's logit fields for n tokens: confident everywhere (margin 5) except ``at``."""
    m = [5.0] * n
    r = [0] * n
    if at is not None:
        m[at], r[at] = margin, runner_up
    return {"logit_margins": m, "logit_tops": [20.0] * n, "logit_runner_ups": r, "dtype": "bfloat16"}


Q1, Q2 = list(range(10, 20)), list(range(20, 30))
RECORDS = [
    rec(*V, "s1", "q1", 0, 10, 1.0, Q1, [1] * 10, **margins(10)),
    rec(*V, "s1", "q2", 0, 10, 1.0, Q2, [1] * 10, **margins(10, at=4)),
    rec(*E3, "s1", "q1", 0, 10, 0.5, Q1, [1, 3, 1, 3, 2], [2, 0, 2, 1], [3] * 4, dtype="bfloat16"),
    rec(*E3, "s1", "q2", 0, 10, 0.5, Q2, [1, 4, 4, 1], [3, 3, 2], [3] * 3, dtype="bfloat16"),
    rec(*VE3, "s1", "q1", 0, 10, 0.4, Q1, [1, 3, 1, 4, 1], [2, 0, 3, 0], [3] * 4, **ENGINE),
    rec(*VE3, "s1", "q2", 0, 10, 0.4, Q2[:4] + [99] + Q2[5:], [1, 4, 4, 1], [3, 3, 2], [3] * 3, **ENGINE),
]


def test_step_difference_names_the_step_both_counts_and_the_token():
    """The docstring examples; equal steps are no difference; a turn that ended earlier has no count at that step;
    steps that drafted nothing (prompt lookup without a match) count on neither side, as an engine reports only
    the forwards that drafted. An off-by-one in the token position would point at the wrong token of the output."""
    def d3(a):
        return [3] * len(a)

    for engine, harness, expected in (
            ([2, 0, 1, 3], [2, 0, 2], {"step": 2, "accepted_engine": 1, "accepted_harness": 2, "token_position": 5}),
            ([1, 1], [1, 1], None),
            ([1, 1, 0], [1, 1], {"step": 2, "accepted_engine": 0, "accepted_harness": None, "token_position": 5}),
            ([0], [3], {"step": 0, "accepted_engine": 0, "accepted_harness": 3, "token_position": 1})):
        assert RF.step_difference(engine, harness, d3(engine), d3(harness)) == expected
    assert RF.step_difference([1, 1], [0, 1, 0, 2], [2, 2], [0, 2, 0, 2]) == {
        "step": 1, "accepted_engine": 1, "accepted_harness": 2, "token_position": 5}
    assert RF.step_difference([1], [0, 1, 0], [2], [0, 2, 0]) is None


def entry(label, method, engine="harness", depth=3, head=None, referee=None, runtime="eager"):
    return label, RF.Entry(label, method, engine, head, depth, runtime, referee)


def test_pairing_by_method_head_and_depth_or_by_referee_key():
    """An engine entry pairs with the one harness entry of its method, head and deepest draft; two candidates are
    ambiguous and none is unpaired (both say to set `referee:`), and the key overrides the automatic choice. A
    wrong pairing would set vLLM's chain of 3 against a chain of 2 and blame the engine for the shape."""
    base = dict([entry("vanilla", "vanilla", depth=0), entry("eagle3", "eagle3", depth=2),
                 entry("eagle3-k3", "eagle3", depth=3), entry("eagle3-k3@compiled", "eagle3", runtime="compiled"),
                 entry("vllm-eagle3", "eagle3", "vllm")])
    assert RF.pair_entries(base) == [RF.Pair("vllm-eagle3", "eagle3-k3", "vanilla",
                                             "same method, head and deepest draft: 3")]
    two = dict(base, **dict([entry("eagle3-other", "eagle3", depth=3)]))
    (p,) = RF.pair_entries(two)
    assert p.harness_label is None and "ambiguous: eagle3-k3, eagle3-other" in p.why and "referee:" in p.why
    other_head = dict(base, **dict([entry("vllm-eagle3", "eagle3", "vllm", head="/my/head")]))
    assert RF.pair_entries(other_head)[0].harness_label is None
    chosen = dict(two, **dict([entry("vllm-eagle3", "eagle3", "vllm", referee="eagle3")]))
    assert RF.pair_entries(chosen) == [RF.Pair("vllm-eagle3", "eagle3", "vanilla", "referee key (eagle3)")]
    # outputs are held against the harness's vanilla even when the run's baseline label ran on the engine
    engine_base = dict([entry("vanilla", "vanilla", "vllm", depth=0), entry("vanilla-h", "vanilla", depth=0)])
    assert RF.pair_entries(engine_base)[0] == RF.Pair("vanilla", "vanilla-h", "vanilla-h",
                                                      "same method, head and deepest draft: 0")


def test_run_entries_read_engine_head_depth_and_referee_key():
    turns = T.turns_table(RECORDS, MANIFEST)
    config = {"methods": [{"name": "eagle3", "label": "vllm-eagle3", "engine": "vllm", "referee": "eagle3"}]}
    entries = RF.run_entries(turns, config)
    assert entries["vllm-eagle3"] == RF.Entry("vllm-eagle3", "eagle3", "vllm", None, 3, "eager", "eagle3")
    assert entries["vanilla"] == RF.Entry("vanilla", "vanilla", "harness", None, 0, "eager", None)
    assert RF.has_engines(entries) and not RF.has_engines({"vanilla": entries["vanilla"]})
    own_head = [{**r, "method_options": {"head": "/heads/mine"}} if r["label"] == "vllm-eagle3" else r
                for r in RECORDS]
    assert RF.run_entries(T.turns_table(own_head, MANIFEST))["vllm-eagle3"].head == "/heads/mine"


def test_divergence_one_sided_decides_on_the_baselines_margin():
    """An engine has no logits: vanilla's margin within tolerance with the engine's token as its runner-up is a
    tie; a confident vanilla, or another runner-up, a disagreement. Two-sided (the default) stays "unknown"."""
    engine = {"output_ids": [5, 9, 7], "dtype": "bfloat16"}
    base = {"output_ids": [5, 6, 7], "logit_margins": [1.0, 0.5, 1.0], "logit_tops": [20, 20, 20],
            "logit_runner_ups": [0, 9, 0]}
    assert M.divergence(engine, base)["kind"] == "unknown"
    assert M.divergence(engine, base, one_sided=True)["kind"] == "tie"
    assert M.divergence(engine, {**base, "logit_margins": [1.0, 3.0, 1.0]}, one_sided=True)["kind"] == "disagreement"
    assert M.divergence(engine, {**base, "logit_runner_ups": [0, 8, 0]}, one_sided=True)["kind"] == "disagreement"
    assert M.divergence(engine, {**base, "logit_margins": None}, one_sided=True)["kind"] == "unknown"


def test_referee_table_per_turn_hand_computed():
    """Per turn: output equality with vanilla and its kind, τ and acceptance per position on each side, and the
    first differing step: q1's engine accepts the third draft at step 2, the harness's does not."""
    turns = T.turns_table(RECORDS, MANIFEST)
    pairs = RF.pair_entries(RF.run_entries(turns, MANIFEST["config"]))
    assert pairs == [RF.Pair("vllm-eagle3", "eagle3", "vanilla", "same method, head and deepest draft: 3")]
    q1, q2 = RF.referee_table(turns, pairs).to_dict("records")
    assert q1["equal_to_vanilla"] and pd.isna(q1["divergence_kind"])
    assert (q1["tau_engine"], q1["tau_harness"]) == (2.0, 2.0)
    assert q1["acc_engine"] == pytest.approx([0.5, 0.5, 0.25]) and q1["acc_harness"] == pytest.approx([0.75, 0.5, 0])
    assert (q1["first_step"], q1["accepted_engine"], q1["accepted_harness"], q1["token_position"]) == (2, 3, 2, 5)
    assert (q1["steps_engine"], q1["steps_harness"]) == (4, 4)
    assert not q2["equal_to_vanilla"] and (q2["divergence_position"], q2["divergence_kind"]) == (4, "tie")
    assert pd.isna(q2["first_step"]) and q2["acc_engine"] == q2["acc_harness"] == pytest.approx([1, 1, 2 / 3])
    text_only = [dict(r, output_ids=None) if r["label"] == "vllm-eagle3" else r for r in RECORDS]
    turns_text = T.turns_table(text_only, MANIFEST)
    # a served turn without token ids: equality with vanilla is n/a, not a disagreement at position 0
    assert RF.referee_table(turns_text, pairs)["equal_to_vanilla"].isna().all()
    s = RF.pair_summary(turns, pairs[0])
    assert s["turns"] == 2 and s["tau_engine"] == s["tau_harness"] == pytest.approx(20 / 9)
    assert s["acc_engine"] == pytest.approx([5 / 7, 5 / 7, 3 / 7]) and s["acc_harness"] == pytest.approx(
        [6 / 7, 5 / 7, 2 / 7])


def test_steps_in_unknown_order_are_not_compared_step_by_step(tmp_path):
    """A served engine that reports only how many steps accepted how many drafts (llama.cpp's and SGLang's counters)
    gives its steps in an order the client rebuilt (most accepted first): comparing them step by step with the
    harness's would report a difference at step 0 on every turn though the engine drafted exactly what the harness
    did. Those turns get steps_ordered False, no first differing step, and the report says they were not compared;
    τ and acceptance per position (order-free) are still compared."""
    assert not RF.steps_ordered({"engine_notes": [f"per-step acceptance from the server's counters "
                                                  f"({R.UNORDERED_STEPS})"]})
    assert RF.steps_ordered({"engine_notes": []}) and RF.steps_ordered({})
    # q1's engine steps [2, 0, 3, 0] rebuilt from counters as [3, 2, 0, 0]: the same counts, another order
    unordered = [dict(r, accepted_drafts=[3, 2, 0, 0], engine_notes=[f"from counters ({R.UNORDERED_STEPS})"])
                 if r["label"] == "vllm-eagle3" and r["question_id"] == "q1" else r for r in RECORDS]
    turns = T.turns_table(unordered, MANIFEST)
    pairs = RF.pair_entries(RF.run_entries(turns, MANIFEST["config"]))
    q1, q2 = RF.referee_table(turns, pairs).to_dict("records")
    assert q1["steps_ordered"] is False and pd.isna(q1["first_step"]) and pd.isna(q1["accepted_engine"])
    assert q1["acc_engine"] == pytest.approx([0.5, 0.5, 0.25])  # per position: the order does not matter
    assert q2["steps_ordered"] is True
    run = write_run(tmp_path, unordered)
    write_report(run)
    md = (run / "tables" / "summary.md").read_text()
    assert "drafting steps not compared in 1/2 greedy turns" in md
    assert "drafting steps differ in 0/1 greedy turns" in md


def test_the_report_gains_the_referee_only_when_a_run_has_engine_entries(tmp_path):
    """tables/referee.csv, plots/referee.png, a summary.md section and an HTML section for a run with an engine
    entry; none of them for the same run without it (its report must not change)."""
    run = write_run(tmp_path, RECORDS)
    paths = write_report(run)
    assert {"referee_csv", "plot_referee"} <= set(paths)
    csv = pd.read_csv(run / "tables" / "referee.csv")
    assert json.loads(csv["acc_harness"][1]) == [1.0, 1.0, 2 / 3]
    assert csv["first_step"].tolist()[0] == 2 and json.loads(csv["acc_engine"][0]) == [0.5, 0.5, 0.25]
    md = (run / "tables" / "summary.md").read_text()
    assert "**Referee: engine entries held against the harness**" in md
    assert "| vllm | 2 | 2.22 | 0.71 | 0.71 | 0.43 |" in md and "| harness | 2 | 2.22 | 0.86 | 0.71 | 0.29 |" in md
    assert "greedy output equal to `vanilla`: 1/2 turns (1 near ties, 0 disagreements, 0 without margins)" in md
    assert "s1 / q1 turn 0: step 2 (token 5), engine accepted 3, harness 2" in md
    assert '<section id="referee">' in (run / "report.html").read_text()

    (tmp_path / "plain").mkdir()
    plain = write_run(tmp_path / "plain", [r for r in RECORDS if r["label"] != "vllm-eagle3"])
    paths = write_report(plain)
    assert not {"referee_csv", "plot_referee"} & set(paths) and not (plain / "tables" / "referee.csv").exists()
    assert "Referee" not in (plain / "tables" / "summary.md").read_text()
    assert 'id="referee"' not in (plain / "report.html").read_text()


def test_referee_key_in_the_configuration():
    """`referee:` names a harness entry, and only an entry on another engine may carry it: a typo would otherwise
    silently leave the engine unrefereed."""
    methods = [{"name": "vanilla"}, {"name": "eagle3", "options": {"depth": 3}},
               {"name": "eagle3", "label": "vllm-eagle3", "engine": "vllm", "referee": "eagle3"}]
    cfg = config_from_dict({"methods": methods})
    assert cfg.methods[2].referee == "eagle3" and cfg.to_dict()["methods"][2]["referee"] == "eagle3"
    assert "referee" not in cfg.to_dict()["methods"][1]
    with pytest.raises(ConfigError, match="referee 'eagle' must be the label of an entry the harness runs"):
        config_from_dict({"methods": [*methods[:2], {**methods[2], "referee": "eagle"}]})
    with pytest.raises(ConfigError, match="on an entry another engine runs"):
        config_from_dict({"methods": [methods[0], {**methods[1], "referee": "vanilla"}]})
