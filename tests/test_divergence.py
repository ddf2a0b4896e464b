"""Greedy divergence from vanilla: logit margins recorded at generation time, and the report that tells a near tie
flipped by rounding (bf16/fp16 on a GPU) from a real disagreement (:func:`harness.measure.metrics.divergence`)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from harness.engine.sampling import SamplingParams
from harness.measure import metrics as M
from harness.models import target_from_model
from harness.report.markdown import divergence_note
from harness.report.tables import divergence_table, summary_table, turns_table
from methods.vanilla import Vanilla
from tests.support.anymodel import tiny_causal_lm, tree_method
from tests.test_engine import PROMPT, OracleBranched

GREEDY = SamplingParams()


def test_tie_tolerance_and_first_divergence_literals():
    """The docstring examples: a wrong epsilon or an off-by-one position would misclassify every divergence."""
    assert M.tie_tolerance("bfloat16", 20.0) == pytest.approx(0.625)
    assert M.tie_tolerance("float32", -20.0) == pytest.approx(4 * 2**-23 * 20)
    assert M.tie_tolerance("float16", 0.1) == pytest.approx(4 * 2**-10)  # scale at least 1
    assert M.first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert M.first_difference([5, 6], [5, 6, 7]) == 2
    assert M.first_difference([5, 6], [5, 6]) is None
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        M.tie_tolerance("int8", 1.0)


def record(ids, margins, tops, runner_ups, dtype="bfloat16", **kw):
    return {"suite": "s", "question_id": "q", "turn": 0, "temperature": 0.0, "seed": 0, "dtype": dtype,
            "output_ids": ids, "logit_margins": margins, "logit_tops": tops, "logit_runner_ups": runner_ups, **kw}


def test_divergence_kinds():
    """The docstring example is a tie; a margin above the tolerance, or a flip to a token that was not the
    runner-up, is a disagreement; without margins it is unknown; equal outputs are no divergence."""
    base = record([5, 6, 7], [1.0, 0.5, 1.0], [20, 20, 20], [0, 9, 0])
    tie = record([5, 9, 7], [1.0, 0.25, 1.0], [20, 20, 20], [0, 6, 0])
    assert M.divergence(tie, base) == {"position": 1, "token": 9, "baseline_token": 6, "method_margin": 0.25,
                                       "baseline_margin": 0.5, "tolerance": 0.625, "kind": "tie",
                                       "reason": "margins within the tolerance 0.625"}
    confident = record([5, 9, 7], [1.0, 3.0, 1.0], [20, 20, 20], [0, 6, 0])
    assert M.divergence(confident, base)["kind"] == "disagreement"
    assert M.divergence(confident, base)["reason"] == "method's margin 3 exceeds the tolerance 0.625"
    elsewhere = record([5, 9, 7], [1.0, 0.25, 1.0], [20, 20, 20], [0, 8, 0])
    assert M.divergence(elsewhere, base)["kind"] == "disagreement"
    assert M.divergence(elsewhere, base)["reason"] == "baseline's token 6 is not the method's runner-up 8"
    bare = {**tie, "logit_margins": None}
    assert M.divergence(bare, base)["kind"] == "unknown"
    assert M.divergence(bare, base)["reason"] == "no logit margins in the method record"
    assert M.divergence(base, base) is None


def test_an_exact_bf16_tie_in_the_baseline_is_a_tie():
    """The H200 bf16 case (issue #45): vanilla's top logit 23.875 is shared by several tokens (margin exactly 0; in
    bf16 logits near 24 are multiples of 0.125) and its recorded runner-up is one of them, 4, not the method's 6; the
    method chose 6 by one bf16 step (0.125) over vanilla's 9. Both margins are within the tolerance 4 * 2^-7 * 23.875
    = 0.746 and 6 can be a third token at vanilla's top, as valid a choice as 9: a tie. Were it called a
    disagreement, every bf16 run with a three-way tie would fail gpucheck's divergence check without a bug. With a
    vanilla margin above 0 the runner-up 4 says 6 was not second, a disagreement that must say why."""
    base = record([5, 9, 7], [1.0, 0.0, 1.0], [20, 23.875, 20], [0, 4, 0])
    method = record([5, 6, 7], [1.0, 0.125, 1.0], [20, 23.875, 20], [0, 9, 0])
    assert M.divergence(method, base) == {
        "position": 1, "token": 6, "baseline_token": 9, "method_margin": 0.125, "baseline_margin": 0.0,
        "tolerance": 0.74609375, "kind": "tie",
        "reason": "margins within the tolerance 0.746; baseline margin 0: several tokens share the top logit"}
    assert M.divergence(method, base, one_sided=True)["kind"] == "tie"
    not_second = {**base, "logit_margins": [1.0, 0.5, 1.0]}
    assert (M.divergence(method, not_second)["kind"], M.divergence(method, not_second)["reason"]) == (
        "disagreement", "method's token 6 is not the baseline's runner-up 4")
    method_elsewhere = {**method, "logit_runner_ups": [0, 8, 0]}
    assert (M.divergence(method_elsewhere, base)["kind"], M.divergence(method_elsewhere, base)["reason"]) == (
        "disagreement", "baseline's token 9 is not the method's runner-up 8")


def test_margins_are_recorded_per_emitted_token_and_agree_with_vanilla():
    """Every emitted token carries the margin of the logits that chose it: vanilla's equal a direct forward's,
    and a tree method's (accepted slots and bonus, several per step) equal vanilla's in fp32. A slot off by one
    in the engine would attach another position's margin."""
    target = tiny_causal_lm("llama")
    van = Vanilla(target).generate(PROMPT, 12, GREEDY)
    assert len(van.logit_margins) == len(van.logit_tops) == len(van.logit_runner_ups) == 12
    with torch.no_grad():
        seq = torch.cat([PROMPT, torch.tensor([van.token_ids[:-1]])], dim=1)
        logits = target.model(seq).logits[0, PROMPT.shape[1] - 1:]  # [12, V] the rows that chose each token
    top = torch.topk(logits, 2, dim=-1)
    torch.testing.assert_close(torch.tensor(van.logit_margins), (top.values[:, 0] - top.values[:, 1]),
                               atol=1e-5, rtol=1e-4)
    assert van.logit_runner_ups == top.indices[:, 1].tolist()
    got = OracleBranched(target).generate(PROMPT, 12, GREEDY)
    assert sum(got.accepted_drafts) >= 6
    torch.testing.assert_close(torch.tensor(got.logit_margins), torch.tensor(van.logit_margins), atol=1e-5, rtol=1e-4)
    assert got.logit_runner_ups == van.logit_runner_ups
    assert Vanilla(target).generate(PROMPT, 5, SamplingParams(temperature=1.0)).logit_margins == []


A, B = 10, 11  # the twin tokens


def twin_target(dtype: torch.dtype, ratio: float, swap: bool):
    """A tiny Llama in ``dtype`` whose lm_head rows A and B are u and ratio * u (u = +-2 per coordinate, so both
    are exact in bf16/fp16): whenever u . h > 0 they are the two best tokens, ``ratio`` apart. ``swap`` exchanges
    the rows: the same near tie, decided the other way (what rounding differences between a tree forward and
    one-token decoding do to a tie)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    u = 2.0 * torch.sign(torch.randn(64, generator=torch.Generator().manual_seed(3)))
    rows = (ratio * u, u) if swap else (u, ratio * u)
    with torch.no_grad():
        model.lm_head.weight[A], model.lm_head.weight[B] = rows
    target = target_from_model(model.to(dtype), None, name="tiny-twins")
    target.eos_ids = frozenset()
    return target


def run_record(gen, label: str, method: str, dtype: str) -> dict:
    return {"status": "ok", "label": label, "method": method, "suite": "s", "question_id": "q", "turn": 0,
            "temperature": 0.0, "seed": 0, "repeat": 0, "dtype": dtype, "output_ids": gen.token_ids,
            "new_tokens": len(gen.token_ids), "wall_time_s": 1.0, "accept_lengths": gen.accept_lengths,
            "accepted_drafts": gen.accepted_drafts, "draft_depths": gen.draft_depths, "lossless": True,
            "logit_margins": gen.logit_margins, "logit_tops": gen.logit_tops,
            "logit_runner_ups": gen.logit_runner_ups}


@pytest.mark.parametrize("dtype, ratio", [(torch.bfloat16, 1 + 2**-6), (torch.float16, 1 + 2**-10)],
                         ids=["bfloat16", "float16"])
def test_a_forced_tie_is_reported_as_a_tie_and_a_real_flip_as_a_disagreement(dtype, ratio):
    """Vanilla runs with the tie decided one way, EAGLE-2 with it decided the other: the outputs first differ at
    the first twin token, and the report shows that position with both runs' margins (a few units in the last
    place of the dtype, below the tolerance) and calls it a tie. The same flip with the twins 1.5x apart (margins
    far above the dtype's noise) is a disagreement: what a lossless bug would look like."""
    name = str(dtype).replace("torch.", "")
    for twin_ratio, kind in ((ratio, "tie"), (1.5, "disagreement")):
        vanilla = Vanilla(twin_target(dtype, twin_ratio, swap=False)).generate(PROMPT, 24, GREEDY)
        method = tree_method("eagle2", twin_target(dtype, twin_ratio, swap=True)).generate(PROMPT, 24, GREEDY)
        k = next(i for i, t in enumerate(vanilla.token_ids) if t in (A, B))
        records = [run_record(vanilla, "vanilla", "vanilla", name), run_record(method, "eagle2", "eagle2", name)]
        table = divergence_table(turns_table(records), "vanilla")
        assert len(table) == 1
        row = table.iloc[0]
        assert (row["position"], {row["token"], row["baseline_token"]}, row["kind"]) == (k, {A, B}, kind)
        top = max(abs(vanilla.logit_tops[k]), abs(method.logit_tops[k]))
        assert row["tolerance"] == pytest.approx(M.tie_tolerance(name, top))
        assert row["baseline_margin"] == pytest.approx(vanilla.logit_margins[k])
        assert row["method_margin"] == pytest.approx(method.logit_margins[k])
        assert row["baseline_margin"] > 0 and row["method_margin"] > 0
        if kind == "tie":
            assert max(row["baseline_margin"], row["method_margin"]) <= row["tolerance"]
            summary = summary_table(turns_table(records), "vanilla")
            eagle = summary[summary["label"] == "eagle2"].iloc[0]
            assert (eagle["lossless_share"], eagle["divergent_turns"], eagle["divergent_ties"]) == (0.0, 1.0, 1.0)
            assert "1 tie(s) within noise, 0 disagreement(s)" in divergence_note(table)
        else:
            assert min(row["baseline_margin"], row["method_margin"]) > row["tolerance"]
            assert row["reason"].startswith(f"method's margin {row['method_margin']:g} exceeds the tolerance")
