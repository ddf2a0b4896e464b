"""Options ``max_spec_context`` and ``stop_unprofitable``: speculation off for the rest of a turn once it no longer
pays (harness/engine/speculationstop.py SpeculationStop, asked by the engine's loop). The decision rule on literal
costs; the engine's plain steps after the switch (output vanilla's, the step and the reason recorded); the engine
option every speculative method takes (harness/engine/speculative.py with_engine_options; registry-wide in
tests/test_lossless.py); the records of a run."""

from __future__ import annotations

import json

import pytest
import torch

import harness.engine.autotune as autotune
from harness.engine.method import NoOptions, OptionsError
from harness.engine.speculationstop import SpeculationStop
from harness.engine.speculative import SpeculativeMethod, with_engine_options
from harness.engine.tree import chain_tree
from harness.measure.records import read_records
from harness.registry import get_method
from harness.report.tables import turns_table
from harness.run.config import MethodSpec, RunConfig
from harness.run.runner import run
from methods.eagle.checkpoint import save_eagle_head
from methods.eagle.head import EagleHead
from methods.eagle.treepolicies import AdaptiveSizer
from methods.pld.pld import PldOptions
from methods.vanilla import Vanilla
from tests.support.helpers import (
    GREEDY,
    SAMPLING_IDS,
    SAMPLINGS,
    build_example,
    check_generation,
    install_oracle,
    method_pvalue,
    tiny_target,
)

PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]])  # 17 tokens
N_NEW = 40


# ---- the decision rule ----------------------------------------------------------------------------------------------
def test_speculation_pays_literal():
    """Two steps at 1.2 s of verification and 0.3 s of drafting each against a 1.0 s plain forward: accepting one
    draft between them makes 3 tokens in 3.0 s (= plain's 1 token/s: it still pays); accepting none makes 2 tokens
    in 3.0 s (it does not). A rule that forgot the bonus token, or the drafting time, would decide otherwise."""
    assert autotune.speculation_pays([0, 1], [1.2, 1.2], 0.3, 1.0)
    assert not autotune.speculation_pays([0, 0], [1.2, 1.2], 0.3, 1.0)
    assert autotune.speculation_pays([3], [2.0], 1.0, 1.0)  # 4 tokens in 3.0 s
    with pytest.raises(ValueError, match="one verification time per step, got 2 steps and 1 times"):
        autotune.speculation_pays([0, 1], [1.2], 0.3, 1.0)
    with pytest.raises(ValueError, match="plain_s > 0"):
        autotune.speculation_pays([1], [1.0], 0.3, 0.0)


def test_verify_cost_takes_the_smallest_timed_size_that_holds_the_slots():
    sizer = AdaptiveSizer(cap=8)
    sizer.verify_s = {1: 1.0, 4: 1.5, 8: 2.0}
    assert [sizer.verify_cost(n) for n in (1, 3, 4, 5, 9)] == [1.0, 1.5, 1.5, 2.0, 2.0]


def test_the_stop_policy_names_its_reason_literal():
    """max_context 512: a step after 512 tokens still speculates, one after 513 does not. last_steps 2 with the
    costs above (plain 1.0 s; 2 slots 1.2 s; 0.3 s drafting): after steps accepting 1 and 0 drafts it still pays;
    after 0 and 0 it does not; a window not yet full decides nothing; a new turn empties it."""
    assert SpeculationStop(max_context=512).reason(512) is None
    assert SpeculationStop(max_context=512).reason(513) == "max_spec_context"
    sizer = AdaptiveSizer(cap=4)
    sizer.verify_s, sizer.draft_s = {1: 1.0, 2: 1.2, 4: 1.5}, 0.3
    stop = SpeculationStop(last_steps=2, sizer=sizer)
    stop.record(2, 1)
    assert stop.reason(20) is None  # one step measured: the window is not full
    stop.record(2, 0)
    assert stop.reason(21) is None  # [1, 0]: 3 tokens in 3.0 s
    stop.record(2, 0)
    assert stop.reason(22) == "stop_unprofitable"  # [0, 0]: 2 tokens in 3.0 s
    stop.begin()
    assert stop.reason(23) is None and not stop.steps
    with pytest.raises(ValueError, match="last_steps needs the sizer"):
        SpeculationStop(last_steps=2)


# ---- the engine -----------------------------------------------------------------------------------------------------
class ChainOracle(SpeculativeMethod):
    """Proposes the next 4 of vanilla's greedy tokens (``future``): every speculative step emits 5 tokens."""

    def __init__(self, target, future: list[int], stop: SpeculationStop):
        super().__init__(target)
        self.future, self.speculation_stop, self.proposed = future, stop, 0

    def begin(self, prompt_ids, hidden):
        self.at = 0  # the index of the pending root in future

    def propose(self, root, sampling, generator):
        assert root == self.future[self.at]
        self.proposed += 1
        return chain_tree(self.future[self.at + 1: self.at + 5])

    def accept(self, tokens, hidden, next_root):
        self.at += len(tokens)


def test_past_max_spec_context_every_step_is_a_plain_forward():
    """17 prompt tokens and the pending root: steps start at contexts 18, 23, 28 (each emits 5), then 33 > 30: from
    target forward 4 on, one token per forward, no proposal, and the output stays vanilla's. An engine that kept
    speculating would show 5s after forward 3; one that stopped a step early, context 28."""
    target = tiny_target(vocab=64, tokenizer=False)
    future = Vanilla(target).generate(PROMPT, N_NEW + 8, GREEDY).token_ids
    method = ChainOracle(target, future, SpeculationStop(max_context=30))
    gen = method.generate(PROMPT, N_NEW, GREEDY)
    assert gen.token_ids == future[:N_NEW]
    assert gen.accept_lengths == [1, 5, 5, 5] + [1] * 24 and gen.accepted_drafts == [4, 4, 4] + [0] * 24
    assert gen.draft_depths == [4, 4, 4] + [0] * 24 and method.proposed == 3
    assert gen.speculation_off == {"step": 4, "reason": "max_spec_context", "context": 33}
    assert gen.counters["target_forwards"] == 28 and gen.counters["tree_tokens"] == 12
    check_generation(gen, method, PROMPT.shape[1], N_NEW)
    method.speculation_stop = SpeculationStop(max_context=1000)  # never reached: the turn speculates throughout
    again = method.generate(PROMPT, N_NEW, GREEDY)
    assert again.speculation_off is None and again.accept_lengths == [1] + [5] * 7 + [4]


@pytest.mark.parametrize("name", ["eagle2", "eagle3", "jakiro"])
def test_the_head_methods_stop_past_max_spec_context_and_stay_lossless(name):
    target = tiny_target(vocab=64, tokenizer=False)
    method = get_method(name).example(target, total_tokens=8, depth=2, top_k=3, max_spec_context=30)
    gen = method.generate(PROMPT, N_NEW, GREEDY)
    assert gen.token_ids == Vanilla(target).generate(PROMPT, N_NEW, GREEDY).token_ids
    off = gen.speculation_off
    assert off["reason"] == "max_spec_context" and 30 < off["context"] <= 30 + 3  # a step emits at most depth + 1
    assert off["context"] == PROMPT.shape[1] + sum(gen.accept_lengths[: off["step"]])
    assert set(gen.accept_lengths[off["step"]:]) == {1} and set(gen.draft_depths[off["step"] - 1:]) == {0}
    check_generation(gen, method, PROMPT.shape[1], N_NEW)


def test_every_speculative_method_takes_the_engine_option():
    """A method's options dataclass gains ``max_spec_context`` (last, default 0) when its class is made, checked after
    its own checks; a class that declares it (the dynamic-tree methods) keeps its own; an instance of the method's
    own dataclass, as declared, is taken with the option at 0. Without this, adding a method would mean wiring the
    option into its file."""
    pld = get_method("pld")
    assert [f for f in pld.Options.__dataclass_fields__][-1] == "max_spec_context"
    assert pld.Options.__name__ == "PldOptions" and pld.Options().max_spec_context == 0
    with pytest.raises(OptionsError, match=r"method 'pld': max_spec_context must be an integer >= 0 \(0 = off\), "
                                           r"got -1"):
        pld.create(tiny_target(), {"max_spec_context": -1})
    with pytest.raises(OptionsError, match="method 'pld': option max_spec_context: expected an integer, got 'x'"):
        pld.create(tiny_target(), {"max_spec_context": "x"})
    eagle2 = get_method("eagle2").Options
    assert with_engine_options(eagle2) is eagle2 and "stop_unprofitable" in eagle2.__dataclass_fields__
    bare = with_engine_options(NoOptions)
    assert [f for f in bare.__dataclass_fields__] == ["max_spec_context"] and issubclass(bare, NoOptions)
    assert SpeculativeMethod(tiny_target()).options.max_spec_context == 0  # the base class itself takes it too
    assert issubclass(pld.Options, PldOptions) and pld.Options is not PldOptions  # as methods/pld/pld.py declares it
    method = pld(tiny_target(), PldOptions(num_draft_tokens=4))
    assert method.options.num_draft_tokens == 4 and method.options.max_spec_context == 0
    assert method.speculation_stop is None


# (method, its accept lengths until the stop, the stop) on the repeated prompt of tests/test_lossless.py with oracle
# drafts and max_spec_context 24: one method of each kind (prompt lookup, static-tree head, parallel heads, draft
# model). Prompt 10 tokens; pld finds no match until its 12th forward, then emits 6: 10 + 11 + 6 = 27 > 24.
KINDS = [
    ("pld", [1] * 11 + [6], {"step": 12, "reason": "max_spec_context", "context": 27}),
    ("eagle1", [1, 6, 6, 6], {"step": 4, "reason": "max_spec_context", "context": 29}),
    ("medusa", [1, 5, 5, 5], {"step": 4, "reason": "max_spec_context", "context": 26}),
    ("sps", [1, 6, 8], {"step": 3, "reason": "max_spec_context", "context": 25}),
]


@pytest.mark.parametrize("name, speculating, off", KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_of_method_turns_plain_past_max_spec_context_literal(name, speculating, off):
    """Literal turns: the step whose context exceeds 24 and every later one emit one token each (40 in all), and the
    output is vanilla's. An engine that stopped a step early would stop at a context <= 24; one that ignored the
    option for a method without its own policy would keep the long accepts."""
    target = tiny_target(eos=False)
    prompt = torch.tensor([[40, 41, 42, 43, 40, 41, 42, 43, 40, 41]])
    continuation = Vanilla(target).generate(prompt, 40 + 64, GREEDY).token_ids
    method = build_example(name, target, max_spec_context=24)
    install_oracle(method, continuation)
    gen = method.generate(prompt, 40, GREEDY)
    assert gen.token_ids == continuation[:40]
    assert gen.speculation_off == off
    assert gen.accept_lengths == speculating + [1] * (40 - sum(speculating))


def test_stop_unprofitable_stops_when_the_measured_steps_lose(monkeypatch):
    """Timed costs (patched): a one-slot forward 1.0 s, any tree 10.0 s, so the adaptive sizing verifies the root
    alone (no tree of at most 8 slots can emit 10 tokens) and each step emits 1 token after some drafting: slower
    than a plain forward. With stop_unprofitable 2, the two steps after the prefill measure that and forward 3 is
    the first plain one; the output is vanilla's."""
    monkeypatch.setattr(autotune, "time_tree_sizes",
                        lambda target, sizes, runtime="eager": {s: 1.0 if s == 1 else 10.0 for s in sizes})
    target = tiny_target(vocab=64, tokenizer=False)
    method = get_method("eagle2").example(target, total_tokens=8, depth=2, top_k=3, adaptive=True,
                                          stop_unprofitable=2)
    gen = method.generate(PROMPT, N_NEW, GREEDY)
    assert gen.token_ids == Vanilla(target).generate(PROMPT, N_NEW, GREEDY).token_ids
    assert gen.speculation_off == {"step": 3, "reason": "stop_unprofitable", "context": 20}
    assert gen.counters["adaptive_slots"] == 2  # two sized steps of the root alone, then no more sizing


def test_a_run_records_the_switch_in_its_records_and_turns_table(tmp_path):
    """A run of eagle2 with max_spec_context 30 over a prompt longer than 30 tokens: its record says at which step
    and why speculation stopped (``speculation_off``), the turns table has it as ``spec_off.*`` columns; vanilla's
    records carry no such field (records without the option read and write as before)."""
    target = tiny_target(eos=False)
    save_eagle_head(EagleHead.for_target(target), tmp_path / "eagle", dtype=torch.float32)
    suite = tmp_path / "q.jsonl"
    suite.write_text('{"question_id": 1, "category": "c", "turns": ["' + "tell me a long story " * 3 + '"]}\n')
    options = {"head": str(tmp_path / "eagle"), "total_tokens": 8, "depth": 2, "top_k": 3, "max_spec_context": 30}
    config = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("eagle2", options=options)], suites=[str(suite)],
                       max_new_tokens=12, warmup=0, output_dir=str(tmp_path / "results"))
    records = {r["label"]: r for r in read_records(run(config, target=target, progress=False))}
    assert "speculation_off" not in records["vanilla"]
    off = records["eagle2"]["speculation_off"]
    assert off == {"step": 1, "reason": "max_spec_context", "context": records["eagle2"]["prompt_tokens"] + 1}
    assert records["eagle2"]["accept_lengths"] == [1] * 12
    assert records["eagle2"]["output_ids"] == records["vanilla"]["output_ids"]
    row = turns_table(records.values()).set_index("label").loc["eagle2"]
    assert (row["spec_off.step"], row["spec_off.reason"]) == (1, "max_spec_context")


def test_a_training_free_method_records_the_engine_option_and_the_switch(tmp_path):
    """pld with the engine's max_spec_context 30 over a longer prompt: the option is in its recorded options (the
    manifest's and every record's ``method_options``, an ``opt.max_spec_context`` column), the switch in
    ``speculation_off``, and the output is vanilla's."""
    suite = tmp_path / "q.jsonl"
    suite.write_text('{"question_id": 1, "category": "c", "turns": ["' + "tell me a long story " * 3 + '"]}\n')
    config = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld", options={"max_spec_context": 30})],
                       suites=[str(suite)], max_new_tokens=12, warmup=0, output_dir=str(tmp_path / "results"))
    run_dir = run(config, target=tiny_target(eos=False), progress=False)
    records = {r["label"]: r for r in read_records(run_dir)}
    assert records["pld"]["method_options"]["max_spec_context"] == 30
    assert records["pld"]["speculation_off"] == {"step": 1, "reason": "max_spec_context",
                                                 "context": records["pld"]["prompt_tokens"] + 1}
    assert records["pld"]["output_ids"] == records["vanilla"]["output_ids"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["methods"]["pld"]["options"]["max_spec_context"] == 30
    assert turns_table(records.values()).set_index("label").loc["pld", "opt.max_spec_context"] == 30


@pytest.mark.slow
def test_max_spec_context_on_the_default_model_keeps_vanilla_output(real_target, vanilla_reference):
    """The shipped EAGLE-3 head of SmolLM2-135M on a 37-token chat prompt, speculation off past 48 tokens: the
    greedy output is vanilla's and every forward after the recorded step emits one token."""
    prompt = real_target.render_chat([{"role": "user", "content": "List three facts about the moon."}])
    method = get_method("eagle3").create(real_target, {"total_tokens": 12, "depth": 4, "top_k": 4,
                                                       "max_spec_context": 48})
    gen = method.generate(prompt, 32, GREEDY)
    assert gen.token_ids == vanilla_reference(prompt, 32)
    off = gen.speculation_off
    assert off["reason"] == "max_spec_context" and 48 < off["context"] <= 48 + 5
    assert set(gen.accept_lengths[off["step"]:]) == {1}
    check_generation(gen, method, prompt.shape[1], 32)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_sampling_with_a_window_and_a_stop_matches_the_target_distribution(sampling):
    """At T > 0 on the 3-token sampling prompt: the first verification step (context 4) speculates with a 2-position
    draft window, every later one is a plain forward (context > 4). The joint of the first three tokens must be the
    target's; a plain step that sampled from anything but the target's distribution would bias it."""
    options = {"total_tokens": 8, "depth": 2, "top_k": 3, "draft_window": 2, "max_spec_context": 4}
    assert method_pvalue("eagle2", sampling, 1500, 8, **options) > 1e-3
