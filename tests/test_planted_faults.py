"""Planted faults (issue #49 item 2, tests/support/faults.py): `compare` flags each one in one run, and a clean
rerun of the same commit is not flagged.

The pure pieces of the faults are checked on literal inputs; the end-to-end checks run the real default model on a
cut-down sentinel (vanilla and EAGLE-2 on the first question of the `tiny` suite, 16 tokens, T = 0) whose baseline is
saved from one clean run of the module (exact gating: outputs and τ). The speed fault and the calibrated baseline
of the full preset are measured by `.ci/faults` (docs/ci.md, "Planted faults"), not here: a 15% slowdown on a shared
machine is a measurement, never a unit test's timed assertion.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.gate.baseline import Side, save_baseline
from harness.run.config import config_from_dict, load_preset_dict
from tests.support import faults as F

REPO = Path(__file__).resolve().parent.parent
SENTINEL = REPO / "results" / "baselines" / "cpu" / "sentinel"

SMALL = {"methods": ["vanilla", {"name": "eagle2", "options": {"total_tokens": 16, "depth": 3, "top_k": 4,
                                                               "draft_vocab": 4096}}],
         "temperatures": [0.0], "max_new_tokens": 16, "limit": 1}
# what one short question can show: not the speed fault (a measurement, .ci/faults), nor int4 round-to-nearest, which
# leaves the greedy acceptance of 16 tokens unchanged (docs/ci.md, "Planted faults", has what the full preset shows)
EXACT = [n for n in F.FAULTS if n not in ("slow-verify", "head-int4")]


def test_the_sentinel_baseline_is_calibrated_and_belongs_to_the_preset():
    """The nightly sentinel and .ci/faults compare with results/baselines/cpu/sentinel: if it stopped matching the
    preset (changed without a refresh) or lost its repeats, every fitted band would fall back to the fixed defaults or
    every run would fail; it must also be complete and lossless, or the gate would start from a broken state."""
    side = Side.from_baseline(SENTINEL)
    drop = ("output_dir", "data_dir", "repeats")
    preset = config_from_dict(load_preset_dict("sentinel")).to_dict()
    assert {k: v for k, v in side.provenance["config"].items() if k not in drop} == {
        k: v for k, v in preset.items() if k not in drop}
    assert side.n_repeats == 6, "calibrated from 6 repeats (the preset's comment)"
    assert not side.provenance["git_dirty"], "saved from a clean tree"
    assert side.cells["n_errors"].eq(0).all()
    greedy = side.cells[side.cells["temperature"] == 0.0]
    assert greedy["lossless_share"].tolist() == [1.0] * 3, "vanilla, pld and eagle2 are lossless at T = 0"


def test_extra_node_takes_the_first_child_below_the_path():
    """over-accept takes the deepest accepted node's first child; if this failed the fault would not accept one
    token too many (or would index past a leaf)."""
    parents = [-1, -1, 1, 1]
    assert F.extra_node(parents, []) == 0, "an empty path extends to the root's first child"
    assert F.extra_node(parents, [1]) == 2, "below node 1 its first child, node 2"
    assert F.extra_node(parents, [1, 3]) is None, "node 3 is a leaf: nothing more to accept"


def test_fake_int4_rounds_each_group_to_sixteen_levels():
    """int4 RTN per group: if this failed, head-int4 would not be the int4 quantization it claims."""
    w = torch.tensor([[0.7, -0.35, 0.05, 0.0], [1.4, 0.2, -0.13, 0.0]])
    q = F.fake_int4(w, group=4)
    assert torch.allclose(q, torch.tensor([[0.7, -0.4, 0.0, 0.0], [1.4, 0.2, -0.2, 0.0]]), atol=1e-6), q
    big = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    levels = (F.fake_int4(big) / (big.reshape(8, 2, 32).abs().amax(-1, keepdim=True) / 7).repeat_interleave(32, -1)
              .reshape(8, 64))
    assert torch.allclose(levels, levels.round(), atol=1e-4), "every weight is an integer multiple of its group scale"
    assert levels.abs().max() <= 8, "int4: at most 16 levels"


def test_drop_terminal_step_keeps_the_record_consistent():
    """The dropped terminal step takes its tokens with it; if this failed the fault would write records that the
    record checks refuse, and `compare` would catch a malformed record instead of the fault."""
    from harness.engine.method import Generation

    gen = Generation(token_ids=[5, 6, 7, 8, 9], accept_lengths=[1, 3, 1], stop_reason="max_new_tokens",
                     accepted_drafts=[2, 0], draft_depths=[3, 3], logit_margins=[1.0] * 5, logit_tops=[2.0] * 5,
                     logit_runner_ups=[0] * 5)
    cut = F.drop_terminal_step(gen)
    assert (cut.token_ids, cut.accept_lengths, cut.accepted_drafts, cut.draft_depths) == ([5, 6, 7, 8], [1, 3], [2],
                                                                                          [3])
    assert len(cut.logit_margins) == 4


def test_changed_template_refuses_a_template_without_the_default_prompt():
    """A template the fault cannot change is one clear error, not a silent clean run."""
    with pytest.raises(ValueError, match="no default system prompt"):
        F.changed_template("{{ messages }}")


def test_perturbed_checkpoint_changes_only_the_weight_matrices(tmp_path):
    """The head fault reaches vLLM as a checkpoint copy: its 2-D float tensors perturbed, everything else (vectors,
    integer maps such as EAGLE-3's d2t, config) as shipped, and a clean copy equal to the source; if this failed vLLM
    would load a broken file, or the clean runs would not read the shipped weights."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "head"
    src.mkdir()
    state = {"fc.weight": torch.linspace(-1, 1, 32).reshape(4, 8), "norm.weight": torch.ones(8), "d2t": torch.arange(5)}
    save_file(state, src / "model.safetensors")
    torch.save(state, src / "pytorch_model.bin")
    (src / "config.json").write_text("{}")
    for name in ("model.safetensors", "pytorch_model.bin"):
        bad = F.perturbed_checkpoint(src, tmp_path / "bad", True) / name
        got = load_file(bad) if name.endswith(".safetensors") else torch.load(bad, weights_only=True)
        assert not torch.equal(got["fc.weight"], state["fc.weight"]), f"{name}: the matrix is perturbed"
        assert torch.equal(got["norm.weight"], state["norm.weight"]) and torch.equal(got["d2t"], state["d2t"])
    clean = F.perturbed_checkpoint(src, tmp_path / "bad", False)
    assert torch.equal(load_file(clean / "model.safetensors")["fc.weight"], state["fc.weight"])
    assert (clean / "config.json").read_text() == "{}"


@pytest.fixture(scope="module")
def small_baseline(tmp_path_factory, real_target):
    """One clean run of the cut-down sentinel and its baseline: (baseline folder, run config)."""
    root = tmp_path_factory.mktemp("faults")
    config = F.preset_config("sentinel", root / "runs", **SMALL)
    run_dir = F.run_with(config, None, target=real_target)
    return save_baseline(run_dir, out=root / "baseline"), config


@pytest.mark.slow
@pytest.mark.parametrize("fault", EXACT)
def test_compare_catches_the_planted_fault(fault, small_baseline, real_target):
    """Each planted fault makes `compare` fail against the clean baseline in one run; if this failed the sentinel
    would let that regression through."""
    baseline, config = small_baseline
    result = F.verdict(baseline, F.run_with(config, fault, target=real_target), speed=False, n_boot=200)
    assert result["flagged"], f"{fault} ({F.FAULTS[fault].what}) passed compare"


@pytest.mark.slow
def test_a_clean_rerun_is_not_flagged_and_faults_leave_nothing_behind(small_baseline, real_target):
    """Runs after every fault above (same module): a clean rerun passes, so every patch was undone and the gate is
    quiet on the same commit; a failure here is a false alarm or a fault that leaked into later runs."""
    baseline, config = small_baseline
    result = F.verdict(baseline, F.run_with(config, None, target=real_target), speed=False, n_boot=200)
    assert not result["flagged"], result["failures"]
