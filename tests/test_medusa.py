"""Medusa heads: published checkpoint format (own and shared lm_head, .pt and .safetensors); method medusa."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engine.checkpoints import CheckpointError
from methods.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from methods.medusa.head import MedusaHeads, ResBlock
from tests.support.helpers import assert_refused, tiny_target

H, V = 32, 128  # tiny target: hidden, vocab


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def published_medusa_folder(folder: Path, num_heads: int = 3, num_layers: int = 1, shared: bool = False,
                            fmt: str = "pt", seed: int = 1) -> dict[str, torch.Tensor]:
    """Write Medusa heads as the Medusa repository ships them (legacy ``medusa_lm_head.pt`` + config.json)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(num_heads):
        for j in range(num_layers):
            sd[f"{i}.{j}.linear.weight"] = torch.randn(H, H, generator=g) * 0.2
            sd[f"{i}.{j}.linear.bias"] = torch.randn(H, generator=g) * 0.2
        if not shared:
            sd[f"{i}.{num_layers}.weight"] = torch.randn(V, H, generator=g) * 0.2
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "tiny-llama"}
    if shared:
        config["medusa_share_lm_head"] = True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "pt":
        torch.save(sd, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file(sd, str(folder / "medusa_lm_head.safetensors"))
    return sd


@pytest.mark.parametrize("shared,fmt,num_layers", [(False, "pt", 1), (False, "safetensors", 2), (True, "pt", 1),
                                                   (True, "safetensors", 1)])
def test_published_heads_load_and_compute(tmp_path, shared, fmt, num_layers):
    """Head i = ResBlock^L then its own Linear(H->V) (or the target's lm_head when shared). Logits are compared
    with the formula written out; a missing residual, a wrong activation or using the wrong lm_head would differ."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path, num_layers=num_layers, shared=shared, fmt=fmt)
    heads = load_medusa_heads(tmp_path, target)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(9))
    logits = heads(x, target.model.lm_head)
    assert logits.shape == (3, 1, V)
    for i in range(3):
        h = x
        for j in range(num_layers):
            h = h + F.silu(F.linear(h, sd[f"{i}.{j}.linear.weight"], sd[f"{i}.{j}.linear.bias"]))
        w = target.model.lm_head.weight if shared else sd[f"{i}.{num_layers}.weight"]
        torch.testing.assert_close(logits[i], F.linear(h, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared,fmt", [(False, "safetensors"), (True, "pt")])
def test_save_round_trip(tmp_path, shared, fmt):
    """save_medusa_heads writes the published names (no lm_head weights when shared) and loads back equal."""
    target = tiny_target()
    torch.manual_seed(2)
    heads = MedusaHeads(H, V, num_heads=2, num_layers=1, share_lm_head=shared)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.2)
    save_medusa_heads(heads, tmp_path, base_model="tiny-llama", dtype=torch.float32, fmt=fmt)
    weights = "medusa_lm_head.safetensors" if fmt == "safetensors" else "medusa_lm_head.pt"
    assert (tmp_path / weights).is_file()
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"], cfg["base_model_name_or_path"]) == (2, 1, "tiny-llama")
    assert cfg["medusa_fc_bias"] is True  # without it vLLM's Medusa drops every ResBlock bias and accepts nothing
    loaded = load_medusa_heads(tmp_path, target)
    x = torch.randn(3, H)
    torch.testing.assert_close(loaded(x, target.model.lm_head), heads(x, target.model.lm_head))


def test_fresh_resblock_is_identity():
    """The ResBlock weight is zero-initialised (Medusa's init), so a fresh head starts as the base lm_head on x +
    SiLU(bias); with the bias zeroed too the block must return x exactly."""
    block = ResBlock(4)
    torch.nn.init.zeros_(block.linear.bias)
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    assert torch.equal(block(x), x)
    assert torch.count_nonzero(block.linear.weight) == 0


def test_renamed_key_is_named(tmp_path):
    """A renamed key fails naming the missing and the unexpected key."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path)
    sd["1.0.lin.weight"] = sd.pop("1.0.linear.weight")
    assert_refused(tmp_path, "medusa_lm_head.pt", sd, load_medusa_heads, target,
                   r"missing keys: 1\.0\.linear\.weight \(found 1\.0\.lin\.weight: renamed\?\)")


def test_missing_head_is_named(tmp_path):
    """config.json says 3 heads but the weights hold 2: the third head's keys are named as missing."""
    target = tiny_target()
    published_medusa_folder(tmp_path, num_heads=2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["medusa_num_heads"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing keys: 2\.0\.linear\.bias, 2\.0\.linear\.weight, 2\.1\.weight"):
        load_medusa_heads(tmp_path, target)


def test_shared_flag_with_own_lm_heads_fails(tmp_path):
    """Own lm_head weights in a folder that declares medusa_share_lm_head are unexpected keys, not silently ignored."""
    target = tiny_target()
    published_medusa_folder(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["medusa_share_lm_head"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unexpected keys: 0\.1\.weight, 1\.1\.weight, 2\.1\.weight"):
        load_medusa_heads(tmp_path, target)


def test_shape_mismatch_is_named(tmp_path):
    """Heads trained for a model with another vocabulary must not load; the message names the key and both shapes."""
    target = tiny_target()
    sd = published_medusa_folder(tmp_path)
    sd["0.1.weight"] = torch.zeros(100, H)
    assert_refused(tmp_path, "medusa_lm_head.pt", sd, load_medusa_heads, target,
                   r"0\.1\.weight: checkpoint \[100, 32\] vs expected \[128, 32\]")


def test_bad_config_field_is_named(tmp_path):
    """A config without medusa_num_heads, or with a non-integer, fails naming the field."""
    target = tiny_target()
    published_medusa_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_layers": 1}))
    with pytest.raises(CheckpointError, match="missing field medusa_num_heads"):
        load_medusa_heads(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": "3", "medusa_num_layers": 1}))
    with pytest.raises(CheckpointError, match="medusa_num_heads must be an integer >= 1"):
        load_medusa_heads(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                      "medusa_fc_bias": False}))
    with pytest.raises(CheckpointError, match="medusa_fc_bias must be true"):
        load_medusa_heads(tmp_path, target)


# ------------------------------------------------------------------------------------------------ the method

from harness.engine.method import OptionsError  # noqa: E402
from harness.engine.sampling import SamplingParams  # noqa: E402
from harness.registry import get_method  # noqa: E402
from methods.medusa.medusa import Medusa, MedusaOptions, fill_medusa_tree  # noqa: E402
from methods.vanilla import Vanilla  # noqa: E402
from tests.support.helpers import GREEDY, bigram_target, sampled_pvalue, sampling_target  # noqa: E402
from tests.support.helpers import random_medusa_heads as random_heads  # noqa: E402

PROMPT = torch.tensor([[5, 9, 13, 20, 31, 7, 44]])
SMALL_TREE = [[0], [1], [0, 0], [1, 0], [0, 1]]


def medusa(target, heads, **options) -> Medusa:
    return Medusa(target, MedusaOptions(**options), heads=heads)


def test_fill_medusa_tree_literal():
    """A node at level L takes rank r of head L-1's top list, whatever its parent (Cartesian-product tree)."""
    # head 0 top: [1, 3, 2, 0]; head 1: [2, 3, 0, 1]
    logits = torch.tensor([[0.0, 5.0, 1.0, 3.0], [2.0, 0.0, 9.0, 4.0]])
    levels, ranks = torch.tensor([1, 1, 2, 2]), torch.tensor([0, 1, 1, 0])
    assert fill_medusa_tree(logits, levels, ranks).tolist() == [1, 3, 3, 2]


@pytest.mark.parametrize("acceptance", ["rejection", "typical"])
@pytest.mark.parametrize("shared", [False, True])
def test_greedy_equals_vanilla_with_random_heads(acceptance, shared):
    """At T=0 both acceptance rules are exact greedy matching: output = vanilla's, token for token."""
    target = tiny_target(eos=False)
    expected = Vanilla(target).generate(PROMPT, 30, GREEDY).token_ids
    gen = medusa(target, random_heads(H, V, shared=shared), acceptance=acceptance).generate(PROMPT, 30, GREEDY)
    assert gen.token_ids == expected
    assert gen.counters["draft_forwards"] == gen.counters["target_forwards"] - 1  # the heads run once per cycle


def test_oracle_heads_are_fully_accepted():
    """Heads that know the bigram target (head i -> g^(i+2)(x_t)) fill the rank-0 chain of mc_sim_7b_63 (depth 4)
    with the right tokens: every step accepts 4 drafts + the bonus. Reading the wrong position's feature or
    shifting heads by one level would accept nothing."""
    target, E, g = bigram_target()
    heads = MedusaHeads(32, 32, num_heads=4, num_layers=1)
    with torch.no_grad():
        for i, head in enumerate(heads.heads):
            head[0].linear.bias.zero_()  # the ResBlock weight is zero-initialised: identity
            ahead = list(range(32))
            for _ in range(i + 2):
                ahead = [g[x] for x in ahead]  # ahead[x] = g^(i+2)(x)
            head[1].weight.copy_(E[torch.tensor([ahead.index(y) for y in range(32)])])
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    gen = medusa(target, heads).generate(prompt, 16, GREEDY)
    x, expected = int(prompt[0, -1]), []
    for _ in range(16):
        x = g[x]
        expected.append(x)
    assert gen.token_ids == expected
    assert gen.accept_lengths == [1, 5, 5, 5]


def test_lossless_flag_follows_the_acceptance_rule():
    """Typical acceptance is not lossless and must say so (the tables label it); rejection is."""
    target = tiny_target()
    heads = random_heads(H, V)
    assert medusa(target, heads).lossless is True
    typical = medusa(target, heads, acceptance="typical")
    assert typical.lossless is False and typical.describe()["lossless"] is False


def test_options_are_validated():
    """Bad options fail naming the field; a tree the user named deeper than the number of heads is refused, while
    the default tree is cut to the heads (as hydra's: methods.medusa.medusa.head_tree) and recorded so."""
    target = tiny_target()
    with pytest.raises(OptionsError, match="acceptance must be one of rejection, typical, got 'greedy'"):
        Medusa.create(target, {"acceptance": "greedy"})
    with pytest.raises(OptionsError, match="unknown tree 'nope'"):
        Medusa.create(target, {"tree": "nope"})
    with pytest.raises(OptionsError, match="tree has depth 4 but the checkpoint has only 3 heads"):
        medusa(target, random_heads(H, V, num_heads=3), tree="medusa_mc_sim_7b_63")
    cut = medusa(target, random_heads(H, V, num_heads=3))
    assert len(cut.options.tree) == 61 and [0, 0, 0, 0] not in cut.options.tree and int(cut.levels.max()) == 3
    assert medusa(target, random_heads(H, V, num_heads=4)).options.tree == "medusa_mc_sim_7b_63"


def test_missing_shipped_head_says_how_to_train_one():
    """No head option and nothing shipped for this target: the error says how to get heads."""
    with pytest.raises(CheckpointError,
                       match=r"no medusa head is shipped for target 'tiny-llama'.*draftbench train medusa"):
        get_method("medusa").create(tiny_target())


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["T1", "T0.7-top_p0.9"])
def test_rejection_sampling_matches_the_target_distribution(sampling):
    """With acceptance="rejection" the joint of the first three tokens is the target's (chi-square, exact joint),
    with heads that have their own lm_heads (tests/test_lossless.py covers heads that share the target's)."""
    target = sampling_target()
    method = medusa(target, random_heads(16, 8, num_heads=2), tree=SMALL_TREE)
    assert sampled_pvalue(method, sampling, 1500) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7)],
                         ids=["T1", "T0.7"])
def test_typical_acceptance_is_told_apart(sampling):
    """The same statistic must reject typical acceptance, or the lossless tests could not fail."""
    target = sampling_target()
    method = medusa(target, random_heads(16, 8, num_heads=2), tree=SMALL_TREE, acceptance="typical")
    assert sampled_pvalue(method, sampling, 1500) < 1e-6
